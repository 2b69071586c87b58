"""L2 for checkpoints: a stale attempt's checkpoint writes are refused, atomically with the
write, by the epoch fence of FencedPostgresSaver."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from shared.agent.lead_agent import build_lead_agent
from shared.db import make_async_pool, make_pool
from shared.errors import LeaseLost
from shared.runs.leases import lease_value
from shared.runs.store import RunStore
from shared.settings import Settings
from shared.state.savers import (
    FENCE_SQL,
    HEAD_KEY,
    LEASE_KEY,
    RUN_KEY,
    FencedPostgresSaver,
    ReadHead,
)
from tests.conftest import claimed_run


def _config(tid: str, run_id: str, epoch: int, owner: str, ws: Path) -> dict[str, Any]:
    return {
        "configurable": {
            "thread_id": tid,
            "workspace_dir": ws,
            "tokens": 3,
            RUN_KEY: run_id,
            LEASE_KEY: lease_value(epoch, owner),
        }
    }


def _hi(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def test_l2_stale_attempt_cannot_write_a_checkpoint(settings: Settings, tmp_path: Path) -> None:
    """L2: once the run is re-claimed by a newer epoch, the old attempt's next checkpoint write
    raises LeaseLost and the thread's checkpoints stay exactly as the new owner left them."""
    pool = make_pool(settings, name="test-fence-store", max_size=2)
    store = RunStore(pool)
    tid, run_id, old_epoch = claimed_run(store, "old")

    async def scenario() -> None:
        apool = await make_async_pool(settings, name="test-fenced", max_size=2)
        try:
            saver = FencedPostgresSaver(apool, mode="full")
            graph = build_lead_agent(settings).copy(update={"checkpointer": saver})
            old = _config(tid, run_id, old_epoch, "old", tmp_path)
            await graph.ainvoke(_hi("hi"), old)
            written = [c async for c in saver.alist({"configurable": {"thread_id": tid}})]
            assert written
            # The reaper requeues the run and another worker claims it: epoch + 1.
            assert await asyncio.to_thread(store.requeue, run_id, old_epoch, "test")
            claim = await asyncio.to_thread(store.claim, run_id, "new")
            assert claim.run is not None
            new_epoch = claim.run.owner_epoch
            assert new_epoch == old_epoch + 1
            with pytest.raises(LeaseLost):
                await graph.ainvoke(_hi("again"), old)
            after = [c async for c in saver.alist({"configurable": {"thread_id": tid}})]
            assert [c.checkpoint["id"] for c in after] == [c.checkpoint["id"] for c in written]
            # The current owner writes normally.
            await graph.ainvoke(_hi("ok"), _config(tid, run_id, new_epoch, "new", tmp_path))
            final = [c async for c in saver.alist({"configurable": {"thread_id": tid}})]
            assert len(final) > len(written)
        finally:
            await apool.close()

    try:
        asyncio.run(scenario())
    finally:
        pool.close()


def test_l2_checkpoint_fence_has_no_window(settings: Settings, tmp_path: Path) -> None:
    """L2: the epoch check and the checkpoint write are one transaction. A write that starts
    while a re-claim is committing (the run row locked, the epoch about to change) waits for
    it and is then refused — it can never land just after the epoch moved on."""
    pool = make_pool(settings, name="test-fence-store2", max_size=2)
    store = RunStore(pool)
    tid, run_id, epoch = claimed_run(store, "old")
    locked, release = threading.Event(), threading.Event()

    def reclaim_slowly() -> None:
        with psycopg.connect(settings.dsn) as conn:  # one transaction, committed on exit
            conn.execute(
                "UPDATE runs SET owner_epoch = owner_epoch + 1, owner = 'new' WHERE run_id = %s",
                (run_id,),
            )
            locked.set()
            release.wait(10)

    async def scenario() -> None:
        apool = await make_async_pool(settings, name="test-fenced2", max_size=2)
        try:
            saver = FencedPostgresSaver(apool, mode="full")
            graph = build_lead_agent(settings).copy(update={"checkpointer": saver})
            t = threading.Thread(target=reclaim_slowly)
            t.start()
            assert locked.wait(10)
            write = asyncio.create_task(
                graph.ainvoke(_hi("racing"), _config(tid, run_id, epoch, "old", tmp_path))
            )
            await asyncio.sleep(0.5)
            assert not write.done()  # blocked on the row the re-claim holds
            release.set()
            with pytest.raises(LeaseLost):
                await write
            t.join(10)
            assert [c async for c in saver.alist({"configurable": {"thread_id": tid}})] == []
        finally:
            await apool.close()

    try:
        asyncio.run(scenario())
    finally:
        pool.close()


def test_l2_a_frozen_writer_does_not_hold_the_run_row(settings: Settings) -> None:
    """L2, L4: a writer frozen inside its fenced transaction (it holds the run row FOR SHARE)
    makes the reaper's requeue give up quickly (lock_timeout) instead of hanging the pass, and
    PostgreSQL ends the frozen session after the idle timeout, so the next try succeeds and
    the thawed writer's transaction can no longer commit."""
    pool = make_pool(settings, name="test-fence-frozen", max_size=2)
    store = RunStore(pool)
    _tid, run_id, epoch = claimed_run(store, "frozen")
    frozen = psycopg.connect(settings.dsn)
    try:
        frozen.execute(FENCE_SQL, ("1000ms", run_id, epoch))  # BEGIN + fence, then silence
        with pytest.raises(psycopg.errors.LockNotAvailable):
            store.requeue(run_id, epoch, "reaper", lock_timeout_s=0.2)
        deadline = time.monotonic() + 10
        while True:  # the server ends the idle session after ~1 s
            try:
                assert store.requeue(run_id, epoch, "reaper", lock_timeout_s=0.2)
                break
            except psycopg.errors.LockNotAvailable:
                assert time.monotonic() < deadline, "the frozen session was never ended"
                time.sleep(0.2)
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            frozen.commit()
    finally:
        frozen.close()
        pool.close()


def test_r5_the_graph_starts_from_the_head_read_for_the_rollback_point(
    settings: Settings, tmp_path: Path
) -> None:
    """R5: the head checkpoint an attempt reads for its rollback point is the one its graph
    starts from (ReadHead, handed over under HEAD_KEY): the graph's first read of the root
    head takes it without a query; any later read, and a read of a given checkpoint, queries."""
    pool = make_pool(settings, name="test-read-head-store", max_size=2)
    store = RunStore(pool)
    tid, run_id, epoch = claimed_run(store, "w")

    async def scenario() -> None:
        apool = await make_async_pool(settings, name="test-read-head", max_size=2)
        try:
            saver = FencedPostgresSaver(apool, mode="full")
            graph = build_lead_agent(settings).copy(update={"checkpointer": saver})
            config = _config(tid, run_id, epoch, "w", tmp_path)
            await graph.ainvoke(_hi("first"), config)
            root = {"configurable": {"thread_id": tid}}
            head = await saver.aget_tuple(root)
            assert head is not None
            queried: list[dict[str, Any]] = []
            upstream = AsyncPostgresSaver.aget_tuple

            async def counting(self: AsyncPostgresSaver, cfg: Any) -> Any:
                queried.append(dict(cfg.get("configurable") or {}))
                return await upstream(self, cfg)

            AsyncPostgresSaver.aget_tuple = counting  # type: ignore[method-assign]
            try:
                held = ReadHead(head)
                await graph.ainvoke(
                    _hi("second"),
                    {**config, "configurable": {**config["configurable"], HEAD_KEY: held}},
                )
                assert queried == [], "the graph read the head again"
                # One-shot: a second read of the root head queries.
                assert held.take(root) == (False, None)
                given = {"configurable": {"thread_id": tid, "checkpoint_id": head.checkpoint["id"]}}
                assert ReadHead(head).take(given) == (False, None)
                sub = {"configurable": {"thread_id": tid, "checkpoint_ns": "child"}}
                assert ReadHead(head).take(sub) == (False, None)
            finally:
                AsyncPostgresSaver.aget_tuple = upstream  # type: ignore[method-assign]
            states = [c async for c in saver.alist(root)]
            # The second run continued the first conversation (it started from that head).
            newest = states[0].checkpoint["channel_values"]["messages"]
            texts = [m.content for m in newest if m.type == "human"]
            assert texts == ["first", "second"]
        finally:
            await apool.close()

    try:
        asyncio.run(scenario())
    finally:
        pool.close()
