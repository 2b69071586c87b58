"""Connection pools for PostgreSQL (psycopg 3)."""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, cast

from psycopg import AsyncConnection, Connection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from shared.settings import Settings

# The checkpoint saver needs autocommit and dict rows; our stores use explicit
# transactions on the same kind of connection, so one set of kwargs serves both.
# prepare_threshold=0 prepares every statement on first use (fastest on a direct
# connection); behind a transaction-mode pgbouncer set it to None instead.
CONN_KWARGS: dict[str, Any] = {"autocommit": True, "row_factory": dict_row, "prepare_threshold": 0}

DictPool = ConnectionPool[Connection[DictRow]]
AsyncDictPool = AsyncConnectionPool[AsyncConnection[DictRow]]


def make_pool(settings: Settings, *, name: str, max_size: int | None = None) -> DictPool:
    """A sync pool (web process, worker stores), opened and waited for."""
    pool = ConnectionPool(
        settings.dsn,
        min_size=settings.db_pool_min,
        max_size=max_size or settings.db_pool_max,
        kwargs=dict(CONN_KWARGS),
        name=name,
        open=False,
        check=ConnectionPool.check_connection,
    )
    pool.open(wait=True, timeout=30)
    _OPEN_POOLS.add(pool)
    return cast(DictPool, pool)


_OPEN_POOLS: weakref.WeakSet[ConnectionPool[Any]] = weakref.WeakSet()
"""The sync pools this process opened, so that its exit can close them (`close_pools`)."""


def close_pools(timeout_s: float = 2.0) -> None:
    """Close every sync pool this process opened. A gevent web worker calls it on its way
    out: a pool left to the interpreter's teardown joins its worker threads from a
    finalizer, which gevent refuses (a `greenlet is being finalized` traceback per pool)."""
    for pool in list(_OPEN_POOLS):
        with contextlib.suppress(Exception):
            pool.close(timeout=timeout_s)


async def make_async_pool(
    settings: Settings, *, name: str, max_size: int | None = None, min_size: int | None = None
) -> AsyncDictPool:
    """An async pool; must be built inside the running loop that will use it."""
    pool = AsyncConnectionPool(
        settings.dsn,
        min_size=settings.db_pool_min if min_size is None else min_size,
        max_size=max_size or settings.db_pool_max,
        kwargs=dict(CONN_KWARGS),
        name=name,
        open=False,
        check=AsyncConnectionPool.check_connection,
    )
    await pool.open(wait=True, timeout=30)
    return cast(AsyncDictPool, pool)
