"""Real processes: a gunicorn web server and a Celery runs worker on the private DB/prefix."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from shared.settings import Settings
from tests.conftest import settings_env

API_KEYS = "key-alice:alice,key-bob:bob"
FAST_LEASES = {
    "THREADRUN_LEASE_TTL_S": "3",
    "THREADRUN_LEASE_RENEW_S": "1",
    "THREADRUN_CANCEL_POLL_S": "0.25",
    "THREADRUN_REAPER_INTERVAL_S": "0.5",
    "THREADRUN_DISPATCH_STALE_S": "1",
}
"""Short leases and a fast reaper, for clusters whose tests kill or freeze owners."""
ALICE, BOB = "key-alice", "key-bob"
NO_USER_LIMITS = {
    "THREADRUN_RUNS_PER_MINUTE": "100000",
    "THREADRUN_MAX_ACTIVE_RUNS": "100000",
    "THREADRUN_MAX_CONNECTIONS_PER_USER": "100000",
}
"""Per-user limits (A4) every Cluster gets unless its env sets them: tests that push many runs
through one user are not about limits (tests/e2e/test_limits.py is)."""


def free_port() -> int:
    """An unused TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """A child process with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, n: int = 40) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)


@dataclass
class Cluster:
    """Web and worker processes sharing one private database and Redis prefix."""

    settings: Settings
    env: dict[str, str]
    logs: Path
    procs: list[Proc] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name, value in NO_USER_LIMITS.items():
            self.env.setdefault(name, value)

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def web_worker_class(self) -> str:
        """The gunicorn worker class start_web uses (THREADRUN_WEB_WORKER_CLASS)."""
        default = Settings.model_fields["web_worker_class"].default
        return self.env.get("THREADRUN_WEB_WORKER_CLASS") or str(default)

    def start_web(self) -> str:
        """One gunicorn worker with app/gunicorn_conf.py; THREADRUN_WEB_WORKER_CLASS picks the
        server model (gevent by default; gthread with 32 threads)."""
        port = free_port()
        argv = [sys.executable, "-m", "gunicorn", "-c", "python:app.gunicorn_conf"]
        env = {
            "THREADRUN_HOST": "127.0.0.1",
            "THREADRUN_PORT": str(port),
            "THREADRUN_WEB_WORKERS": "1",
            "THREADRUN_WEB_THREADS": "32",
            "THREADRUN_WEB_GRACEFUL_TIMEOUT_S": "3",
            # The suite's processes share one PostgreSQL (max_connections 100 by default):
            # a test web process needs few connections, and gevent fills a pool in a burst.
            "THREADRUN_DB_POOL_MAX": self.env.get("THREADRUN_DB_POOL_MAX", "6"),
        }
        self._spawn(f"web{len(self.urls)}", argv, env)
        url = f"http://127.0.0.1:{port}"
        self._wait_ok(url)
        self.urls.append(url)
        return url

    def start_worker(self, name: str = "runs", concurrency: int = 8) -> Proc:
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers.celery_app:celery",
            "worker",
            "-Q",
            "runs",
            "-P",
            "threads",
            "-c",
            str(concurrency),
            "-n",
            f"{name}-{os.getpid()}@%h",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "info",
        ]
        # The worker's pools are sized from its concurrency (workers/runtime.py): tell it
        # the real one, not the 32 of production, so a test cluster stays small in PostgreSQL.
        proc = self._spawn(name, argv, {"THREADRUN_WORKER_CONCURRENCY": str(concurrency)})
        self._wait_log(proc, "ready.")
        return proc

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.logs / f"{name}.log"
        fh = log.open("wb")
        popen = subprocess.Popen(
            argv,
            env={**self.env, **(env or {})},
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).parents[2],
        )
        fh.close()
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def _wait_ok(self, url: str, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if httpx.get(f"{url}/ok", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(
            f"web did not come up at {url}:\n" + "\n".join(p.tail() for p in self.procs)
        )

    def _wait_log(self, proc: Proc, needle: str, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if needle in proc.log.read_text(errors="replace"):
                return
            if proc.popen.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"{proc.name} did not become ready:\n{proc.tail()}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


@pytest.fixture(scope="session")
def cluster(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One web process and one runs worker (session-wide)."""
    env = {**os.environ, **settings_env(settings), "THREADRUN_API_KEYS": API_KEYS}
    env.pop("THREADRUN_CONFIG", None)
    c = Cluster(settings, env, tmp_path_factory.mktemp("e2e-logs"))
    try:
        c.start_web()
        c.start_worker()
        yield c
    finally:
        c.stop()
