"""J1-J5 on real PostgreSQL: seq allocation under concurrency, pages, receipts, the journal end to end."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from psycopg_pool import ConnectionPool

from shared.agent.lead_agent import build_lead_agent
from shared.db import make_pool
from shared.errors import LeaseLost, RunNotFound
from shared.journal import (
    Category,
    DeliveryOutcome,
    RunEvent,
    RunEventStore,
    RunJournal,
    append_in,
    write_delivery_receipt,
)
from shared.journal.postgres import RUN_USAGE_SQL, THREAD_USAGE_SQL
from shared.runs.model import MultitaskStrategy, RunRequest, RunStatus, ThreadStatus
from shared.runs.store import RunStore
from shared.settings import Settings
from shared.workspaces import OWNERLESS, owner_root
from tests.conftest import forked_processes, plan_nodes
from tests.event_store_conformance import EventStoreConformance, MakeStore, NewRun, ev

OWNER = "journal-tests"


@pytest.fixture(scope="module")
def pool(settings: Settings) -> Iterator[ConnectionPool]:
    p = make_pool(settings, name="test-events", max_size=8)
    yield p
    p.close()


@pytest.fixture
def runs(pool: ConnectionPool) -> RunStore:
    return RunStore(pool)


@pytest.fixture
def events(pool: ConnectionPool) -> RunEventStore:
    return RunEventStore(pool, page_size=4, page_size_max=6, max_payload_bytes=2048)


def new_run(runs: RunStore, thread_id: str | None = None) -> tuple[str, str]:
    """A thread (new unless given) and an admitted run on it; the run has `created` at seq 1."""
    tid = thread_id or runs.create_thread(None, OWNER, {}, "raise").thread_id
    run_id = str(uuid.uuid4())
    runs.admit(
        RunRequest(thread_id=tid, assistant_id="lead_agent"),
        run_id=run_id,
        owner=OWNER,
        graph_id="lead_agent",
        strategy=MultitaskStrategy.ENQUEUE,
    )
    return tid, run_id


# --- J4: seq allocation -------------------------------------------------------------------------
def _append_in_child(args: tuple[str, str, str, int, int, int, Any]) -> list[int]:
    dsn, run_id, tid, worker, batches, size, barrier = args
    pool = make_pool(Settings(database_url=dsn), name="child", max_size=1)  # type: ignore[arg-type]
    try:
        store = RunEventStore(pool)
        barrier.wait(timeout=30)
        seqs: list[int] = []
        for b in range(batches):
            batch = [ev(run_id, tid, w=worker, b=b, i=i) for i in range(size)]
            seqs += [e.seq or 0 for e in store.append_batch(batch)]
        return seqs
    finally:
        pool.close()


def test_j4_seq_strictly_increasing_under_concurrent_processes(
    settings: Settings, runs: RunStore, events: RunEventStore
) -> None:
    """J4: 6 processes append batches to one run at once: seqs unique, gap-free, in append order."""
    tid, run_id = new_run(runs)
    n, batches, size = 6, 15, 7
    ctx = forked_processes()
    with ctx.Manager() as manager:
        barrier = manager.Barrier(n)
        with ctx.Pool(n) as procs:
            args = [(settings.dsn, run_id, tid, w, batches, size, barrier) for w in range(n)]
            per_worker = procs.map(_append_in_child, args)
    for seqs in per_worker:
        assert seqs == sorted(seqs) and len(seqs) == batches * size
    everything = sorted(s for seqs in per_worker for s in seqs)
    assert everything == list(range(2, 2 + n * batches * size))  # seq 1 is `created`
    # each writer's batches are contiguous, in its own order
    stored = [e for e in events.list_run_events(run_id, categories=["tool"], limit=6).events]
    assert [e.payload["i"] for e in stored] == list(range(6))


def test_j4_seq_strictly_increasing_under_concurrent_threads_with_lifecycle_events(
    runs: RunStore, events: RunEventStore, pool: ConnectionPool
) -> None:
    """J4: 8 threads append singles while RunStore-style lifecycle events use `append_in`."""
    tid, run_id = new_run(runs)
    barrier = threading.Barrier(9)
    got: list[int] = []
    lock = threading.Lock()

    def appender(w: int) -> None:
        barrier.wait(timeout=30)
        for i in range(25):
            seq = events.append(ev(run_id, tid, w=w, i=i)).seq
            with lock:
                got.append(seq or 0)

    def lifecycle() -> None:
        barrier.wait(timeout=30)
        for i in range(10):
            with pool.connection() as conn, conn.transaction():
                seq = append_in(conn, run_id, Category.LIFECYCLE, "tick", {"i": i})
            with lock:
                got.append(seq or 0)

    threads = [threading.Thread(target=appender, args=(w,)) for w in range(8)]
    threads.append(threading.Thread(target=lifecycle))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(got) == list(range(2, 2 + 8 * 25 + 10))


def test_j4_compatible_with_runstore_max_plus_one_lifecycle_events(
    runs: RunStore, events: RunEventStore
) -> None:
    """J4: RunStore's lifecycle events and the store's appends interleave; no seq is reused."""
    tid, run_id = new_run(runs)  # created = 1
    claim = runs.claim(run_id, "w1")  # claimed = 2
    assert claim.run is not None
    assert [e.seq for e in events.append_batch([ev(run_id, tid) for _ in range(3)])] == [3, 4, 5]
    assert runs.requeue(run_id, claim.run.owner_epoch, "test")  # requeued = 6
    runs.claim(run_id, "w2")  # claimed = 7
    assert [e.seq for e in events.append_batch([ev(run_id, tid) for _ in range(2)])] == [8, 9]
    assert [e["seq"] for e in runs.run_events(run_id)] == list(range(1, 10))


def test_j4_no_deadlock_with_a_transaction_that_locked_the_run_row(
    runs: RunStore, events: RunEventStore, pool: ConnectionPool
) -> None:
    """J4: a journal append waits for a RunStore-style transaction (run row locked, then a
    lifecycle event) instead of deadlocking with it: both lock the run row first."""
    tid, run_id = new_run(runs)
    events.append(ev(run_id, tid))  # the counter row exists: seq 2
    done: list[int] = []
    with pool.connection() as conn, conn.transaction():
        conn.execute("SELECT 1 FROM runs WHERE run_id = %s FOR UPDATE", (run_id,))
        appender = threading.Thread(
            target=lambda: done.extend(e.seq or 0 for e in events.append_batch([ev(run_id, tid)]))
        )
        appender.start()
        appender.join(timeout=0.5)
        assert appender.is_alive()  # blocked on the run row, holding nothing we need
        assert append_in(conn, run_id, Category.LIFECYCLE, "cancel_requested", {}) == 3
    appender.join(timeout=30)
    assert done == [4]


def test_j4_append_to_a_missing_run_is_run_not_found(events: RunEventStore) -> None:
    """J4: events belong to a run; a missing one is RunNotFound, not a driver error."""
    with pytest.raises(RunNotFound):
        events.append(ev(str(uuid.uuid4()), str(uuid.uuid4())))


def test_j4_append_in_a_missing_run_appends_nothing(pool: ConnectionPool) -> None:
    """J4: `append_in` in a caller's transaction returns None for a run that does not exist."""
    with pool.connection() as conn, conn.transaction():
        assert append_in(conn, str(uuid.uuid4()), Category.LIFECYCLE, "fenced", {}) is None


# --- J2, J4, J5: the conformance suite ---------------------------------------------------------------
class TestRunEventStore(EventStoreConformance):
    """The Postgres store against the suite the in-process store also passes."""

    @pytest.fixture
    def make_store(self, pool: ConnectionPool) -> MakeStore:
        def make(**settings: Any) -> RunEventStore:
            return RunEventStore(pool, **settings)

        return make

    @pytest.fixture
    def new_run(self, runs: RunStore) -> NewRun:
        return lambda thread_id=None: new_run(runs, thread_id)


# --- J5: receipts -----------------------------------------------------------------------------------
def test_l2_j5_receipt_is_fenced_by_the_epoch(
    runs: RunStore, events: RunEventStore, tmp_path: Path
) -> None:
    """L2, J5: an attempt's receipt is written only while its epoch owns the running run; a
    stale attempt (the run re-claimed by a newer epoch) gets LeaseLost at once, no retries,
    and writes nothing; the current owner writes normally; after the end nobody writes."""
    tid, run_id = new_run(runs)
    first = runs.claim(run_id, "old").run
    assert first is not None
    old = first.owner_epoch
    assert runs.requeue(run_id, old, "test")
    second = runs.claim(run_id, "new").run
    assert second is not None
    new = second.owner_epoch
    naps: list[float] = []
    with pytest.raises(LeaseLost):
        write_delivery_receipt(
            events, run_id, tid, 1, False, [], tmp_path, epoch=old, sleep=naps.append
        )
    assert naps == []  # not retried
    assert events.get_receipt(run_id, 1) is None
    assert write_delivery_receipt(events, run_id, tid, 2, False, [], tmp_path, epoch=new) is (
        DeliveryOutcome.WRITTEN
    )
    assert write_delivery_receipt(events, run_id, tid, 2, False, [], tmp_path, epoch=new) is (
        DeliveryOutcome.ALREADY_WRITTEN
    )
    runs.finish(
        run_id, tid, new, status=RunStatus.SUCCESS, error=None, thread_status=ThreadStatus.IDLE
    )
    with pytest.raises(LeaseLost):
        write_delivery_receipt(events, run_id, tid, 3, False, [], tmp_path, epoch=new)


# --- J1/J2: the lead agent, journaled into Postgres --------------------------------------------------
def test_j1_j2_lead_agent_audit_trail(runs: RunStore, pool: ConnectionPool, tmp_path: Path) -> None:
    """J1/J2/J5: a real lead_agent run lists its model calls with usage, the tool call, the artifact."""
    store = RunEventStore(pool)
    tid, run_id = new_run(runs)
    journal = RunJournal(store, run_id=run_id, thread_id=tid)
    graph = build_lead_agent().copy(update={"checkpointer": InMemorySaver()})
    config: dict[str, Any] = {
        "configurable": {"thread_id": tid, "workspace_dir": Path(tmp_path)},
        "callbacks": [journal],
    }

    async def run() -> None:
        inp = {"messages": [{"role": "user", "content": "please write a report"}]}
        async for _ in graph.astream(inp, config, stream_mode="values"):  # type: ignore[arg-type]
            pass
        await journal.flush()

    asyncio.run(run())
    trail = store.list_run_events(run_id, limit=500).events
    kinds = [(e.category, e.type) for e in trail]
    assert kinds == [
        ("lifecycle", "created"),
        ("message", "message.input"),
        ("model", "model.start"),
        ("model", "model.end"),
        ("message", "message.ai"),
        ("tool", "tool.call"),
        ("tool", "tool.result"),
        ("artifact", "artifact.written"),
        ("model", "model.start"),
        ("model", "model.end"),
        ("message", "message.ai"),
    ]
    assert [e.seq for e in trail] == list(range(1, len(trail) + 1))
    ends = [e.payload for e in trail if e.type == "model.end"]
    usages = [p["usage"] for p in ends]
    # The built-in model's reply is `builtin_tokens` (24) tokens; its input grows by the
    # tool round (the prompt's exact size depends on the middleware's system text).
    assert [u["output_tokens"] for u in usages] == [24, 24]
    assert 0 < usages[0]["input_tokens"] < usages[1]["input_tokens"]
    assert all(u["total_tokens"] == u["input_tokens"] + u["output_tokens"] for u in usages)
    assert {p["tag"] for p in ends} == {"lead_agent"}
    call = next(e.payload for e in trail if e.type == "tool.call")
    assert call["name"] == "write_artifact" and call["args"]["filename"] == "report.md"
    artifact = next(e.payload for e in trail if e.category == "artifact")
    written = tmp_path / OWNERLESS / tid / "outputs" / "report.md"
    digest = hashlib.sha256(written.read_bytes()).hexdigest()
    assert artifact["path"] == "outputs/report.md" and artifact["sha256"] == digest
    assert artifact["size"] == written.stat().st_size

    total = {
        k: sum(u[k] for u in usages) for k in ("input_tokens", "output_tokens", "total_tokens")
    }
    assert journal.usage() == {"total": total, "by_tag": {"lead_agent": total}}
    assert store.run_usage(run_id) == journal.usage()
    assert store.thread_usage(tid) == {**journal.usage(), "by_run": {run_id: total}}

    outcome = write_delivery_receipt(
        store,
        run_id,
        tid,
        1,
        journal.produced_output,
        journal.artifact_paths(),
        owner_root(tmp_path, None),
    )
    assert outcome is DeliveryOutcome.WRITTEN
    receipt = store.get_receipt(run_id, 1)
    assert receipt is not None
    assert receipt.payload["coverage"][0]["sha256"] == digest


@pytest.mark.parametrize(
    ("sql", "key"), [(RUN_USAGE_SQL, "run_id"), (THREAD_USAGE_SQL, "thread_id")]
)
def test_j2_usage_reads_only_its_own_rows(
    runs: RunStore, events: RunEventStore, pool: ConnectionPool, sql: str, key: str
) -> None:
    """J2: a usage sum reads the run's (the thread's) rows by its key, never the partial
    index of every `model.end` ever written: its cost follows the run, not the table.
    Checked on the plan PostgreSQL runs, with other runs' `model.end` rows present."""
    u = {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}
    for _ in range(4):  # other threads' model calls, which the sum must not touch
        otid, other = new_run(runs)
        events.append_batch([RunEvent(other, otid, "model", "model.end", {"usage": u})] * 40)
    tid, run_id = new_run(runs)
    events.append_batch([RunEvent(run_id, tid, "model", "model.end", {"usage": u})] * 2)
    own_rows = 3  # `created` and the two model calls
    with pool.connection() as conn:
        cur = psycopg.ClientCursor(conn)
        cur.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + sql, {key: run_id if key == "run_id" else tid}
        )
        plan = cur.fetchone()
    assert plan is not None
    nodes = plan_nodes(plan["QUERY PLAN"][0]["Plan"])
    scans = [n for n in nodes if n.get("Relation Name") == "run_events"]
    assert scans and all(s.get("Index Name") != "run_events_model_end_at" for s in scans)
    read = sum(s["Actual Rows"] + s.get("Rows Removed by Filter", 0) for s in scans)
    assert read <= own_rows
    assert events.run_usage(run_id)["total"] == {k: 2 * v for k, v in u.items()}


def test_migration_0002_schema(pool: ConnectionPool) -> None:
    """J4/J5: the counter table and the receipt index exist after migrating."""
    with pool.connection() as conn:
        tables = {r["tablename"] for r in conn.execute("SELECT tablename FROM pg_tables")}
        indexes = {r["indexname"] for r in conn.execute("SELECT indexname FROM pg_indexes")}
    assert "run_event_seqs" in tables
    assert {"run_events_delivery_once", "runs_thread_seq"} <= indexes


def test_migration_0002_backfills_existing_events(settings: Settings) -> None:
    """J4: on a database with events from before 0002, the counter is seeded from them."""
    from shared.db.migrate import VERSION_TABLE_SQL, migrate, migrations
    from tests.conftest import create_database, drop_database

    name = f"threadrun_t_m2_{uuid.uuid4().hex[:8]}"
    dsn = create_database(name)
    try:
        first = migrations()[0]
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
            conn.execute(VERSION_TABLE_SQL)
            conn.execute(first.sql)
            conn.execute(
                "INSERT INTO threadrun_schema_version (version, name) VALUES (%s, %s)",
                (first.version, first.name),
            )
            tid, run_id = str(uuid.uuid4()), str(uuid.uuid4())
            conn.execute("INSERT INTO threads (thread_id, owner) VALUES (%s, 'o')", (tid,))
            conn.execute(
                "INSERT INTO runs (run_id, thread_id, assistant_id, graph_id, multitask_strategy)"
                " VALUES (%s, %s, 'a', 'a', 'enqueue')",
                (run_id, tid),
            )
            for seq in (1, 2, 3):
                conn.execute(
                    "INSERT INTO run_events (run_id, seq, thread_id, category, type)"
                    " VALUES (%s, %s, %s, 'lifecycle', 'x')",
                    (run_id, seq, tid),
                )
        assert 2 in migrate(Settings(database_url=dsn))  # type: ignore[arg-type]
        pool = make_pool(Settings(database_url=dsn), name="m2", max_size=1)  # type: ignore[arg-type]
        try:
            store = RunEventStore(pool)
            assert store.append(ev(run_id, tid)).seq == 4
            page = store.list_thread_events(tid)
            assert [e.seq for e in page.events] == [1, 2, 3, 4]
        finally:
            pool.close()
    finally:
        drop_database(name)
