"""Clusters of real processes for end-to-end tests and benchmarks: gunicorn web processes and
Celery workers on one database and Redis prefix, each with its log file, stopped by PID.

Children run the code of the checkout this module belongs to (their working directory), and
are configured only through THREADRUN_* variables, as in a deployment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from shared.runs.taskqueue import RUNS_WORKER_QUEUES
from shared.settings import Settings
from shared.tools.devservices import free_port
from shared.tools.supervisor import SCHEDULER_ARGS

PROJECT = Path(__file__).resolve().parents[3]
"""The checkout whose code the processes run."""

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0

UNLIMITED_USERS = {
    "THREADRUN_RUNS_PER_MINUTE": "1000000",
    "THREADRUN_MAX_ACTIVE_RUNS": "1000000",
    "THREADRUN_MAX_CONNECTIONS_PER_USER": "1000000",
}
"""Per-user limits (A4) lifted: tests and benchmarks push many runs and connections through
one user, and are not about limits unless they set their own."""


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a child process use these settings."""
    return {
        "THREADRUN_DATABASE_URL": settings.dsn,
        "THREADRUN_REDIS_URL": settings.redis_url,
        "THREADRUN_REDIS_PREFIX": settings.redis_prefix,
        "THREADRUN_DATA_DIR": str(settings.data_dir),
    }


def cluster_env(
    settings: Settings, extra: Mapping[str, str] | None = None, *, without: Iterable[str] = ()
) -> dict[str, str]:
    """This process's environment (less `without` and any THREADRUN_CONFIG file) pointed at
    `settings`, with per-user limits lifted and `extra` on top."""
    dropped = {"THREADRUN_CONFIG", *without}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    return {**env, **UNLIMITED_USERS, **settings_env(settings), **(extra or {})}


def worker_argv(name: str, concurrency: int, queues: str = RUNS_WORKER_QUEUES) -> list[str]:
    """A Celery worker of the project on `queues` with `concurrency` threads."""
    return [
        sys.executable, "-m", "celery", "-A", "workers.celery_app:celery", "worker",
        "-Q", queues, "-P", "threads", "-c", str(concurrency),
        "-n", f"{name}-{os.getpid()}@%h", "--without-gossip", "--without-mingle", "-l", "info",
    ]  # fmt: skip


@dataclass
class Proc:
    """A child process with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    role: str = ""
    url: str = ""

    @property
    def pid(self) -> int:
        """The process id."""
        return self.popen.pid

    def children(self) -> list[int]:
        """The pids of its child processes (from /proc: Linux only)."""
        path = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        return [int(pid) for pid in path.read_text().split()]

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.popen.poll() is None

    def output(self) -> str:
        """Its whole log so far."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, n: int = 40) -> str:
        """The last `n` lines of its log."""
        return "\n".join(self.output().splitlines()[-n:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> None:
        """Send `sig`, wait, SIGKILL if it is still there; reap it."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=5)


@dataclass
class Cluster:
    """Web and worker processes sharing one database and Redis prefix, all ours to stop.

    `env` is every child's environment (see `cluster_env`); `web_env` is added for web
    processes only. As a context manager it stops every process on the way out.
    """

    settings: Settings
    env: dict[str, str]
    logs: Path
    web_env: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The first web process's base URL."""
        return self.urls[0]

    @property
    def web_worker_class(self) -> str:
        """The gunicorn worker class start_web uses (THREADRUN_WEB_WORKER_CLASS)."""
        default = Settings.model_fields["web_worker_class"].default
        return self.env.get("THREADRUN_WEB_WORKER_CLASS") or str(default)

    def spawn(
        self, name: str, argv: list[str], env: Mapping[str, str] | None = None, role: str = ""
    ) -> Proc:
        """Start `argv` in the project with the cluster's environment (plus `env`), its output
        in `<logs>/<name>.log`."""
        if any(p.name == name for p in self.procs):
            raise ValueError(f"this cluster already started a process named {name!r}")
        log = self.logs / f"{name}.log"
        with log.open("wb") as fh:
            popen = subprocess.Popen(
                argv,
                env={**self.env, **(env or {})},
                stdout=fh,
                stderr=subprocess.STDOUT,
                cwd=PROJECT,
            )
        proc = Proc(name, popen, log, role)
        self.procs.append(proc)
        return proc

    def start_web(self, env: Mapping[str, str] | None = None) -> str:
        """One gunicorn worker process configured by app/gunicorn_conf.py (its server model
        from THREADRUN_WEB_WORKER_CLASS); return its base URL once it answers /ok."""
        port = free_port()
        argv = [sys.executable, "-m", "gunicorn", "-c", "python:app.gunicorn_conf"]
        web = {
            "THREADRUN_HOST": "127.0.0.1",
            "THREADRUN_PORT": str(port),
            "THREADRUN_WEB_WORKERS": "1",
            "THREADRUN_WEB_GRACEFUL_TIMEOUT_S": "3",
            **self.web_env,
            **(env or {}),
        }
        proc = self.spawn(f"web{len(self.urls)}", argv, web, role="web")
        proc.url = f"http://127.0.0.1:{port}"
        self.wait_ok(proc)
        self.urls.append(proc.url)
        return proc.url

    def start_worker(
        self,
        name: str = "runs",
        concurrency: int = 8,
        *,
        queues: str = RUNS_WORKER_QUEUES,
        ready: str = "ready.",
        timeout: float = START_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
    ) -> Proc:
        """A Celery worker; returns once its log says `ready`.

        It is told its real concurrency (THREADRUN_WORKER_CONCURRENCY): its pools are sized
        from it, so a small test worker stays small in PostgreSQL.
        """
        env = {"THREADRUN_WORKER_CONCURRENCY": str(concurrency), **(env or {})}
        proc = self.spawn(name, worker_argv(name, concurrency, queues), env, role="worker")
        self.wait_log(proc, ready, timeout)
        return proc

    def start_scheduler(
        self, name: str = "scheduler", env: Mapping[str, str] | None = None
    ) -> Proc:
        """A cron scheduler (Celery beat with workers/cron_beat.py's scheduler); returns once
        beat says it started."""
        argv = [sys.executable, "-m", "celery", *SCHEDULER_ARGS, "-l", "info"]
        proc = self.spawn(name, argv, env, role="scheduler")
        self.wait_log(proc, "beat: Starting")
        return proc

    def start_webhooks_worker(self, concurrency: int = 4) -> Proc:
        """A worker on the `webhooks` queue (`make run` puts it on the memory
        worker, `-Q memory,webhooks`): without one, webhooks stay pending in the outbox."""
        return self.start_worker("webhooks", concurrency, queues="webhooks")

    def start(
        self, *, webs: int = 1, workers: Sequence[str] = ("runs",), concurrency: int = 8
    ) -> Cluster:
        """Start `webs` web processes and the named workers side by side (imports dominate
        their start); return once all of them serve."""
        with ThreadPoolExecutor(max(1, len(workers))) as boot:
            booting = [boot.submit(self.start_worker, w, concurrency) for w in workers]
            for _ in range(webs):
                self.start_web()
            for fut in booting:
                fut.result()
        return self

    def side_by_side(self, *starts: Callable[[], Any]) -> list[Any]:
        """Call these start methods (`start_web`, `start_worker`, `start_scheduler`, ... as
        zero-argument callables) at once, each in a thread of its own: a process's start is
        mostly its imports, one core each. Returns their results in order, once all are up;
        at most one `start_web` per call (web processes are named by count)."""
        with ThreadPoolExecutor(len(starts)) as boot:
            futures = [boot.submit(start) for start in starts]
            return [fut.result() for fut in futures]

    def wait_ok(self, proc: Proc, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until the web process answers GET /ok."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and proc.alive():
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{proc.url}/ok", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"{proc.name} did not come up at {proc.url}:\n{self.tails()}")

    def wait_log(self, proc: Proc, needle: str, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until `needle` shows in the process's log."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and proc.alive():
            if needle in proc.output():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{proc.name} did not become ready:\n{proc.tail()}")

    def process(self, pid: int) -> Proc:
        """The process with this pid."""
        return next(p for p in self.procs if p.pid == pid)

    def workers(self) -> list[Proc]:
        """The worker processes still running."""
        return [p for p in self.procs if p.role == "worker" and p.alive()]

    def tails(self, n: int = 30, only: str = "") -> str:
        """The last `n` log lines of each process (of those whose name starts with `only`)."""
        return "\n".join(
            f"--- {p.name} ---\n{p.tail(n)}" for p in self.procs if p.name.startswith(only)
        )

    def stop(self, procs: Iterable[Proc] | None = None, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every process (or `procs`) at once, wait, SIGKILL what is left; reap all."""
        targets = list(self.procs if procs is None else procs)
        for p in targets:
            if p.alive():
                with contextlib.suppress(ProcessLookupError):
                    p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in targets:
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(timeout=5)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
