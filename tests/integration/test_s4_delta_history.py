"""S4 on the real Postgres saver: our savers read a delta channel's history in pages sized by
the snapshot frequency (shared/state/delta_history.py) and return exactly what LangGraph's own
read returns, for every checkpoint of a thread: with snapshots (one short page) and without
any (a walk to the root over several growing pages), sync and async."""

from __future__ import annotations

import asyncio
import operator
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.postgres.base import _build_delta_stage1_sql
from langgraph.graph import START, StateGraph
from psycopg.rows import dict_row

from shared.db import make_async_pool, make_pool
from shared.settings import Settings
from shared.state import delta_history
from shared.state.savers import FencedPostgresSaver, StatePostgresSaver
from tests.integration.test_s3_checkpoint_reads import rows_touched


def _concat(state: list[str], writes: Sequence[list[str]]) -> list[str]:
    """A batching-invariant reducer over lists of strings."""
    out = list(state)
    for w in writes:
        out = operator.add(out, list(w))
    return out


def graph(snapshot_frequency: int) -> Any:
    """A one-node graph whose `items` is a DeltaChannel (`snapshot_frequency`)."""

    channel = DeltaChannel(_concat, snapshot_frequency=snapshot_frequency)
    # The functional form: its annotations are evaluated here, with `channel` in scope.
    state_type = TypedDict(  # type: ignore[misc]  # noqa: UP013
        "State", {"items": Annotated[list[str], channel], "n": int}
    )

    def step(state: dict[str, Any]) -> dict[str, Any]:
        return {"items": [f"item {state.get('n', 0)}"], "n": state.get("n", 0) + 1}

    builder = StateGraph(state_type)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    return builder


class Reads:
    """Counts the stage-1 rows and pages of our history reads (`Walk.ingest`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows: list[int] = []
        original = delta_history.Walk.ingest

        def counted(walk: delta_history.Walk, page: Sequence[Any]) -> str | None:
            self.rows.append(len(page))
            return original(walk, page)

        monkeypatch.setattr(delta_history.Walk, "ingest", counted)


async def _async_case(
    settings: Settings, snapshot_frequency: int, saver_every: int, turns: int, reads: Reads
) -> tuple[int, list[int]]:
    """`turns` invocations of `graph(snapshot_frequency)` on a saver whose pages are sized for
    `saver_every`; every checkpoint's history checked against LangGraph's; (the thread's
    checkpoints, the rows of each page of the head's history read)."""
    pool = await make_async_pool(settings, name="test-delta-history", max_size=2)
    try:
        saver = FencedPostgresSaver(pool, mode="delta", snapshot_every=saver_every)
        app = graph(snapshot_frequency).compile(checkpointer=saver)
        tid = str(uuid.uuid4())
        cfg = {"configurable": {"thread_id": tid}}
        for i in range(turns):
            await app.ainvoke({"items": [f"input {i}"]}, cfg)
        tuples = [t async for t in saver.alist(cfg)]
        assert len(tuples) >= 2 * turns
        for tup in tuples:
            target = tup.config
            ours = await saver.aget_delta_channel_history(config=target, channels=["items"])
            theirs = await AsyncPostgresSaver.aget_delta_channel_history(
                saver, config=target, channels=["items"]
            )
            assert ours == theirs, target
        reads.rows.clear()
        await saver.aget_delta_channel_history(config=cfg, channels=["items"])  # the head
        head_pages = list(reads.rows)
        state = await app.aget_state(cfg)
        assert len(state.values["items"]) == 2 * turns
        return len(tuples), head_pages
    finally:
        await pool.close()


def test_s4_delta_history_matches_langgraph_and_reads_one_short_page(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S4: with a snapshot every 3 updates, every checkpoint's history equals LangGraph's,
    and the head's is read in one page of `first_page(3)` rows, not the thread's whole
    history (LangGraph's page is 1,024 rows: all of a young thread's checkpoints)."""
    reads = Reads(monkeypatch)
    checkpoints, head_pages = asyncio.run(_async_case(settings, 3, 3, 30, reads))
    size = delta_history.first_page(3)
    assert checkpoints > 2 * size
    assert head_pages == [size]


def test_s4_delta_history_walks_to_the_root_over_growing_pages(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S4: a channel whose snapshot is further than the first page (here none at all: a
    saver sized for K=1 on a graph snapshotting every 1,000) is still rebuilt whole: the
    walk pages on, doubling, to the root, and gives LangGraph's result."""
    reads = Reads(monkeypatch)
    checkpoints, head_pages = asyncio.run(_async_case(settings, 1000, 1, 25, reads))
    assert len(head_pages) >= 2, head_pages
    assert sum(head_pages) == checkpoints
    assert head_pages[1] == min(delta_history.PAGE_MAX, 2 * head_pages[0])


def test_s4_sync_delta_history_matches_langgraph(settings: Settings) -> None:
    """S4: the web's sync saver reads the same history as LangGraph's sync saver, with
    snapshots and without."""
    pool = make_pool(settings, name="test-delta-history-sync", max_size=2)
    try:
        for every in (2, 1000):
            saver = StatePostgresSaver(pool, mode="delta", snapshot_every=2)
            app = graph(every).compile(checkpointer=saver)
            cfg = {"configurable": {"thread_id": str(uuid.uuid4())}}
            for i in range(20):
                app.invoke({"items": [f"input {i}"]}, cfg)
            for tup in list(saver.list(cfg)):  # list() holds the saver lock till done
                ours = saver.get_delta_channel_history(config=tup.config, channels=["items"])
                theirs = PostgresSaver.get_delta_channel_history(
                    saver, config=tup.config, channels=["items"]
                )
                assert ours == theirs
            assert len(app.get_state(cfg).values["items"]) == 40
    finally:
        pool.close()


def test_s4_delta_history_page_probes_blobs_by_primary_key(settings: Settings) -> None:
    """S4: the history page's blob probe (`delta_history.stage1_sql`) returns LangGraph's rows
    and touches at most one `checkpoint_blobs` row per checkpoint of the page, before and after
    ANALYZE; LangGraph's `EXISTS`, once analyzed, scans the channel's blobs of every thread."""
    pool = make_pool(settings, name="test-delta-history-probe", max_size=2)
    try:
        saver = StatePostgresSaver(pool, mode="delta", snapshot_every=10)
        app = graph(10).compile(checkpointer=saver)
        tid = str(uuid.uuid4())
        cfg = {"configurable": {"thread_id": tid}}
        for i in range(60):
            app.invoke({"items": [f"input {i}"]}, cfg)
        head = saver.get_tuple(cfg)
        assert head is not None
        size = delta_history.first_page(10)
        params = ["items"] * 4 + [tid, "", head.config["configurable"]["checkpoint_id"], size]
        ours = delta_history.stage1_sql(["items"], include_cursor=True)
        theirs = _build_delta_stage1_sql(["items"], paged=True, include_cursor=True)
        with psycopg.connect(settings.dsn, autocommit=True, row_factory=dict_row) as conn:
            for analyzed in (False, True):
                if analyzed:
                    conn.execute("ANALYZE checkpoint_blobs")
                rows = conn.execute(ours, params).fetchall()
                assert rows == conn.execute(theirs, params).fetchall()
                assert len(rows) == size and any(r["hb_0"] for r in rows)
                touched = rows_touched(conn, ours, tuple(params), "checkpoint_blobs")
                assert touched <= size, (analyzed, touched)
    finally:
        pool.close()
