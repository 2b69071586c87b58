"""Shared fixtures: a private database and Redis key prefix per test session.

Tests share the machine's Redis and PostgreSQL with developers and CI, so each session
creates its own database (`threadrun_t_<hex>`) and key prefix (`trt:<hex>:`) and removes
exactly those at the end. A missing service fails the tests that need it; nothing is
silently skipped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
import redis
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import SecretStr

from shared.settings import Settings

DEFAULT_DB_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def server_dsn(db: str) -> str:
    """The configured PostgreSQL server, with database `db`."""
    base = os.environ.get("THREADRUN_DATABASE_URL", DEFAULT_DB_URL)
    params = conninfo_to_dict(base)
    params["dbname"] = db
    return make_conninfo(**params)  # type: ignore[arg-type]


def create_database(name: str) -> str:
    """CREATE DATABASE `name`; return its DSN."""
    with psycopg.connect(server_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server_dsn(name)


def drop_database(name: str) -> None:
    """DROP DATABASE `name` (forcing out leftover connections)."""
    with psycopg.connect(server_dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    """Delete every key under `prefix`."""
    n = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            n += client.delete(*batch)
            batch.clear()
    if batch:
        n += client.delete(*batch)
    return n


@pytest.fixture(scope="session")
def session_id() -> str:
    """A short random id for this test session's private resources."""
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def database(session_id: str) -> Iterator[str]:
    """A private, migrated database for the session."""
    from shared.db.migrate import migrate

    name = f"threadrun_t_{session_id}"
    dsn = create_database(name)
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
        delete_prefix(client, prefix)
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
def private_settings(base: Settings, redis_url: str) -> Iterator[Settings]:
    """A fresh migrated database and key prefix, dropped afterwards.

    Every extra cluster a test starts needs its own: a reaper recovers every run of its
    database whose lease it cannot see under its own prefix, so two clusters sharing a
    database but not a prefix would take each other's runs.
    """
    from shared.db.migrate import migrate

    tag = uuid.uuid4().hex[:10]
    name = f"threadrun_t_{tag}"
    dsn = create_database(name)
    prefix = f"trt:{tag}:"
    try:
        s = base.model_copy(update={"database_url": SecretStr(dsn), "redis_prefix": prefix})
        migrate(s)
        yield s
    finally:
        drop_database(name)
        client = redis.Redis.from_url(redis_url)
        try:
            delete_prefix(client, prefix)
        finally:
            client.close()


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a child process use these settings."""
    return {
        "THREADRUN_DATABASE_URL": settings.dsn,
        "THREADRUN_REDIS_URL": settings.redis_url,
        "THREADRUN_REDIS_PREFIX": settings.redis_prefix,
        "THREADRUN_DATA_DIR": str(settings.data_dir),
    }
