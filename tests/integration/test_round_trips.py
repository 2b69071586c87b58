"""Round trips to PostgreSQL on a run's first-token path, counted on the wire (libpq's
protocol trace, shared/tools/testing/pgtrace.py), and what a failure in the middle of those
pipelined transactions leaves: nothing written, the connection idle.

An admission (R2) is one transaction of two round trips (BEGIN with the thread lock and the
inflight read; the writes with COMMIT); a fenced checkpoint write (L2) is two (BEGIN with
the fence; the checkpoint's statements with COMMIT). psycopg's `conn.transaction()` inside
a pipeline would add three to each (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from psycopg import pq
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool

from shared.db import make_async_pool, make_pool, pipelined_transaction
from shared.errors import LeaseLost
from shared.runs.leases import lease_value
from shared.runs.model import MultitaskStrategy, RunRequest, RunStatus, ThreadStatus
from shared.runs.store import Finish, RunStore
from shared.settings import Settings
from shared.state import head_copies
from shared.state.accessor import ThreadHead
from shared.state.savers import LEASE_KEY, RUN_KEY, FencedPostgresSaver
from shared.tools.testing.pgtrace import traced
from tests.conftest import claimed_run


@pytest.fixture
def one_conn_pool(settings: Settings) -> Iterator[ConnectionPool]:
    """A pool of one connection: every call of the store goes through the traced one."""
    pool = make_pool(settings, name="test-round-trips", max_size=1)
    yield pool
    pool.close()


def _admit(store: RunStore, tid: str, run_id: str | None = None) -> str:
    run_id = run_id or str(uuid.uuid4())
    store.admit(
        RunRequest(thread_id=tid, assistant_id="lead_agent", input={"messages": []}),
        run_id=run_id,
        owner="alice",
        graph_id="lead_agent",
        strategy=MultitaskStrategy.ENQUEUE,
    )
    return run_id


def _count(pool: ConnectionPool, sql: str, *args: object) -> int:
    with pool.connection() as conn:
        row = conn.execute(sql, args).fetchone()
    assert row is not None
    return int(row["n"])


def test_r2_an_admission_is_one_transaction_of_two_round_trips(
    one_conn_pool: ConnectionPool,
) -> None:
    """R2: BEGIN, the thread lock and the inflight read in one round trip, the run, its
    thread's status and its `created` event with COMMIT in the next; all committed."""
    store = RunStore(one_conn_pool)
    tid = store.create_thread(None, "alice", {}, "raise").thread_id
    _admit(store, tid)  # the statements are prepared: the second admission is the steady state
    with one_conn_pool.connection() as conn:
        pgconn = conn.pgconn
    with traced(pgconn) as trace:
        run_id = _admit(store, tid)
    assert trace.round_trips == 2, trace.lines
    first, last = trace.flights()
    assert '"BEGIN"' in first and '"COMMIT"' in last, trace.lines
    assert _count(one_conn_pool, "SELECT count(*) AS n FROM runs WHERE run_id = %s", run_id) == 1
    created = "SELECT count(*) AS n FROM run_events WHERE run_id = %s AND type = 'created'"
    assert _count(one_conn_pool, created, run_id) == 1


def test_r2_an_admission_that_fails_at_commit_writes_nothing(
    one_conn_pool: ConnectionPool,
) -> None:
    """R2: a write that fails in the last round trip (here a duplicate run id) surfaces as
    its error, the whole admission is rolled back (no second `created` event, the thread
    untouched) and the connection goes back to the pool idle, ready for the next one."""
    store = RunStore(one_conn_pool)
    tid = store.create_thread(None, "alice", {}, "raise").thread_id
    run_id = _admit(store, tid)
    with pytest.raises(psycopg.errors.UniqueViolation):
        _admit(store, tid, run_id)
    with one_conn_pool.connection() as conn:
        assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
    events = "SELECT count(*) AS n FROM run_events WHERE run_id = %s AND type = 'created'"
    assert _count(one_conn_pool, events, run_id) == 1
    assert _count(one_conn_pool, "SELECT count(*) AS n FROM runs WHERE thread_id = %s", tid) == 1
    _admit(store, tid)  # the same connection admits the next run
    assert _count(one_conn_pool, "SELECT count(*) AS n FROM runs WHERE thread_id = %s", tid) == 2


def test_r2_an_error_raised_between_the_round_trips_rolls_back(
    one_conn_pool: ConnectionPool,
) -> None:
    """`pipelined_transaction`: an exception raised by the caller after the first round
    trip (as a 404 for a missing thread is) rolls back what was queued, and propagates."""
    marker = f"rt-{uuid.uuid4()}"
    with one_conn_pool.connection() as conn:
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS rt_probe (v text)")
        with pytest.raises(LookupError), pipelined_transaction(conn):
            conn.execute("INSERT INTO rt_probe VALUES (%s)", (marker,))
            assert conn.execute("SELECT 1 AS one").fetchone() is not None
            conn.execute("INSERT INTO rt_probe VALUES (%s)", (marker,))
            raise LookupError("the caller gives up")
        assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
        row = conn.execute("SELECT count(*) AS n FROM rt_probe WHERE v = %s", (marker,)).fetchone()
        assert row is not None and row["n"] == 0


def test_l2_a_fenced_checkpoint_write_is_two_round_trips(
    settings: Settings, one_conn_pool: ConnectionPool
) -> None:
    """L2: the fence (with BEGIN) in one round trip, the checkpoint's statements with COMMIT
    in the next; a stale epoch's write raises LeaseLost, writes nothing and leaves the
    connection idle."""
    tid, run_id, epoch = claimed_run(RunStore(one_conn_pool), "w1")

    async def scenario() -> None:
        apool = await make_async_pool(settings, name="test-round-trips", max_size=1, min_size=1)
        try:
            saver = FencedPostgresSaver(apool, mode="full")

            def config(e: int) -> dict[str, object]:
                lease = lease_value(e, "w1")
                conf = {"thread_id": tid, "checkpoint_ns": "", RUN_KEY: run_id, LEASE_KEY: lease}
                return {"configurable": conf}

            async def put(e: int) -> None:
                await saver.aput(config(e), empty_checkpoint(), {"step": -1}, {})  # type: ignore[arg-type]

            await put(epoch)  # prepares the statements
            async with apool.connection() as conn:
                pgconn = conn.pgconn
            with traced(pgconn) as trace:
                await put(epoch)
            assert trace.round_trips == 2, trace.lines
            first, last = trace.flights()
            assert '"BEGIN"' in first and '"COMMIT"' in last, trace.lines
            with pytest.raises(LeaseLost):
                await put(epoch - 1)
            async with apool.connection() as conn:
                assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
                cur = await conn.execute(
                    "SELECT count(*) AS n FROM checkpoints WHERE thread_id = %s", (tid,)
                )
                row: DictRow | None = await cur.fetchone()
                assert row is not None and row["n"] == 2  # the two current-epoch writes
        finally:
            await apool.close()

    asyncio.run(scenario())


def test_l2_a_terminal_write_is_two_round_trips_three_with_the_head_copy(
    one_conn_pool: ConnectionPool,
) -> None:
    """L2: BEGIN, the thread lock and the fenced status write in one round trip; the
    lifecycle event, the thread's settle and COMMIT in the next; a head copy (`also`) adds
    one, for its savepoint. A stale epoch's finish is fenced in two and changes nothing."""
    store = RunStore(one_conn_pool)

    def finish(run_id: str, tid: str, epoch: int, *, copy: bool = False) -> Finish:
        write = functools.partial(
            head_copies.write_fenced,
            heads=[(tid, ThreadHead(b'{"messages": []}', {}, f"1f0-{run_id}"))],
            max_bytes=1 << 20,
        )
        return store.finish(
            run_id,
            tid,
            epoch,
            status=RunStatus.SUCCESS,
            error=None,
            thread_status=ThreadStatus.IDLE,
            also=write if copy else None,
        )

    tid, run_id, epoch = claimed_run(store, "w1")
    finish(run_id, tid, epoch, copy=True)  # the statements are prepared: the steady state
    with one_conn_pool.connection() as conn:
        pgconn = conn.pgconn
    for copy, expected in ((False, 2), (True, 3)):
        tid, run_id, epoch = claimed_run(store, "w1")
        with traced(pgconn) as trace:
            assert not finish(run_id, tid, epoch, copy=copy).fenced
        assert trace.round_trips == expected, trace.lines
        assert '"BEGIN"' in trace.flights()[0] and '"COMMIT"' in trace.flights()[-1]
        assert store.run_status(run_id) is RunStatus.SUCCESS
        assert store.get_thread(tid, "alice").status == ThreadStatus.IDLE
    tid, run_id, epoch = claimed_run(store, "w1")
    assert store.requeue(run_id, epoch, "lease expired")
    with traced(pgconn) as trace:
        assert finish(run_id, tid, epoch, copy=True).fenced
    assert trace.round_trips == 2, trace.lines
    assert store.run_status(run_id) is RunStatus.PENDING
    with one_conn_pool.connection() as conn:
        assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
    fenced = "SELECT count(*) AS n FROM run_events WHERE run_id = %s AND type = 'fenced'"
    assert _count(one_conn_pool, fenced, run_id) == 1
