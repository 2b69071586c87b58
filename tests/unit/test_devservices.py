"""Unit tests of shared.tools.devservices (URL handling, resolution order) and shared.tools.supervisor."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from shared.settings import PROJECT_ROOT, Settings
from shared.tools import devservices as ds
from shared.tools import supervisor as sv
from shared.tools.testing import wait_for

PY = sys.executable

# --------------------------------------------------------------------------------------
# URLs
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://postgres@127.0.0.1:5432/threadrun", "threadrun"),
        ("postgres://u:p@db.example:6543/app_db?sslmode=disable", "app_db"),
        ("postgresql://postgres@127.0.0.1:5432", "threadrun"),
        ("postgresql://postgres@127.0.0.1:5432/", "threadrun"),
        ("postgresql://h/ignored?dbname=fromquery", "fromquery"),
        ("postgresql://h/my%20db", "my db"),
        ("host=127.0.0.1 port=5432 dbname=kvdb user=postgres", "kvdb"),
        ("host=127.0.0.1 user=postgres", "threadrun"),
    ],
)
def test_database_name(url: str, expected: str) -> None:
    assert ds.database_name(url) == expected


def test_database_name_custom_default() -> None:
    assert ds.database_name("postgresql://h:1", default="other") == "other"


def test_with_database_replaces_path_and_keeps_query() -> None:
    url = "postgresql://u:p@h:5/old?sslmode=disable&dbname=x"
    assert ds.with_database(url, "new") == "postgresql://u:p@h:5/new?sslmode=disable"
    assert ds.with_database("postgresql://postgres@h:5", "postgres") == (
        "postgresql://postgres@h:5/postgres"
    )
    kv = ds.with_database("host=h port=5 dbname=old", "new")
    assert "dbname=new" in kv and "host=h" in kv


def test_redis_db_helpers() -> None:
    assert ds.redis_db("redis://127.0.0.1:6379/3") == 3
    assert ds.redis_db("redis://127.0.0.1:6379") == 0
    assert ds.redis_db("redis://h:1?db=5") == 5
    assert ds.with_redis_db("redis://:pw@h:1/0", 2) == "redis://:pw@h:1/2"
    with pytest.raises(ds.DevServicesError):
        ds.redis_db("redis://h:1/x")


def test_redact_hides_passwords_only() -> None:
    assert ds.redact("postgresql://u:secret@h:5/db") == "postgresql://u:***@h:5/db"
    assert ds.redact("redis://:secret@h:6379/0") == "redis://:***@h:6379/0"
    assert ds.redact("postgresql://u@h:5/db") == "postgresql://u@h:5/db"


def test_free_port_is_bindable() -> None:
    import socket

    port = ds.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# --------------------------------------------------------------------------------------
# resolution order
# --------------------------------------------------------------------------------------


class FakeServer:
    """Stands in for an EmbeddedServer."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self.stopped = False


class Probes:
    """Scripted probes and embedded starts; records what was asked."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, answering: set[str]) -> None:
        self.answering = answering
        self.calls: list[tuple[str, str]] = []
        self.created: list[tuple[str, str]] = []
        self.stopped: list[str] = []
        monkeypatch.setattr(ds, "probe_redis", self.redis)
        monkeypatch.setattr(ds, "probe_postgres", self.postgres)
        monkeypatch.setattr(ds, "start_embedded", self.start)
        monkeypatch.setattr(ds, "ensure_database", self.ensure)
        monkeypatch.setattr(ds, "stop_embedded", self.stop)

    def redis(self, url: str, timeout: float = 1.0) -> str | None:
        self.calls.append(("redis", url))
        return None if url in self.answering else "ConnectionError: refused"

    def postgres(self, url: str, timeout: float = 2.0) -> str | None:
        self.calls.append(("postgres", url))
        if url in self.answering:
            return None
        if ds.with_database(url, "postgres") in self.answering:
            return 'InvalidCatalogName: database "x" does not exist'
        return "OperationalError: connection refused"

    def start(self, name: str, data_dir: Path, *, daemon: bool = False) -> ds.Embedded:
        self.calls.append(("start", name))
        port = 1111 if name == "redis" else 2222
        scheme = "redis" if name == "redis" else "postgresql"
        user = "" if name == "redis" else "postgres@"
        url = f"{scheme}://{user}127.0.0.1:{port}"
        return ds.Embedded(url, FakeServer(name, url))  # type: ignore[arg-type]

    def ensure(self, server_url: str, dbname: str) -> bool:
        self.created.append((server_url, dbname))
        return True

    def stop(self, server: Any) -> None:
        self.stopped.append(server.name)


LOCAL_PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCAL_REDIS_0 = "redis://127.0.0.1:6379/0"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No THREADRUN_ service variables; a private data dir."""
    for name in ("THREADRUN_REDIS_URL", "THREADRUN_DATABASE_URL", ds.FORCE_EMBEDDED_ENV):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_explicit_urls_win_and_skip_the_local_probe(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path
) -> None:
    redis_url = "redis://10.9.9.9:7000/4"
    pg_url = "postgresql://app:pw@10.9.9.9:7001/appdb"
    probes = Probes(monkeypatch, {redis_url, pg_url})
    settings = Settings(data_dir=clean_env, redis_url=redis_url, database_url=SecretStr(pg_url))
    services = ds.resolve_services(settings)
    assert (services.redis_url, services.redis_source) == (redis_url, "env")
    assert (services.database_url, services.database_source) == (pg_url, "env")
    assert probes.calls == [("redis", redis_url), ("postgres", pg_url)]
    assert probes.created == [] and services.owned == []


def test_explicit_urls_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path
) -> None:
    monkeypatch.setenv("THREADRUN_REDIS_URL", "redis://10.9.9.9:7000/0")
    monkeypatch.setenv("THREADRUN_DATABASE_URL", "postgresql://postgres@10.9.9.9:7001/x")
    Probes(monkeypatch, {"redis://10.9.9.9:7000/0", "postgresql://postgres@10.9.9.9:7001/x"})
    services = ds.resolve_services(Settings(data_dir=clean_env))
    assert services.redis_source == services.database_source == "env"


def test_explicit_redis_that_does_not_answer_is_an_error(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path
) -> None:
    probes = Probes(monkeypatch, {LOCAL_REDIS_0, LOCAL_PG_ADMIN})
    settings = Settings(data_dir=clean_env, redis_url="redis://:hunter2@10.9.9.9:7000/0")
    with pytest.raises(ds.DevServicesError, match="THREADRUN_REDIS_URL") as err:
        ds.resolve_services(settings)
    assert "hunter2" not in str(err.value)
    assert ("start", "redis") not in probes.calls


def test_explicit_postgres_that_does_not_answer_is_an_error(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path
) -> None:
    Probes(monkeypatch, {LOCAL_REDIS_0, LOCAL_PG_ADMIN})
    settings = Settings(
        data_dir=clean_env, database_url=SecretStr("postgresql://u:pw@10.9.9.9:7001/x")
    )
    with pytest.raises(ds.DevServicesError, match="THREADRUN_DATABASE_URL"):
        ds.resolve_services(settings)


def test_explicit_postgres_with_missing_database_creates_it(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path
) -> None:
    url = "postgresql://u@10.9.9.9:7001/fresh"
    probes = Probes(monkeypatch, {LOCAL_REDIS_0, "postgresql://u@10.9.9.9:7001/postgres"})
    services = ds.resolve_services(Settings(data_dir=clean_env, database_url=SecretStr(url)))
    assert services.database_url == url
    assert probes.created == [(url, "fresh")]


def test_local_defaults_when_they_answer(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    probes = Probes(monkeypatch, {LOCAL_REDIS_0, LOCAL_PG_ADMIN})
    services = ds.resolve_services(Settings(data_dir=clean_env))
    assert (services.redis_url, services.redis_source) == (LOCAL_REDIS_0, "local")
    assert services.database_url == "postgresql://postgres@127.0.0.1:5432/threadrun"
    assert services.database_source == "local"
    assert probes.created == [("postgresql://postgres@127.0.0.1:5432", "threadrun")]
    assert not [c for c in probes.calls if c[0] == "start"]


def test_db_name_and_redis_db_overrides(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    Probes(monkeypatch, {"redis://127.0.0.1:6379/1", LOCAL_PG_ADMIN})
    services = ds.resolve_services(
        Settings(data_dir=clean_env), db_name="threadrun_test", redis_db_number=1
    )
    assert services.redis_url == "redis://127.0.0.1:6379/1"
    assert services.database_url.endswith("/threadrun_test")


def test_embedded_when_nothing_answers(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    probes = Probes(monkeypatch, set())
    services = ds.resolve_services(Settings(data_dir=clean_env))
    assert (services.redis_url, services.redis_source) == ("redis://127.0.0.1:1111/0", "embedded")
    assert services.database_url == "postgresql://postgres@127.0.0.1:2222/threadrun"
    assert services.started == ["redis", "postgres"]
    assert probes.created == [("postgresql://postgres@127.0.0.1:2222", "threadrun")]
    services.stop()
    assert probes.stopped == ["postgres", "redis"]
    assert services.owned == []


def test_force_embedded_skips_the_local_probe(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path
) -> None:
    monkeypatch.setenv(ds.FORCE_EMBEDDED_ENV, "1")
    probes = Probes(monkeypatch, {LOCAL_REDIS_0, LOCAL_PG_ADMIN})
    services = ds.resolve_services(Settings(data_dir=clean_env))
    assert services.redis_source == services.database_source == "embedded"
    assert ("redis", LOCAL_REDIS_0) not in probes.calls
    assert ("postgres", LOCAL_PG_ADMIN) not in probes.calls


def test_no_embedded_is_an_error(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    Probes(monkeypatch, {LOCAL_REDIS_0})
    with pytest.raises(ds.DevServicesError, match="no PostgreSQL answers"):
        ds.resolve_services(Settings(data_dir=clean_env), allow_embedded=False)
    Probes(monkeypatch, set())
    with pytest.raises(ds.DevServicesError, match="no Redis answers"):
        ds.resolve_services(Settings(data_dir=clean_env), allow_embedded=False)


def test_failure_stops_what_was_started(monkeypatch: pytest.MonkeyPatch, clean_env: Path) -> None:
    probes = Probes(monkeypatch, set())

    def broken(name: str, data_dir: Path, *, daemon: bool = False) -> ds.Embedded:
        if name == "postgres":
            raise ds.DevServicesError("initdb failed")
        return probes.start(name, data_dir, daemon=daemon)

    monkeypatch.setattr(ds, "start_embedded", broken)
    with pytest.raises(ds.DevServicesError, match="initdb"):
        ds.resolve_services(Settings(data_dir=clean_env))
    assert probes.stopped == ["redis"]


SENTINELS = "10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379"


def test_sentinel_is_resolved_through_the_sentinels_never_local_or_embedded(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path
) -> None:
    """With THREADRUN_REDIS_SENTINELS no plain Redis is probed or started; the Sentinel
    settings travel with the URLs to every child (DevServices.env, the export lines)."""
    probes = Probes(monkeypatch, {LOCAL_REDIS_0, LOCAL_PG_ADMIN})
    asked: list[Settings] = []

    def sentinel(settings: Settings, timeout: float = 2.0) -> tuple[str, str | None]:
        asked.append(settings)
        return "10.0.0.7:6379", None

    monkeypatch.setattr(ds, "probe_sentinel", sentinel)
    settings = Settings(
        data_dir=clean_env,
        redis_sentinels=SENTINELS,
        redis_sentinel_master="tr-main",
        redis_sentinel_password=SecretStr("s pw"),
        redis_url="redis://:node-pw@ignored:6379/0",
    )
    services = ds.resolve_services(settings, redis_db_number=5)
    assert len(asked) == 1
    assert services.redis_url == "redis://:node-pw@ignored:6379/5"
    assert services.redis_source == "sentinel: master 'tr-main' at 10.0.0.7:6379"
    assert not [c for c in probes.calls if c[0] in ("redis", "start")], probes.calls
    assert services.env == {
        "THREADRUN_REDIS_URL": "redis://:node-pw@ignored:6379/5",
        "THREADRUN_DATABASE_URL": services.database_url,
        "THREADRUN_REDIS_SENTINELS": SENTINELS,
        "THREADRUN_REDIS_SENTINEL_MASTER": "tr-main",
        "THREADRUN_REDIS_SENTINEL_PASSWORD": "s pw",
    }
    lines = services.export_lines()
    assert f"export THREADRUN_REDIS_SENTINELS={SENTINELS}" in lines
    assert "export THREADRUN_REDIS_SENTINEL_PASSWORD='s pw'" in lines


def test_sentinel_without_a_master_is_an_error_not_an_embedded_redis(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path
) -> None:
    probes = Probes(monkeypatch, {LOCAL_REDIS_0, LOCAL_PG_ADMIN})
    monkeypatch.setattr(
        ds, "probe_sentinel", lambda s, timeout=2.0: ("", "MasterNotFoundError: no master")
    )
    settings = Settings(data_dir=clean_env, redis_sentinels=SENTINELS)
    with pytest.raises(ds.DevServicesError, match="no master 'threadrun'.*MasterNotFoundError"):
        ds.resolve_services(settings)
    assert probes.calls == [] and probes.stopped == []


def test_supervisor_children_get_the_sentinel_settings(
    monkeypatch: pytest.MonkeyPatch, clean_env: Path
) -> None:
    """Every process the supervisor starts (migrations first, then the rest) sees the
    Sentinel settings and the resolved URLs."""
    services = ds.DevServices(
        "redis://:pw@x:6379/0",
        "postgresql://postgres@127.0.0.1:5432/threadrun",
        sentinel=ds.sentinel_env(Settings(redis_sentinels=SENTINELS)),
    )
    monkeypatch.delenv("THREADRUN_REDIS_SENTINELS", raising=False)
    env = sv.child_env(services.env)
    buf = io.StringIO()
    show = "import os; print(os.environ['THREADRUN_REDIS_SENTINELS'], os.environ['THREADRUN_REDIS_SENTINEL_MASTER'], os.environ['THREADRUN_REDIS_URL'])"
    sup = sv.Supervisor([], env=env, output=sv.Output(buf))
    for name in ("migrate", "web", "worker", "memory", "scheduler", "flower"):
        assert sup.run_to_completion(py_child(name, show)) == 0
    lines = [ln for ln in buf.getvalue().splitlines() if "|" in ln]
    assert len(lines) == 6
    assert all(ln.endswith(f"| {SENTINELS} threadrun redis://:pw@x:6379/0") for ln in lines)


def test_export_lines_are_shell_safe() -> None:
    services = ds.DevServices("redis://h:1/0", "postgresql://u:p w@h:2/d", "local", "local")
    lines = services.export_lines()
    assert lines[0] == "export THREADRUN_REDIS_URL=redis://h:1/0"
    assert lines[1] == "export THREADRUN_DATABASE_URL='postgresql://u:p w@h:2/d'"
    assert lines[2] == f"export {ds.STARTED_ENV}=''"
    out = subprocess.run(
        ["bash", "-c", "\n".join(lines) + '\nprintf %s "$THREADRUN_DATABASE_URL"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "postgresql://u:p w@h:2/d"


def test_state_records_round_trip(tmp_path: Path) -> None:
    state = ds.State("redis", 123, "redis://127.0.0.1:1", True, 99)
    state.write(tmp_path)
    assert ds.State.read(tmp_path, "redis") == state
    ds.State.remove(tmp_path, "redis")
    assert ds.State.read(tmp_path, "redis") is None
    (tmp_path / "postgres.json").write_text("{not json")
    assert ds.State.read(tmp_path, "postgres") is None


def test_pid_alive() -> None:
    assert ds.pid_alive(os.getpid())
    assert not ds.pid_alive(os.getpid(), "no-such-program")
    proc = subprocess.Popen([PY, "-c", "pass"])
    proc.wait()
    assert not ds.pid_alive(proc.pid)
    assert not ds.pid_alive(0)


def test_stop_daemons_without_records_is_a_no_op(tmp_path: Path) -> None:
    assert ds.stop_daemons(tmp_path) == []


def test_cli_rejects_unknown_service_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        ds.main(["stop", "mysql"])
    assert exc.value.code == 2
    assert "unknown service" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# supervisor
# --------------------------------------------------------------------------------------


def py_child(name: str, code: str) -> sv.ChildSpec:
    """A ChildSpec running a small Python program."""
    return sv.ChildSpec(name, [PY, "-c", textwrap.dedent(code)])


SLEEPER = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: (print("got TERM", flush=True), sys.exit(0)))
print("sleeping", flush=True)
time.sleep(60)
"""

STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("stubborn", flush=True)
time.sleep(60)
"""


def make_supervisor(
    specs: list[sv.ChildSpec], grace_s: float = 5.0
) -> tuple[sv.Supervisor, io.StringIO]:
    buf = io.StringIO()
    sup = sv.Supervisor(specs, output=sv.Output(buf, 8), grace_s=grace_s, poll_s=0.02)
    return sup, buf


def test_output_is_prefixed_per_line() -> None:
    sup, buf = make_supervisor(
        [
            py_child("alpha", "print('one'); print('two')"),
            py_child("b", "import sys; sys.stderr.write('err\\n')"),
        ]
    )
    for spec in sup.specs:
        assert sup.run_to_completion(spec) == 0
    lines = buf.getvalue().splitlines()
    assert "alpha   | one" in lines and "alpha   | two" in lines
    assert "b       | err" in lines


def test_run_to_completion_returns_the_exit_code() -> None:
    sup, _ = make_supervisor([])
    assert sup.run_to_completion(py_child("m", "import sys; sys.exit(7)")) == 7
    assert sup.children == []


def test_children_get_the_environment() -> None:
    buf = io.StringIO()
    sup = sv.Supervisor(
        [], env={"THREADRUN_X": "42", "PATH": os.environ["PATH"]}, output=sv.Output(buf)
    )
    sup.run_to_completion(
        py_child(
            "env", "import os; print(os.environ['THREADRUN_X'], os.environ['PYTHONUNBUFFERED'])"
        )
    )
    assert buf.getvalue().splitlines()[-1].endswith("| 42 1")


def test_stop_request_terminates_children_and_returns_zero() -> None:
    sup, buf = make_supervisor([py_child("a", SLEEPER), py_child("b", SLEEPER)])
    sup.start()
    wait_for(lambda: buf.getvalue().count("| sleeping") == 2, interval=0.02)
    pids = [c.proc.pid for c in sup.children]
    sup.request_stop()
    assert sup.watch() == 0
    sup.stop()
    assert buf.getvalue().count("| got TERM") == 2
    assert not any(ds.pid_alive(pid) for pid in pids)
    assert sup.children == []


def test_child_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    sup, buf = make_supervisor([py_child("stub", STUBBORN)], grace_s=0.5)
    sup.start()
    wait_for(lambda: "| stubborn" in buf.getvalue(), interval=0.02)
    pid = sup.children[0].proc.pid
    started = time.monotonic()
    sup.stop()
    assert 0.4 < time.monotonic() - started < 5
    assert "did not stop in time; killing it" in buf.getvalue()
    assert not ds.pid_alive(pid)


def test_unexpected_child_death_is_reported_and_nonzero() -> None:
    sup, buf = make_supervisor(
        [
            py_child("web", SLEEPER),
            py_child("worker", "import time, sys; time.sleep(0.3); sys.exit(3)"),
        ]
    )
    sup.start()
    rc = sup.watch()
    sup.stop()
    assert rc == 3
    assert "worker exited unexpectedly (code 3); stopping" in buf.getvalue()
    assert "web     | got TERM" in buf.getvalue()


def test_child_killed_by_a_signal_gives_a_nonzero_exit() -> None:
    code = "import os, signal, time; time.sleep(0.2); os.kill(os.getpid(), signal.SIGKILL)"
    sup, _ = make_supervisor([py_child("web", code)])
    sup.start()
    assert sup.watch() == 1
    sup.stop()


def test_grandchildren_are_killed_with_their_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    code = f"""
    import signal, subprocess, sys, time
    gc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
    open({str(pidfile)!r}, "w").write(str(gc.pid))
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print("ready", flush=True)
    time.sleep(60)
    """
    sup, buf = make_supervisor([py_child("parent", code)], grace_s=0.5)
    sup.start()
    wait_for(lambda: "| ready" in buf.getvalue() and pidfile.exists(), interval=0.02)
    grandchild = int(pidfile.read_text())
    sup.stop()
    wait_for(lambda: not ds.pid_alive(grandchild), timeout=5, interval=0.02)


def test_ready_callback_runs_once() -> None:
    sup, _ = make_supervisor([py_child("web", SLEEPER)])
    sup.start()
    polls: list[int] = []
    fired: list[int] = []

    def on_ready() -> None:
        fired.append(1)
        sup.request_stop()

    def ready() -> bool:
        polls.append(1)
        return len(polls) >= 3

    assert sup.watch(ready=ready, on_ready=on_ready) == 0
    sup.stop()
    assert fired == [1] and len(polls) == 3


def test_not_ready_in_time_is_a_failure() -> None:
    sup, buf = make_supervisor([py_child("web", SLEEPER)])
    sup.start()
    assert sup.watch(ready=lambda: False, ready_timeout_s=0.3) == 1
    sup.stop()
    assert "not ready after" in buf.getvalue()


def test_default_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(host="0.0.0.0", port=8123, worker_concurrency=7)
    specs = {s.name: list(s.argv) for s in sv.default_specs(settings, env={})}
    assert list(specs) == ["web", "worker", "memory", "background", "scheduler", "webhooks"]
    # make run starts the cron scheduler (Celery beat with our scheduler)
    assert "beat -S workers.cron_beat:CronScheduler" in " ".join(specs["scheduler"])
    scheduler = next(s for s in sv.default_specs(settings, env={}) if s.name == "scheduler")
    assert scheduler.env == {"THREADRUN_PROCESS_NICE": "10"}  # its work is the firings
    web = specs["web"]
    # every other gunicorn setting lives in app/gunicorn_conf.py (tests/unit/test_gunicorn_conf.py)
    assert web[1:] == [
        "-m",
        "gunicorn",
        "-c",
        "python:app.gunicorn_conf",
        "app:create_app()",
        "--bind",
        "0.0.0.0:8123",
    ]
    worker = " ".join(specs["worker"])
    assert "-A workers.celery_app:celery worker" in worker
    assert "-Q runs " in worker and "-P threads" in worker and "-c 7" in worker
    # Cron firings on a worker of their own at a lower OS priority, every slot theirs.
    background = next(s for s in sv.default_specs(settings, env={}) if s.name == "background")
    assert " ".join(background.argv).count("-Q runs.background ") == 1
    assert background.env == {
        "THREADRUN_PROCESS_NICE": "10",
        "THREADRUN_WORKER_BACKGROUND_SHARE": "1",
    }
    together = {
        s.name: s
        for s in sv.default_specs(settings.model_copy(update={"background_workers": 0}), env={})
    }
    assert "background" not in together
    assert "-Q runs,runs.background " in " ".join(together["worker"].argv)
    assert worker.endswith("-n runs@%h --without-gossip --without-mingle")
    assert "-E" not in specs["worker"]  # the task_events setting decides (make_celery)
    memory = " ".join(specs["memory"])
    assert "-Q memory " in memory and "-c 4" in memory and "-n memory@%h" in memory
    hooks = " ".join(specs["webhooks"])  # slow receivers never delay memory extraction
    assert "-Q webhooks" in hooks and "-n webhooks@%h" in hooks
    with pytest.raises(SystemExit):
        sv.default_specs(settings, env={"THREADRUN_MEMORY_CONCURRENCY": "zero"})


def test_addresses() -> None:
    assert sv.bind_address("::1", 80) == "[::1]:80"
    assert sv.local_url("0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert sv.local_url("::", 8000) == "http://[::1]:8000"
    assert sv.local_url("127.0.0.1", 9) == "http://127.0.0.1:9"


def test_port_in_use() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert sv.port_in_use("127.0.0.1", port)
    assert not sv.port_in_use("127.0.0.1", ds.free_port())


def test_http_ok_on_a_closed_port() -> None:
    assert not sv.http_ok(f"http://127.0.0.1:{ds.free_port()}/ok", timeout=1)


# --- the whole of main(), in a subprocess, with fake services and children ---------------

MAIN_HARNESS = """
import os, sys
import shared.tools.supervisor as s
from shared.tools.devservices import DevServices

mode, marks = sys.argv[1], sys.argv[2]
s.resolve_services = lambda settings: DevServices("redis://fake:1/0", "postgresql://fake:2/db", "local", "local")
s.http_ok = lambda url, timeout=2.0: len(os.listdir(marks)) >= 2
migrate = "print('migrated')" if mode != "migrate-fails" else "import sys; sys.exit(4)"
s.migrate_spec = lambda: s.ChildSpec("migrate", [sys.executable, "-c", migrate])
web = (
    "import os, signal, sys, time\\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\\n"
    "print('pid', os.getpid(), os.environ['THREADRUN_REDIS_URL'], flush=True)\\n"
    "open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close()\\n"
    "time.sleep(60)\\n"
)
worker = web if mode != "worker-dies" else "import time, sys; time.sleep(0.5); sys.exit(9)"
s.default_specs = lambda settings: [
    s.ChildSpec("web", [sys.executable, "-c", web, marks]),
    s.ChildSpec("worker", [sys.executable, "-c", worker, marks]),
]
sys.exit(s.main())
"""


PORT = ds.free_port()


def run_main(mode: str, send_sigterm: bool, marks: Path, port: int = PORT) -> tuple[int, str]:
    env = {**os.environ, "THREADRUN_HOST": "127.0.0.1", "THREADRUN_PORT": str(port)}
    if mode == "worker-dies":  # no restarts: the old stop-everything rule (restarts: SPEC H1)
        env["THREADRUN_SUPERVISOR_MAX_RESTARTS"] = "0"
    proc = subprocess.Popen(
        [PY, "-c", MAIN_HARNESS, mode, str(marks)],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if send_sigterm and line.startswith("threadrun is up"):
                proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    finally:
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rc, "\n".join(lines)


def test_main_runs_migrations_children_and_stops_on_sigterm(tmp_path: Path) -> None:
    rc, out = run_main("ok", send_sigterm=True, marks=tmp_path)
    assert rc == 0, out
    assert any(ln.startswith("migrate ") and ln.endswith("| migrated") for ln in out.splitlines())
    up = [ln for ln in out.splitlines() if ln.startswith("threadrun is up")]
    base = f"http://127.0.0.1:{PORT}"
    assert up == [f"threadrun is up: {base}/  (chat UI at {base}/ui)"]
    pids = [int(ln.split()[3]) for ln in out.splitlines() if "| pid " in ln]
    assert len(pids) == 2 and "redis://fake:1/0" in out
    assert not any(ds.pid_alive(pid) for pid in pids)


def test_main_fails_when_a_child_dies(tmp_path: Path) -> None:
    rc, out = run_main("worker-dies", send_sigterm=False, marks=tmp_path)
    assert rc == 9, out
    assert "worker exited unexpectedly (code 9)" in out
    pids = [int(ln.split()[3]) for ln in out.splitlines() if "| pid " in ln]
    assert pids and not any(ds.pid_alive(pid) for pid in pids)


def test_main_stops_when_migrations_fail(tmp_path: Path) -> None:
    rc, out = run_main("migrate-fails", send_sigterm=False, marks=tmp_path)
    assert rc == 4, out
    assert "migrations failed (exit code 4); not starting" in out
    assert "| pid " not in out and "threadrun is up" not in out


def test_main_refuses_a_port_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        rc, out = run_main("ok", send_sigterm=False, marks=tmp_path, port=sock.getsockname()[1])
    assert rc == 1, out
    assert "is already in use" in out and "migrate" not in out
