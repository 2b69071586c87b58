"""The pools' connection check (shared/db): no round trip for a live connection, and a
connection the server closed is replaced before it is handed out (R7: a restarted
PostgreSQL costs a run no attempt)."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from shared.db import check_connection, make_pool
from shared.settings import Settings


def test_r7_a_connection_the_server_closed_is_replaced_at_checkout(settings: Settings) -> None:
    """R7: after pg_terminate_backend the pool hands out a working connection."""
    pool: ConnectionPool = make_pool(settings, name="test-pool-check", max_size=1)
    try:
        with pool.connection() as conn:
            victim = conn.info.backend_pid
        with psycopg.connect(settings.dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (victim,))
        time.sleep(0.2)  # the server's FATAL notice and end-of-file reach the socket
        with pool.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() is not None
            assert conn.info.backend_pid != victim
    finally:
        pool.close()


def test_r7_a_live_idle_connection_passes_the_check_without_a_query(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R7: the check of a live idle connection sends nothing, also with a LISTEN's
    notification pending; a closed connection fails it."""
    round_trips: list[object] = []
    full_check = ConnectionPool.check_connection
    monkeypatch.setattr(
        ConnectionPool,
        "check_connection",
        staticmethod(lambda c: (round_trips.append(c), full_check(c))),
    )
    with (
        psycopg.connect(settings.dsn, autocommit=True) as conn,
        psycopg.connect(settings.dsn, autocommit=True) as other,
    ):
        conn.execute("LISTEN pool_check")
        other.execute("NOTIFY pool_check")
        time.sleep(0.1)
        check_connection(conn)
        assert round_trips == []
        assert conn.execute("SELECT 1").fetchone() is not None
        conn.close()
        with pytest.raises(psycopg.OperationalError):
            check_connection(conn)
        assert round_trips == [conn]
