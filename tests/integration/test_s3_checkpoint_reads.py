"""S3 on the real Postgres saver: our savers' checkpoint read (`shared.state.savers.SELECT_SQL`)
answers exactly what LangGraph's own read answers, for every checkpoint of a thread (sync and
async), and fetches a checkpoint's blobs one primary-key probe per channel instead of every blob
of the thread (LangGraph's join: the cost of each head read grew with the thread's age), and
its pending writes by primary key (the saver's `thread_id`-only indexes are dropped)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Any, TypedDict

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.postgres.base import SELECT_SQL as LANGGRAPH_SELECT_SQL
from langgraph.graph import START, StateGraph
from psycopg.rows import dict_row

from shared.db import make_async_pool, make_pool
from shared.db.migrate import REDUNDANT_CHECKPOINT_INDEXES
from shared.settings import Settings
from shared.state.savers import SELECT_SQL, FencedPostgresSaver, StatePostgresSaver

HEAD = " WHERE thread_id = %s AND checkpoint_ns = '' ORDER BY checkpoint_id DESC LIMIT 1"


def _append(left: list[str], right: list[str]) -> list[str]:
    return left + right


class State(TypedDict, total=False):
    items: Annotated[list[str], _append]
    n: int
    label: str


def _graph() -> Any:
    """Two nodes writing three channels: every step writes new blob versions."""

    def first(state: State) -> State:
        return {"items": [f"first {state.get('n', 0)}"], "n": state.get("n", 0) + 1}

    def second(state: State) -> State:
        return {"label": f"turn {state.get('n', 0)}"}

    builder = StateGraph(State)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    return builder


def _same(ours: Any, theirs: Any) -> None:
    assert ours.config == theirs.config
    assert ours.checkpoint == theirs.checkpoint
    assert ours.metadata == theirs.metadata
    assert ours.parent_config == theirs.parent_config
    assert ours.pending_writes == theirs.pending_writes


def rows_touched(conn: psycopg.Connection[Any], sql: str, params: Any, relation: str) -> int:
    """Rows the plan of `sql` touched in `relation`: those it returned plus those its
    filters discarded, over every loop."""
    plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()
    assert plan is not None
    total = 0

    def walk(node: dict[str, Any]) -> None:
        nonlocal total
        if node.get("Relation Name") == relation:
            per_loop = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
            total += per_loop * node.get("Actual Loops", 1)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["QUERY PLAN"][0]["Plan"])
    return total


def _blob_rows(conn: psycopg.Connection[Any], sql: str, thread_id: str) -> int:
    """`checkpoint_blobs` rows a head read of `thread_id` through `sql` touched."""
    return rows_touched(conn, sql + HEAD, (thread_id,), "checkpoint_blobs")


def test_s3_sync_checkpoint_reads_equal_langgraphs(settings: Settings) -> None:
    """S3: every checkpoint of a thread (`list`, and `get_tuple` of each) read through the web's
    saver equals LangGraph's own read of it: channel values, pending writes, parents."""
    pool = make_pool(settings, name="test-checkpoint-reads", max_size=2)
    try:
        saver = StatePostgresSaver(pool, mode="full")
        app = _graph().compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": str(uuid.uuid4())}}
        for i in range(6):
            app.invoke({"items": [f"input {i}"]}, cfg)
        ours = list(saver.list(cfg))
        theirs = list(PostgresSaver.list(saver, cfg))
        assert len(ours) == len(theirs) >= 18
        assert any(t.pending_writes for t in ours)
        for a, b in zip(ours, theirs, strict=True):
            _same(a, b)
            one = saver.get_tuple(a.config)
            assert one is not None
            _same(one, b)
        assert app.get_state(cfg).values["items"][-1] == "first 5"
    finally:
        pool.close()


def test_s3_async_checkpoint_reads_equal_langgraphs(settings: Settings) -> None:
    """S3: the workers' saver reads every checkpoint exactly as LangGraph's async saver does."""

    async def scenario() -> None:
        pool = await make_async_pool(settings, name="test-checkpoint-reads-async", max_size=2)
        try:
            saver = FencedPostgresSaver(pool, mode="full")
            app = _graph().compile(checkpointer=saver)
            cfg = {"configurable": {"thread_id": str(uuid.uuid4())}}
            for i in range(5):
                await app.ainvoke({"items": [f"input {i}"]}, cfg)
            ours = [t async for t in saver.alist(cfg)]
            theirs = [t async for t in AsyncPostgresSaver.alist(saver, cfg)]
            assert len(ours) == len(theirs) >= 15
            for a, b in zip(ours, theirs, strict=True):
                _same(a, b)
                one = await saver.aget_tuple(a.config)
                assert one is not None
                _same(one, b)
        finally:
            await pool.close()

    asyncio.run(scenario())


def _old_thread(pool: Any, turns: int = 40) -> tuple[StatePostgresSaver, str, dict[str, Any]]:
    """A `full` thread of `turns` invocations of `_graph()`: (its saver, its id, its config)."""
    saver = StatePostgresSaver(pool, mode="full")
    app = _graph().compile(checkpointer=saver)
    tid = str(uuid.uuid4())
    cfg = {"configurable": {"thread_id": tid}}
    for i in range(turns):
        app.invoke({"items": [f"input {i}"]}, cfg)
    return saver, tid, cfg


def test_s3_a_head_read_fetches_only_the_blobs_of_its_channels(settings: Settings) -> None:
    """S3: reading an old thread's head touches one `checkpoint_blobs` row per channel of the
    head (before statistics and after ANALYZE), where LangGraph's join touches every blob the
    thread ever wrote; both return the same head."""
    pool = make_pool(settings, name="test-checkpoint-blob-reads", max_size=2)
    try:
        saver, tid, cfg = _old_thread(pool)
        head = saver.get_tuple(cfg)
        assert head is not None
        channels = len(head.checkpoint["channel_versions"])
        with psycopg.connect(settings.dsn, autocommit=True, row_factory=dict_row) as conn:
            written = conn.execute(
                "SELECT count(*) AS n FROM checkpoint_blobs WHERE thread_id = %s", (tid,)
            ).fetchone()
            assert written is not None and written["n"] > 10 * channels
            for analyzed in (False, True):
                if analyzed:
                    conn.execute("ANALYZE checkpoint_blobs")
                ours = _blob_rows(conn, SELECT_SQL, tid)
                assert ours <= channels, (analyzed, ours, channels)
            # What LangGraph's own statement touches on the same thread (the regression).
            assert _blob_rows(conn, LANGGRAPH_SELECT_SQL, tid) > 10 * channels
    finally:
        pool.close()


def test_s3_a_checkpoint_read_fetches_only_its_own_pending_writes(settings: Settings) -> None:
    """S3: the saver's redundant `thread_id` indexes are gone after `migrate` (each table's
    primary key leads with `thread_id`), so reading one checkpoint of an old thread fetches
    its own pending writes by primary key, with or without planner statistics, not every
    write of the thread."""
    pool = make_pool(settings, name="test-checkpoint-write-reads", max_size=2)
    try:
        saver, tid, cfg = _old_thread(pool)
        middle = list(saver.list(cfg))[30]
        assert middle.pending_writes
        one = (
            " WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = %s",
            (tid, middle.config["configurable"]["checkpoint_id"]),
        )
        with psycopg.connect(settings.dsn, autocommit=True, row_factory=dict_row) as conn:
            left = conn.execute(
                "SELECT indexname FROM pg_indexes WHERE indexname = ANY(%s)",
                (list(REDUNDANT_CHECKPOINT_INDEXES),),
            ).fetchall()
            assert left == []
            written = conn.execute(
                "SELECT count(*) AS n FROM checkpoint_writes WHERE thread_id = %s", (tid,)
            ).fetchone()
            assert written is not None and written["n"] > 10 * len(middle.pending_writes)
            for analyzed in (False, True):
                if analyzed:
                    conn.execute("ANALYZE checkpoint_writes")
                touched = rows_touched(conn, SELECT_SQL + one[0], one[1], "checkpoint_writes")
                assert touched <= len(middle.pending_writes), (analyzed, touched)
    finally:
        pool.close()
