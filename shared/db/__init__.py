"""Connection pools for PostgreSQL (psycopg 3)."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import psycopg
from psycopg import AsyncConnection, AsyncPipeline, Connection, Pipeline, pq
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


def check_connection(conn: Connection[Any]) -> None:
    """The pool's check of a connection it is about to hand out (sync pools).

    A round trip (``ConnectionPool.check_connection``: an empty query) per checkout cost
    a worker and the web a tenth of their CPU, and PostgreSQL a statement, for what a
    non-blocking read of the socket tells: a server that went away (a restart, an idle
    timeout, ``pg_terminate_backend``) has closed it, so libpq reads end-of-file and marks
    the connection bad. Only then, or when the connection is not idle, the round trip
    runs (and fails, so the pool replaces the connection)."""
    if not _looks_alive(conn):
        ConnectionPool.check_connection(conn)


async def check_async_connection(conn: AsyncConnection[Any]) -> None:
    """`check_connection` for async pools."""
    if not _looks_alive(conn):
        await AsyncConnectionPool.check_connection(conn)


def _looks_alive(conn: Connection[Any] | AsyncConnection[Any]) -> bool:
    """Idle, and a non-blocking read of its socket (libpq's, never blocking) found
    neither end-of-file nor an error."""
    pgconn = conn.pgconn
    if pgconn.status != pq.ConnStatus.OK:
        return False
    if pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return False
    try:
        # Twice: a read that finds data (the server's "terminating connection" notice)
        # returns before it looks for the end-of-file that follows.
        pgconn.consume_input()
        pgconn.consume_input()
    except psycopg.OperationalError:
        return False
    return pgconn.status == pq.ConnStatus.OK


@contextlib.contextmanager
def pipelined_transaction(conn: Connection[Any]) -> Iterator[Pipeline]:
    """One transaction in pipeline mode whose BEGIN goes with its first statements and whose
    COMMIT goes with its last: a transaction that reads, then writes, is two round trips
    (the read's fetch, then the block's end), one that only writes is one.

    Not psycopg's ``conn.transaction()`` inside ``conn.pipeline()``: in pipeline mode that
    wraps itself in nested pipeline blocks which sync at its start and at its end, so BEGIN
    and COMMIT each cost a round trip of their own, plus an empty sync (counted on the wire,
    `shared.tools.testing.pgtrace`: an admission took eight round trips, a fenced checkpoint write
    five; tests/integration/test_round_trips.py).

    The block's statements must not open ``conn.transaction()`` themselves (psycopg does not
    know of this BEGIN: it would commit it); the pipeline it yields can `sync()` mid-way (a
    savepoint's statements, say, whose failure the caller handles). On any error the
    transaction is rolled back before the error propagates; a statement error surfaces at the
    next fetch, at a `sync()` or at the block's end.
    """
    try:
        with conn.pipeline() as pipeline:
            conn.execute("BEGIN", prepare=False)
            yield pipeline
            conn.execute("COMMIT", prepare=False)
    except BaseException:
        if _in_transaction(conn):
            with contextlib.suppress(psycopg.Error):
                conn.rollback()
        raise


@contextlib.asynccontextmanager
async def apipelined_transaction(conn: AsyncConnection[Any]) -> AsyncIterator[AsyncPipeline]:
    """`pipelined_transaction` for async connections."""
    try:
        async with conn.pipeline() as pipeline:
            await conn.execute("BEGIN", prepare=False)
            yield pipeline
            await conn.execute("COMMIT", prepare=False)
    except BaseException:
        if _in_transaction(conn):
            with contextlib.suppress(psycopg.Error):
                await conn.rollback()
        raise


def pipeline_block(conn: Connection[Any]) -> contextlib.AbstractContextManager[Any]:
    """A pipeline block, or nothing when the connection is in pipeline mode already: the
    statements then join the caller's pipeline (a nested block would sync at its start and
    at its end, a round trip each)."""
    if conn.pgconn.pipeline_status != pq.PipelineStatus.OFF:
        return contextlib.nullcontext()
    return conn.pipeline()


def _in_transaction(conn: Connection[Any] | AsyncConnection[Any]) -> bool:
    """A usable connection left inside a transaction (open or failed)."""
    pgconn = conn.pgconn
    return pgconn.status == pq.ConnStatus.OK and pgconn.transaction_status in (
        pq.TransactionStatus.INTRANS,
        pq.TransactionStatus.INERROR,
    )


def make_pool(settings: Settings, *, name: str, max_size: int | None = None) -> DictPool:
    """A sync pool (web process, worker stores), opened and waited for."""
    pool = ConnectionPool(
        settings.dsn,
        min_size=settings.db_pool_min,
        max_size=max_size or settings.db_pool_max,
        kwargs=dict(CONN_KWARGS),
        name=name,
        open=False,
        check=check_connection,
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
        check=check_async_connection,
    )
    await pool.open(wait=True, timeout=30)
    return cast(AsyncDictPool, pool)
