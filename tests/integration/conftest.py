"""Fixtures the run-store integration tests share: a small pool on the session's database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from psycopg_pool import ConnectionPool

from shared.db import make_pool
from shared.runs.store import RunStore
from shared.settings import Settings


@pytest.fixture(scope="module")
def pool(settings: Settings, request: pytest.FixtureRequest) -> Iterator[ConnectionPool]:
    """A pool of 4 on the session's private database, named after the test module."""
    p = make_pool(settings, name=f"test-{request.module.__name__.rsplit('.', 1)[-1]}", max_size=4)
    yield p
    p.close()


@pytest.fixture
def store(pool: ConnectionPool) -> RunStore:
    """The run store on that pool."""
    return RunStore(pool)
