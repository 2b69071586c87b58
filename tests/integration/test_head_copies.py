"""A1: the stored copies of thread heads (`thread_heads`, shared/state/head_copies.py)
on real PostgreSQL: a run's copy is written only by the run's current owner, inside its
fenced terminal transaction, and never at the cost of that transaction; unfenced copies
skip busy threads and never replace a newer head; values over the size cap are not copied
and are read from the checkpoint."""

from __future__ import annotations

import functools
import re
import uuid
from pathlib import Path
from typing import Any

import psycopg
from langgraph.pregel import Pregel
from psycopg_pool import ConnectionPool

from shared.agent.lead_agent import build_lead_agent
from shared.runs.model import RunStatus, ThreadStatus
from shared.runs.store import RunStore
from shared.settings import Settings
from shared.state import head_copies
from shared.state.accessor import CheckpointStateAccessor, ThreadHead
from shared.state.savers import StatePostgresSaver
from tests.conftest import claimed_run, plan_nodes

OWNER = "alice"


class _Registry:
    def __init__(self, graphs: dict[str, Pregel]) -> None:
        self._graphs = graphs

    def get(self, graph_id: str) -> Pregel:
        return self._graphs[graph_id]


def _thread(store: RunStore) -> str:
    return store.create_thread(None, OWNER, {"graph_id": "lead_agent"}, "raise").thread_id


def _copy(pool: ConnectionPool, tid: str) -> dict[str, Any] | None:
    with pool.connection() as conn:
        row: dict[str, Any] | None = conn.execute(
            "SELECT checkpoint_id, values_json::text AS v, updated_at FROM thread_heads"
            " WHERE thread_id = %s",
            (tid,),
        ).fetchone()
    return row


def _head(cid: str, values: str = '{"messages": []}') -> ThreadHead:
    return ThreadHead(values_json=values.encode(), interrupts={}, checkpoint_id=cid)


def test_l2_issue14_only_the_current_owner_writes_the_copy(store: RunStore) -> None:
    """L2, a stale owner's terminal transaction is fenced before its `also`
    runs, so its head copy is never written; the current owner's is."""
    tid = _thread(store)
    _, run_id, old = claimed_run(store, "w1", tid)
    assert store.requeue(run_id, old, "lease expired")
    new = store.claim(run_id, "w2").run
    assert new is not None
    calls: list[int] = []
    fin = store.finish(
        run_id,
        tid,
        old,
        status=RunStatus.SUCCESS,
        error=None,
        thread_status=ThreadStatus.IDLE,
        also=lambda conn: calls.append(old),
    )
    assert fin.fenced and calls == []
    write = functools.partial(
        head_copies.write_fenced, heads=[(tid, _head("1f0-new"))], max_bytes=1 << 20
    )
    fin = store.finish(
        run_id,
        tid,
        new.owner_epoch,
        status=RunStatus.SUCCESS,
        error=None,
        thread_status=ThreadStatus.IDLE,
        also=write,
    )
    assert not fin.fenced
    assert _copy(store._pool, tid)["checkpoint_id"] == "1f0-new"  # type: ignore[index]


def test_issue14_a_failing_copy_never_costs_the_terminal_status(store: RunStore) -> None:
    """A1: the copy is written under a savepoint: if it fails, the run still ends."""
    tid = _thread(store)
    _, run_id, epoch = claimed_run(store, "w1", tid)
    broken = functools.partial(
        head_copies.write_fenced, heads=[(tid, _head("1f0-x", "{not json"))], max_bytes=1 << 20
    )
    fin = store.finish(
        run_id,
        tid,
        epoch,
        status=RunStatus.SUCCESS,
        error=None,
        thread_status=ThreadStatus.IDLE,
        also=broken,
    )
    assert not fin.fenced and store.run_status(run_id) is RunStatus.SUCCESS
    assert store.get_thread(tid, OWNER).status == "idle" and _copy(store._pool, tid) is None


def test_issue14_unfenced_copies_skip_busy_threads_and_never_go_back(
    store: RunStore, pool: ConnectionPool
) -> None:
    """A1: a web-side copy of a busy thread is not stored (its run may still add
    interrupts to that head), and no copy replaces one of a newer head."""
    tid = _thread(store)
    saver = StatePostgresSaver(pool, mode="full")
    saver.write_head_copies([(tid, _head("1f0-b"))], 1 << 20)
    saver.write_head_copies([(tid, _head("1f0-a"))], 1 << 20)  # older: ignored
    assert _copy(pool, tid)["checkpoint_id"] == "1f0-b"  # type: ignore[index]
    claimed_run(store, "w1", tid)  # the thread is busy now
    saver.write_head_copies([(tid, _head("1f0-c"))], 1 << 20)
    assert _copy(pool, tid)["checkpoint_id"] == "1f0-b"  # type: ignore[index]
    saver.write_head_copies([(str(uuid.uuid4()), _head("1f0-d"))], 1 << 20)  # no such thread


def test_issue14_values_over_the_cap_are_read_from_the_checkpoint(
    settings: Settings, store: RunStore, pool: ConnectionPool, tmp_path: Path
) -> None:
    """THREADRUN_THREAD_VALUES_MAX_BYTES: a head whose values are larger is
    recorded without values; reads compute it from the checkpoint every time (and do not
    rewrite the record); a small one is served from its copy."""
    agent = build_lead_agent(settings)
    saver = StatePostgresSaver(pool, mode=settings.checkpoint_mode)
    bound = agent.copy(update={"checkpointer": saver})
    accessor = CheckpointStateAccessor(
        saver, _Registry({"lead_agent": agent}), values_max_bytes=3000
    )  # type: ignore[arg-type]
    big, small = _thread(store), _thread(store)
    for tid, text in ((big, "x" * 5000), (small, "hi")):
        cfg = {"configurable": {"thread_id": tid, "workspace_dir": tmp_path, "tokens": 2}}
        bound.invoke({"messages": [{"role": "user", "content": text}]}, cfg)
    want = {t: accessor.get(t, "lead_agent")["values"] for t in (big, small)}
    for _ in range(2):
        heads = accessor.heads({big: "lead_agent", small: "lead_agent"})
        assert {t: h.values for t, h in heads.items()} == want
    big_copy, small_copy = _copy(pool, big), _copy(pool, small)
    assert big_copy is not None and big_copy["v"] is None
    assert small_copy is not None and small_copy["v"] is not None
    accessor.heads({big: "lead_agent"})
    assert _copy(pool, big) == big_copy  # not rewritten by reads
    with psycopg.connect(settings.dsn) as conn:  # served from the copy, not the checkpoint
        conn.execute(
            "UPDATE thread_heads SET values_json = '{\"copy\": 1}' WHERE thread_id = %s", (small,)
        )
    assert accessor.heads({small: "lead_agent"})[small].values == {"copy": 1}


def _generic_plan(conn: psycopg.Connection[Any], sql: str, args: dict[str, str]) -> list[Any]:
    """The nodes of `sql`'s generic plan, run (EXPLAIN ANALYZE): the plan a connection's
    prepared statement keeps once psycopg prepares it. `args` are SQL literals by name."""
    names: list[str] = []

    def placeholder(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    prepared = re.sub(r"%\((\w+)\)s", placeholder, sql)
    conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE generic_plan AS {prepared}")
    explain = "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE generic_plan ({})"
    row = conn.execute(explain.format(", ".join(args[n] for n in names))).fetchone()
    conn.execute("DEALLOCATE generic_plan")
    assert row is not None
    return plan_nodes(row["QUERY PLAN"][0]["Plan"])


def _probes(nodes: list[Any], table: str) -> int:
    """How many times the plan looked `table` up; none of its reads may be a sequential
    scan, and none may return more than one row a look-up."""
    reads = [n for n in nodes if n.get("Relation Name") == table]
    assert reads and all(n["Node Type"] != "Seq Scan" for n in reads)
    assert all(n["Actual Rows"] <= 1 for n in reads)
    return sum(n["Actual Loops"] for n in reads)


def test_a1_copies_are_written_and_read_by_key_not_by_scanning(
    store: RunStore, pool: ConnectionPool
) -> None:
    """A1: writing a copy reads its own thread's row, and reading copies reads only the
    threads asked for (primary-key probes), whatever plan the connection cached: the
    generic plans, forced here as a connection's prepared statements get them, never scan
    every thread or every copy."""
    saver = StatePostgresSaver(pool, mode="full")
    others = [_thread(store) for _ in range(60)]  # rows the statements must not read
    saver.write_head_copies([(t, _head("1f0-a")) for t in others], 1 << 20)
    tid = _thread(store)
    write = {
        "thread_ids": f"ARRAY['{tid}']::uuid[]",
        "checkpoint_ids": "ARRAY['1f0-a']",
        "values": "ARRAY['{}']",
        "interrupts": "ARRAY['{}']",
        "fenced": "false",
    }
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        assert _probes(_generic_plan(conn, head_copies.WRITE_SQL, write), "threads") == 1
    read = {"thread_ids": f"ARRAY['{others[0]}', '{tid}']"}
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        assert _probes(_generic_plan(conn, head_copies.READ_SQL, read), "thread_heads") == 2
