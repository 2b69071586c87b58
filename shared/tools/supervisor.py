"""The process supervisor behind ``make run``: services, migrations, then web and workers.

``python -m shared.tools.supervisor`` resolves Redis and PostgreSQL (``shared.tools.devservices``), runs
``python -m shared.db.migrate``, starts gunicorn and the two Celery workers as child processes with
prefixed output, prints one line once ``GET /ok`` answers 200, and on Ctrl-C / SIGTERM stops the
children (SIGTERM, a grace period, SIGKILL) and the embedded services it started. A child that dies
on its own is restarted with backoff, and a child in a crash loop stays down with one message while
the rest keep serving (SPEC H1; ``shared.tools.restart_policy``, THREADRUN_SUPERVISOR_*); with
THREADRUN_SUPERVISOR_MAX_RESTARTS=0 a dying child stops everything with a nonzero exit code.
THREADRUN_RUNS_WORKERS / THREADRUN_MEMORY_WORKERS start that many workers; THREADRUN_RELOAD=true
(``make dev``) restarts them all when the graphs' files change (``shared.tools.reload_watch``);
``--worker-only`` (``make worker``) becomes one more runs worker. Before anything starts, the `dependencies` of
the project file that the venv lacks are pip-installed (``shared.tools.project_deps``).

Every child (migrations, web, workers, scheduler, Flower) gets the resolved service settings
(``DevServices.env``): the URLs and, with Redis Sentinel (THREADRUN_REDIS_SENTINELS), the Sentinel
settings; with Sentinel no plain Redis is probed, started or embedded (shared/tools/devservices.py).

The web server's settings (worker class, workers, threads, timeouts, bind) come from
app/gunicorn_conf.py, which reads ``Settings`` (THREADRUN_WEB_*). Environment read here besides
the ``Settings`` ones: THREADRUN_MEMORY_CONCURRENCY (4), THREADRUN_READY_TIMEOUT_S (120),
THREADRUN_STOP_GRACE_S (10). ``--flower`` (or THREADRUN_FLOWER=1) also starts Flower on
``flower_port`` with ``flower_basic_auth``; ``--flower-only`` runs just Flower (``make flower``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from shared.errors import ConfigError
from shared.ops.supervision import (
    CRASH_LOOP,
    RESTARTING,
    RUNNING,
    ChildState,
    SupervisionReporter,
)
from shared.project import activate
from shared.redis_clients import sync_client
from shared.redis_keys import Keys
from shared.runs.taskqueue import BACKGROUND_QUEUE, RUNS_QUEUE, RUNS_WORKER_QUEUES
from shared.settings import Settings
from shared.tools.devservices import DevServicesError, parent_death_signal, redact, resolve_services
from shared.tools.project_deps import ensure as ensure_dependencies
from shared.tools.reload_watch import ReloadWatch, watched_roots
from shared.tools.restart_policy import RestartOutcome, RestartPolicy

DEFAULT_GRACE_S = 10.0


@dataclass(frozen=True)
class ChildSpec:
    """One supervised process: a short name (the output prefix), its argv, and what its
    environment has on top of the supervisor's."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Child:
    """A started ChildSpec."""

    spec: ChildSpec
    proc: subprocess.Popen[bytes]
    pump: threading.Thread
    exit_code: int | None = None


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    """A positive integer from ``env[name]`` (``default`` if unset)."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise SystemExit(f"{name} must be an integer, got {raw!r}") from exc
    if value < 1:
        raise SystemExit(f"{name} must be >= 1, got {value}")
    return value


def _float_env(env: Mapping[str, str], name: str, default: float) -> float:
    """A number from ``env[name]`` (``default`` if unset)."""
    raw = env.get(name, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError as exc:
        raise SystemExit(f"{name} must be a number, got {raw!r}") from exc


def bind_address(host: str, port: int) -> str:
    """gunicorn's --bind value (IPv6 hosts in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def local_url(host: str, port: int) -> str:
    """The base URL by which this machine reaches a server bound to ``host``."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{bind_address(host, port)}"


def default_specs(settings: Settings, env: Mapping[str, str] | None = None) -> list[ChildSpec]:
    """The web server, the Celery workers (runs; memory; background runs; webhooks) and the
    cron scheduler."""
    env = os.environ if env is None else env
    py = sys.executable
    memory_c = _int_env(env, "THREADRUN_MEMORY_CONCURRENCY", 4)
    celery = [py, "-m", "celery", "-A", "workers.celery_app:celery", "worker", "-P", "threads"]
    # No `-E`: Celery's flag wins over the configuration, so THREADRUN_TASK_EVENTS=false would
    # silence only the web's `task-sent` events; the setting (default off) decides alone.
    tail = ["--without-gossip", "--without-mingle"]
    # The `webhooks` queue: a dedicated process by default (slow receivers never delay
    # memory extraction); the memory worker consumes it too with
    # THREADRUN_WEBHOOK_WORKER=memory (one process fewer on a small host).
    memory_q, webhooks = "memory,webhooks", []
    if settings.webhook_worker == "dedicated":
        memory_q = "memory"
        hooks_c = str(settings.webhook_concurrency)
        webhooks = [
            ChildSpec(
                "webhooks",
                [*celery, "-Q", "webhooks", "-c", hooks_c, "-n", "webhooks@%h", *tail],
            )
        ]

    def node(
        kind: str,
        node_name: str,
        queues: str,
        concurrency: int,
        count: int,
        child_env: Mapping[str, str] | None = None,
    ) -> list[ChildSpec]:
        """``count`` Celery workers of one kind, each with its own node name."""
        return [
            ChildSpec(
                _numbered(kind, i),
                [
                    *celery,
                    "-Q",
                    queues,
                    "-c",
                    str(concurrency),
                    "-n",
                    f"{_numbered(node_name, i)}@%h",
                    *tail,
                ],
                dict(child_env or {}),
            )
            for i in range(count)
        ]

    # Background runs (cron firings) on workers of their own at a lower OS priority: a
    # burst of firings then takes only the CPU callers' runs leave (shared/runs/priority.py).
    # Those workers give every slot to background runs; the runs workers keep `runs`.
    runs_q, background = RUNS_WORKER_QUEUES, []
    if settings.background_workers:
        runs_q = RUNS_QUEUE
        background = node(
            "background",
            "background",
            BACKGROUND_QUEUE,
            settings.worker_concurrency,
            settings.background_workers,
            {
                "THREADRUN_PROCESS_NICE": str(settings.background_nice),
                "THREADRUN_WORKER_BACKGROUND_SHARE": "1",
            },
        )
    runs = node("worker", "runs", runs_q, settings.worker_concurrency, settings.runs_workers)
    memory = node("memory", "memory", memory_q, memory_c, settings.memory_workers)
    return [
        ChildSpec(
            "web",
            [
                py,
                "-m",
                "gunicorn",
                "-c",
                "python:app.gunicorn_conf",
                "app:create_app()",
                "--bind",
                bind_address(settings.host, settings.port),
            ],
        ),  # fmt: skip
        *runs,
        *memory,
        *background,
        scheduler_spec(settings),
        *webhooks,
    ]


def _numbered(name: str, index: int) -> str:
    """``name`` for the first of its kind, ``name2``, ``name3``... for the others (the Celery
    node names must differ: two nodes of one name on a host confuse `celery inspect`)."""
    return name if index == 0 else f"{name}{index + 1}"


def exit_status(code: int) -> str:
    """A child's exit status for a log line: ``code 3`` or ``signal SIGKILL (code -9)``."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name} (code {code})"
    return f"code {code}"


def policy_factory(settings: Settings) -> Callable[[], RestartPolicy]:
    """A fresh RestartPolicy per child, from the THREADRUN_SUPERVISOR_* settings."""
    return lambda: RestartPolicy(
        backoff_s=settings.supervisor_backoff_s,
        backoff_max_s=settings.supervisor_backoff_max_s,
        max_restarts=settings.supervisor_max_restarts,
        window_s=settings.supervisor_restart_window_s,
    )


def scheduler_spec(settings: Settings) -> ChildSpec:
    """The cron scheduler: Celery beat with our scheduler, which fires due crons
    (workers/cron_beat.py says why this shape), at `background_nice`: its work is the
    firings'."""
    argv = [sys.executable, "-m", "celery", *SCHEDULER_ARGS]
    return ChildSpec("scheduler", argv, {"THREADRUN_PROCESS_NICE": str(settings.background_nice)})


SCHEDULER_ARGS = [
    "-A",
    "workers.celery_app:celery",
    "beat",
    "-S",
    "workers.cron_beat:CronScheduler",
]
"""`celery` arguments of the scheduler process (make run, compose, k8s, tests)."""


def extra_worker_spec(settings: Settings, suffix: str) -> ChildSpec:
    """One more `runs` worker (``make worker``) with a node name of its own (``runs-<suffix>``)."""
    runs = next(s for s in default_specs(settings, {}) if s.name == "worker")
    argv = list(runs.argv)
    argv[argv.index("-n") + 1] = f"runs-{suffix}@%h"
    return ChildSpec("worker", argv)


def exec_extra_worker(settings: Settings) -> int:
    """``make worker``: become one more runs worker against the services of a running stack
    (found, never started: an extra worker with a Redis of its own would serve nobody)."""
    try:
        services = resolve_services(settings, allow_embedded=False)
    except DevServicesError as exc:
        print(f"supervisor | error: {exc} (start the stack first: make run)", file=sys.stderr)
        return 1
    spec = extra_worker_spec(settings, str(os.getpid()))
    os.execve(spec.argv[0], list(spec.argv), child_env(services.env))


def flower_spec(settings: Settings) -> ChildSpec:
    """Flower against our Celery app (its auth comes from `flower_env`, not argv)."""
    app = "workers.celery_app:celery"
    port = f"--port={settings.flower_port}"
    return ChildSpec("flower", [sys.executable, "-m", "celery", "-A", app, "flower", port])


def flower_env(settings: Settings) -> dict[str, str]:
    """FLOWER_BASIC_AUTH from `flower_basic_auth` (kept out of argv, which `ps` shows)."""
    auth = settings.flower_basic_auth.get_secret_value()
    return {"FLOWER_BASIC_AUTH": auth} if auth else {}


def migrate_spec() -> ChildSpec:
    """Schema migrations and checkpointer setup (idempotent)."""
    return ChildSpec("migrate", [sys.executable, "-m", "shared.db.migrate"])


def port_in_use(host: str, port: int) -> bool:
    """True if something already listens on host:port (binding it as gunicorn would fails)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """True if GET ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class Output:
    """Line-atomic, prefixed writes from many threads to one stream."""

    def __init__(self, stream: IO[str], width: int = 8) -> None:
        self.stream = stream
        self.width = width
        self.lock = threading.Lock()

    def line(self, name: str, text: str) -> None:
        """Write ``text`` (one line) prefixed with ``name``."""
        self.raw(f"{name:<{self.width}}| {text}")

    def raw(self, text: str) -> None:
        """Write ``text`` as one unprefixed line."""
        with self.lock:
            try:
                self.stream.write(text.rstrip("\r\n") + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass  # our stdout is gone (a closed pipe); keep supervising


class Supervisor:
    """Starts ChildSpecs, pumps their output, watches them and stops them."""

    def __init__(
        self,
        specs: Sequence[ChildSpec],
        *,
        env: Mapping[str, str] | None = None,
        output: Output | None = None,
        grace_s: float = DEFAULT_GRACE_S,
        poll_s: float = 0.1,
        policy: Callable[[], RestartPolicy] | None = None,
        reload: Callable[[], bool] | None = None,
        report: Callable[[list[ChildState]], None] | None = None,
    ) -> None:
        self.specs = list(specs)
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        width = max([len(s.name) for s in self.specs] + [len("supervisor")]) + 1
        self.out = output or Output(sys.stdout, width)
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.children: list[Child] = []
        self.stop_requested = threading.Event()
        self.kill_requested = threading.Event()
        self.failed: list[Child] = []
        self.policy = policy
        self.policies: dict[str, RestartPolicy] = {}
        self.pending: dict[str, tuple[float, ChildSpec]] = {}
        """Children waiting out their backoff: name -> (monotonic time to start, spec)."""
        self.given_up: list[str] = []
        self.reload = reload
        """The dev loop's check (THREADRUN_RELOAD): True when the graphs' files changed."""
        self.report = report
        """Called with every child's state on each watch tick (the ops view's record:
        shared/ops/supervision.py, which throttles the writes)."""
        self.restarts: dict[str, int] = {}
        self.last_exit: dict[str, str] = {}
        self.since: dict[str, float] = {}

    def say(self, text: str) -> None:
        """A message of the supervisor itself."""
        self.out.line("supervisor", text)

    def request_stop(self) -> None:
        """Ask the watch loop to stop everything (safe from signal handlers and other threads)."""
        if self.stop_requested.is_set():
            self.kill_requested.set()
        self.stop_requested.set()

    def spawn(self, spec: ChildSpec) -> Child:
        """Start one child in its own session, its stdout and stderr pumped through ``out``."""
        proc = subprocess.Popen(
            list(spec.argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**self.env, **spec.env},
            start_new_session=True,
            preexec_fn=parent_death_signal(signal.SIGTERM),
        )
        assert proc.stdout is not None
        pump = threading.Thread(
            target=self._pump, args=(spec.name, proc.stdout), name=f"pump-{spec.name}", daemon=True
        )
        pump.start()
        child = Child(spec, proc, pump)
        self.children.append(child)
        self.since[spec.name] = time.time()
        return child

    def _pump(self, name: str, stream: IO[bytes]) -> None:
        """Copy a child's output to ``out`` line by line until EOF."""
        with stream:
            for raw in iter(stream.readline, b""):
                self.out.line(name, raw.decode(errors="replace"))

    def start(self) -> None:
        """Start every spec."""
        for spec in self.specs:
            self.spawn(spec)
            self.say(f"started {spec.name} (pid {self.children[-1].proc.pid})")

    def run_to_completion(self, spec: ChildSpec) -> int | None:
        """Run one child until it exits; None if a stop was requested first (it is then stopped)."""
        child = self.spawn(spec)
        while child.proc.poll() is None:
            if self.stop_requested.wait(self.poll_s):
                self.stop()
                return None
        self._reap(child)
        self.children.remove(child)
        return child.exit_code

    def watch(
        self,
        ready: Callable[[], bool] | None = None,
        on_ready: Callable[[], None] | None = None,
        ready_timeout_s: float = 120.0,
    ) -> int:
        """Block until a stop is requested (0) or a child exits on its own (nonzero).

        With a restart policy a child that exits is restarted after its backoff instead, and
        only when every child has given up (a crash loop each) does this return nonzero.
        """
        deadline = time.monotonic() + ready_timeout_s
        is_ready = ready is None
        while not self.stop_requested.is_set():
            for child in list(self.children):
                code = child.proc.poll()
                if code is not None:
                    self._reap(child)
                    if self.policy is None:
                        self.say(f"{child.spec.name} exited unexpectedly (code {code}); stopping")
                        self.failed.append(child)
                        return code if code > 0 else 1
                    self._on_exit(child, code)
            self._start_due()
            if self.report is not None:
                self.report(self.states())
            if self.reload is not None and self.reload():
                self.restart_all("the graphs' files changed")
            if not self.children and not self.pending:
                self.say("every child has stopped; stopping")
                return 1
            if not is_ready and ready is not None:
                if ready():
                    is_ready = True
                    if on_ready is not None:
                        on_ready()
                elif time.monotonic() > deadline:
                    self.say(f"not ready after {ready_timeout_s:.0f} s; stopping")
                    return 1
            self.stop_requested.wait(self.poll_s)
        return 0

    def states(self) -> list[ChildState]:
        """Every supervised child's state, in spec order (the ops view's record)."""
        now = time.monotonic()
        by_name: dict[str, ChildState] = {}
        common = self._history
        for child in self.children:
            name = child.spec.name
            by_name[name] = ChildState(name, RUNNING, child.proc.pid, **common(name))
        for name, (at, _spec) in self.pending.items():
            wait = round(max(0.0, at - now), 1)
            by_name[name] = ChildState(name, RESTARTING, None, restart_in_s=wait, **common(name))
        for name in self.given_up:
            by_name[name] = ChildState(name, CRASH_LOOP, None, **common(name))
        order = {spec.name: i for i, spec in enumerate(self.specs)}
        return sorted(by_name.values(), key=lambda c: order.get(c.name, len(order)))

    def _history(self, name: str) -> dict[str, Any]:
        return {
            "restarts": self.restarts.get(name, 0),
            "last_exit": self.last_exit.get(name),
            "since": self.since.get(name, time.time()),
        }

    def restart_all(self, why: str) -> None:
        """Stop every child gracefully (SIGTERM: Celery's warm shutdown hands its runs back)
        and start them all again, with fresh restart policies."""
        self.say(f"{why}; restarting web and workers")
        self.stop()
        self.policies.clear()
        self.given_up.clear()
        self.start()

    def _on_exit(self, child: Child, code: int) -> None:
        """Schedule a restart of a child that exited, or give up on it (a crash loop)."""
        assert self.policy is not None
        self.children.remove(child)
        name = child.spec.name
        policy = self.policies.setdefault(name, self.policy())
        decision = policy.on_exit(time.monotonic())
        self.last_exit[name] = exit_status(code)
        self.since[name] = time.time()
        if decision.outcome is RestartOutcome.GIVE_UP:
            self.failed.append(child)
            self.given_up.append(name)
            self.say(
                f"{name} is in a crash loop ({decision.exits_in_window} exits in "
                f"{policy.window_s:g} s, last {exit_status(code)}); not restarting it, the rest "
                "keep serving"
            )
            return
        self.pending[name] = (time.monotonic() + decision.delay_s, child.spec)
        self.say(
            f"{name} exited unexpectedly ({exit_status(code)}); restarting it in "
            f"{decision.delay_s:g} s"
        )

    def _start_due(self) -> None:
        """Start the children whose backoff is over."""
        now = time.monotonic()
        for name, (at, spec) in list(self.pending.items()):
            if at <= now:
                del self.pending[name]
                child = self.spawn(spec)
                self.restarts[name] = self.restarts.get(name, 0) + 1
                self.say(f"restarted {name} (pid {child.proc.pid})")

    def _reap(self, child: Child) -> None:
        """Record the exit code, kill leftovers of its process group and drain its output."""
        child.exit_code = child.proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.proc.pid, signal.SIGKILL)
        child.pump.join(timeout=2)

    def stop(self) -> None:
        """SIGTERM every live child's process group, wait ``grace_s``, SIGKILL what is left."""
        live = [c for c in self.children if c.proc.poll() is None]
        for child in live:
            self.say(f"stopping {child.spec.name} (pid {child.proc.pid})")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while any(c.proc.poll() is None for c in live):
            if time.monotonic() >= deadline or self.kill_requested.is_set():
                break
            time.sleep(0.05)
        for child in live:
            if child.proc.poll() is None:
                self.say(f"{child.spec.name} did not stop in time; killing it")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
        for child in self.children:
            self._reap(child)
        self.children.clear()
        self.pending.clear()


def ops_reporter(services_env: Mapping[str, str]) -> SupervisionReporter:
    """The reporter of this supervisor's children to the ops view, on the resolved services
    (their URLs are this process's settings too: it supervises that deployment)."""
    os.environ.update(services_env)
    settings = Settings()
    client = sync_client(settings, socket_timeout=2.0, socket_connect_timeout=2.0)
    return SupervisionReporter(client, Keys(settings.redis_prefix))


def install_signal_handlers(supervisor: Supervisor) -> None:
    """SIGINT / SIGTERM request a stop (a second one skips the grace period)."""

    def handler(signum: int, _frame: object) -> None:
        """Request a stop."""
        supervisor.request_stop()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def child_env(services_env: Mapping[str, str]) -> dict[str, str]:
    """Our environment plus the resolved service URLs."""
    env = dict(os.environ)
    env.update(services_env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m shared.tools.supervisor``."""
    flags = set(sys.argv[1:] if argv is None else argv)
    settings = Settings()
    env = os.environ
    if "--flower-only" in flags:
        spec = flower_spec(settings)
        os.execve(spec.argv[0], list(spec.argv), {**env, **flower_env(settings)})
    if "--worker-only" in flags:
        return exec_extra_worker(settings)
    grace = _float_env(env, "THREADRUN_STOP_GRACE_S", DEFAULT_GRACE_S)
    ready_timeout = _float_env(env, "THREADRUN_READY_TIMEOUT_S", 120.0)
    specs = default_specs(settings)
    if "--flower" in flags or env.get("THREADRUN_FLOWER", "").lower() in ("1", "true"):
        specs.append(flower_spec(settings))
    width = max(len(s.name) for s in [*specs, migrate_spec()])
    out = Output(sys.stdout, max(width, len("supervisor")) + 1)

    # A provider model whose package or key is missing would take every run and fail it:
    # say what to install or set now, before services or children start.
    from shared.agent.providers import preflight  # langchain: only when about to start

    try:  # the project file first: its `env` may hold the providers' keys
        project = activate(settings.config)
    except ConfigError as exc:
        out.line("supervisor", f"error: {exc}")
        return 1
    # Its `dependencies` next: the providers' packages may be among them (preflight).
    if not ensure_dependencies(settings, lambda text: out.line("supervisor", text)):
        return 1
    if problems := preflight(settings):
        for problem in problems:
            out.line("supervisor", f"error: {problem}")
        return 1

    # Until the children run, a signal interrupts whatever blocks (service start-up).
    def early(signum: int, _frame: object) -> None:
        """Interrupt the blocking start-up."""
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, early)
    if port_in_use(settings.host, settings.port):
        out.line(
            "supervisor",
            f"error: {bind_address(settings.host, settings.port)} is already in use; stop what "
            "listens there or set THREADRUN_PORT",
        )
        return 1
    try:
        services = resolve_services(settings)
    except DevServicesError as exc:
        out.line("supervisor", f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        return 0
    sup: Supervisor | None = None
    reporter: SupervisionReporter | None = None
    try:
        out.line(
            "supervisor",
            f"redis {redact(services.redis_url)} ({services.redis_source}), postgres "
            f"{redact(services.database_url)} ({services.database_source})",
        )
        cenv = child_env(services.env)
        cenv.update(flower_env(settings))
        policy = policy_factory(settings) if settings.supervisor_max_restarts > 0 else None
        reload = None
        if settings.reload:
            watch = ReloadWatch(watched_roots(project, settings.config))
            reload = watch.changed
            out.line("supervisor", f"reload on: watching {', '.join(map(str, watch.roots))}")
        reporter = ops_reporter(services.env)
        sup = Supervisor(
            specs,
            env=cenv,
            output=out,
            grace_s=grace,
            policy=policy,
            reload=reload,
            report=lambda states: reporter.publish(states, supervisor_pid=os.getpid()),
        )
        install_signal_handlers(sup)
        code = sup.run_to_completion(migrate_spec())
        if code is None:
            return 0
        if code != 0:
            sup.say(f"migrations failed (exit code {code}); not starting")
            return code
        sup.start()
        base = local_url(settings.host, settings.port)
        return sup.watch(
            ready=lambda: http_ok(f"{base}/ok"),
            on_ready=lambda: out.raw(f"threadrun is up: {base}/  (chat UI at {base}/ui)"),
            ready_timeout_s=ready_timeout,
        )
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if sup is not None:
            sup.stop()
        if reporter is not None:
            reporter.remove()
        services.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
