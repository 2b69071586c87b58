"""Connection pools for PostgreSQL (psycopg 3)."""

from __future__ import annotations

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from shared.settings import Settings

# The checkpoint saver needs autocommit, dict rows and no server-side prepared
# statements (pgbouncer-safe); our stores use explicit transactions on the same kind
# of connection, so one set of kwargs serves both.
CONN_KWARGS = {"autocommit": True, "row_factory": dict_row, "prepare_threshold": 0}


def make_pool(settings: Settings, *, name: str, max_size: int | None = None) -> ConnectionPool:
    """A sync pool (web process, worker stores), opened and waited for."""
    pool: ConnectionPool = ConnectionPool(
        settings.dsn,
        min_size=settings.db_pool_min,
        max_size=max_size or settings.db_pool_max,
        kwargs=dict(CONN_KWARGS),
        name=name,
        open=False,
        check=ConnectionPool.check_connection,
    )
    pool.open(wait=True, timeout=30)
    return pool


async def make_async_pool(
    settings: Settings, *, name: str, max_size: int | None = None
) -> AsyncConnectionPool:
    """An async pool; must be built inside the running loop that will use it."""
    pool: AsyncConnectionPool = AsyncConnectionPool(
        settings.dsn,
        min_size=settings.db_pool_min,
        max_size=max_size or settings.db_pool_max,
        kwargs=dict(CONN_KWARGS),
        name=name,
        open=False,
        check=AsyncConnectionPool.check_connection,
    )
    await pool.open(wait=True, timeout=30)
    return pool
