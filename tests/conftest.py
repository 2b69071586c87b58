"""Shared fixtures: a private database and Redis key prefix per test session.

Tests share the machine's Redis and PostgreSQL with developers and CI, so each session
creates its own database (`threadrun_t_<hex>`) and key prefix (`trt:<hex>:`) and removes
exactly those at the end. A missing service fails the tests that need it; nothing is
silently skipped.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

import pytest
import redis

from shared.runs.model import MultitaskStrategy, RunRequest
from shared.runs.store import ClaimOutcome, RunStore
from shared.settings import Settings
from shared.tools import testing

DEFAULT_DB_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def server_url() -> str:
    """The configured PostgreSQL server."""
    return os.environ.get("THREADRUN_DATABASE_URL", DEFAULT_DB_URL)


def create_database(name: str, template: str | None = None) -> str:
    """CREATE DATABASE `name` on the configured server (a copy of `template` if given);
    return its DSN."""
    return testing.create_database(server_url(), name, template=template)


def drop_database(name: str) -> None:
    """DROP DATABASE `name` (forcing out leftover connections)."""
    testing.drop_database(server_url(), name)


@pytest.fixture(scope="session")
def session_id() -> str:
    """A short random id for this test session's private resources."""
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def template_database(session_id: str) -> Iterator[str]:
    """The name of a migrated database that nothing connects to: the session's database and
    every private one are copies of it (CREATE DATABASE ... TEMPLATE), each migrated again
    as a no-op, instead of running every migration once per database."""
    from shared.db.migrate import migrate

    name = f"threadrun_t_{session_id}_tpl"
    migrate(Settings(database_url=create_database(name)))  # type: ignore[arg-type]
    yield name
    drop_database(name)


@pytest.fixture(scope="session")
def database(session_id: str, template_database: str) -> Iterator[str]:
    """A private, migrated database for the session."""
    from shared.db.migrate import migrate

    name = f"threadrun_t_{session_id}"
    dsn = create_database(name, template_database)
    migrate(Settings(database_url=dsn))  # type: ignore[arg-type]
    yield dsn
    drop_database(name)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis server the tests use."""
    return os.environ.get("THREADRUN_REDIS_URL", DEFAULT_REDIS_URL)


@pytest.fixture(scope="session")
def redis_prefix(session_id: str, redis_url: str) -> Iterator[str]:
    """A private key prefix, deleted at the end of the session."""
    prefix = f"trt:{session_id}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        testing.delete_prefix(client, prefix)
    finally:
        client.close()


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private data folder (workspaces)."""
    return tmp_path_factory.mktemp("threadrun-data")


@pytest.fixture(scope="session")
def settings(database: str, redis_url: str, redis_prefix: str, data_dir: Path) -> Settings:
    """Settings pointing at the private database and prefix."""
    return Settings(
        database_url=database,  # type: ignore[arg-type]
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        data_dir=data_dir,
    )


@pytest.fixture
def rclient(redis_url: str) -> Iterator[redis.Redis]:
    """A sync Redis client."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@contextmanager
def private_settings(
    base: Settings, redis_url: str, template: str | None = None
) -> Iterator[Settings]:
    """A fresh migrated database (a copy of `template`, the `template_database` fixture,
    if given) and key prefix, dropped afterwards.

    Every extra cluster a test starts needs its own: a reaper recovers every run of its
    database whose lease it cannot see under its own prefix, so two clusters sharing a
    database but not a prefix would take each other's runs.
    """
    with testing.Sandbox(
        base.model_copy(update={"redis_url": redis_url}), "t", template=template
    ) as s:
        yield s


FORK_SERVER_PRELOAD = ("shared.db", "shared.journal", "shared.runs.store", "shared.settings")
"""What the fork server imports once (langgraph and the rest come with these): installed
modules, importable whatever sys.path the server starts with (unlike the tests package)."""


def forked_processes() -> ForkServerContext:
    """The multiprocessing context for tests that run several processes at once (R2, J4).

    Its children are forks of one server process that imported FORK_SERVER_PRELOAD once,
    instead of fresh interpreters that import all of it again each (seconds of CPU per child
    under `spawn`); each child still imports the test module its function lives in. They are
    separate processes with their own connections, as before: nothing a test proves about
    processes changes. The server lives until the session ends.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(FORK_SERVER_PRELOAD))
    return ctx


def claimed_run(store: RunStore, worker: str, thread_id: str | None = None) -> tuple[str, str, int]:
    """An admitted run that `worker` has claimed, on alice's `thread_id` (a new thread when
    None): (thread id, run id, the attempt's epoch)."""
    tid = thread_id or store.create_thread(None, "alice", {}, "raise").thread_id
    run_id = str(uuid.uuid4())
    store.admit(
        RunRequest(thread_id=tid, assistant_id="lead_agent"),
        run_id=run_id,
        owner="alice",
        graph_id="lead_agent",
        strategy=MultitaskStrategy.ENQUEUE,
    )
    claim = store.claim(run_id, worker)
    assert claim.outcome is ClaimOutcome.CLAIMED and claim.run is not None
    return tid, run_id, claim.run.owner_epoch


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of a plan (EXPLAIN ... FORMAT JSON's "Plan"), depth first."""
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test`: `-n TEST_JOBS --dist loadgroup`) each test file is one
    group, run by one worker (its module fixtures, such as a private cluster, start once), and
    tests/chaos is one group: its runs (network namespaces, a cluster under faults) go one
    after the other."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        rel = item.path.relative_to(config.rootpath).as_posix()
        group = "chaos" if rel.startswith("tests/chaos/") else rel
        item.add_marker(pytest.mark.xdist_group(group))
