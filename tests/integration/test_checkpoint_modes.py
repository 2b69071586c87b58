"""S4/S5 on the real Postgres saver: full and delta modes, the mismatch in both directions, a
full -> delta migration of a live thread, the database's mode record, and rollback as a new
linear head checkpoint."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command, interrupt
from psycopg.rows import dict_row

from shared.agent.lead_agent import build_lead_agent
from shared.db import make_async_pool, make_pool
from shared.errors import Conflict
from shared.settings import Settings
from shared.state.accessor import CheckpointStateAccessor
from shared.state.modes import (
    METADATA_KEY,
    CheckpointMode,
    CheckpointModeMismatch,
    CheckpointModeRecordMismatch,
    ensure_recorded_mode,
    migrate_recorded_mode,
    thread_state_schema,
)
from shared.state.savers import FencedPostgresSaver, StatePostgresSaver
from tests.conftest import private_settings


class _Registry:
    """The one method of GraphRegistry the accessor uses, over graphs built per mode."""

    def __init__(self, graphs: dict[str, Pregel]) -> None:
        self._graphs = graphs

    def get(self, graph_id: str) -> Pregel:
        return self._graphs[graph_id]


def agent(settings: Settings, mode: CheckpointMode, every: int = 3) -> Pregel:
    s = settings.model_copy(update={"checkpoint_mode": mode, "checkpoint_snapshot_every": every})
    return build_lead_agent(s)


class Env:
    """A mode's async saver, its accessor and the lead agent bound to it."""

    def __init__(self, settings: Settings, pool: Any, mode: CheckpointMode, ws: Path) -> None:
        self.saver = FencedPostgresSaver(pool, mode=mode)
        graph = agent(settings, mode)
        self.accessor = CheckpointStateAccessor(self.saver, _Registry({"lead_agent": graph}))  # type: ignore[arg-type]
        self.graph = graph.copy(update={"checkpointer": self.saver})
        self.ws = ws

    async def turn(self, thread_id: str, text: str) -> None:
        cfg = {"configurable": {"thread_id": thread_id, "workspace_dir": self.ws, "tokens": 4}}
        await self.graph.ainvoke({"messages": [{"role": "user", "content": text}]}, cfg)

    async def values(self, thread_id: str) -> dict[str, Any]:
        return dict((await self.accessor.aget_snapshot(thread_id, "lead_agent")).values)

    async def history(self, thread_id: str) -> list[Any]:
        cfg = {"configurable": {"thread_id": thread_id}}
        return [t async for t in self.saver.alist(cfg)]


def with_envs(
    settings: Settings, tmp_path: Path, fn: Callable[[Env, Env], Awaitable[None]]
) -> None:
    async def go() -> None:
        pool = await make_async_pool(settings, name="test-modes", max_size=4)
        try:
            await fn(Env(settings, pool, "full", tmp_path), Env(settings, pool, "delta", tmp_path))
        finally:
            await pool.close()

    asyncio.run(go())


def texts(values: dict[str, Any]) -> list[str]:
    return [m.content for m in values.get("messages", [])]


def test_s4_delta_graph_uses_a_delta_channel_for_messages(settings: Settings) -> None:
    """S4: the mode is fixed when the graph is built; delta makes `messages` a DeltaChannel
    with the configured snapshot frequency, middleware channels and all."""
    full, delta = agent(settings, "full"), agent(settings, "delta", every=7)
    assert not isinstance(full.channels["messages"], DeltaChannel)
    ch = delta.channels["messages"]
    assert isinstance(ch, DeltaChannel) and ch.snapshot_frequency == 7
    assert set(full.channels) == set(delta.channels)


def test_s4_checkpoints_are_stamped_and_delta_writes_less(
    settings: Settings, tmp_path: Path
) -> None:
    """S4: every checkpoint records the mode that wrote it; the same conversation has the same
    values in both modes, and delta stores fewer message bytes."""

    async def scenario(full: Env, delta: Env) -> None:
        tf, td = str(uuid.uuid4()), str(uuid.uuid4())
        for i in range(6):
            await full.turn(tf, f"turn {i}")
            await delta.turn(td, f"turn {i}")
        assert texts(await full.values(tf)) == texts(await delta.values(td))
        assert len(texts(await delta.values(td))) >= 12
        assert {t.metadata[METADATA_KEY] for t in await full.history(tf)} == {"full"}
        assert {t.metadata[METADATA_KEY] for t in await delta.history(td)} == {"delta"}
        with psycopg.connect(settings.dsn) as conn:
            size = {
                tid: conn.execute(
                    "SELECT coalesce(sum(length(blob)), 0) FROM checkpoint_blobs"
                    " WHERE thread_id = %s AND channel = 'messages'",
                    (tid,),
                ).fetchone()[0]  # type: ignore[index]
                for tid in (tf, td)
            }
        assert size[td] < size[tf] / 2, size

    with_envs(settings, tmp_path, scenario)


def test_s4_full_process_refuses_delta_checkpoints(settings: Settings, tmp_path: Path) -> None:
    """S4: a full process reading a delta thread gets CheckpointModeMismatch (HTTP 409,
    code checkpoint_mode_mismatch), never an empty conversation — async and sync savers."""

    async def scenario(full: Env, delta: Env) -> None:
        tid = str(uuid.uuid4())
        await delta.turn(tid, "hello")
        await delta.turn(tid, "again")
        with pytest.raises(CheckpointModeMismatch) as err:
            await full.accessor.ahead_id(tid)
        assert err.value.code == "checkpoint_mode_mismatch"
        with pytest.raises(CheckpointModeMismatch):
            await full.values(tid)
        with pytest.raises(CheckpointModeMismatch):
            await full.turn(tid, "must not write")  # refuses before writing on top
        assert len(texts(await delta.values(tid))) == 4  # untouched

        pool = make_pool(settings, name="test-modes-sync", max_size=2)
        try:
            web = CheckpointStateAccessor(
                StatePostgresSaver(pool, mode="full"),
                _Registry({"lead_agent": agent(settings, "full")}),  # type: ignore[arg-type]
            )
            with pytest.raises(CheckpointModeMismatch):
                web.get(tid, "lead_agent")
            with pytest.raises(CheckpointModeMismatch):
                web.history(
                    tid, "lead_agent", limit=10, before=None, metadata=None, checkpoint=None
                )
        finally:
            pool.close()

    with_envs(settings, tmp_path, scenario)


def test_s4_delta_process_continues_a_full_thread(settings: Settings, tmp_path: Path) -> None:
    """S4 migration direction: a live thread written in full mode continues in delta mode
    with every message intact; from then on a full process refuses it."""

    async def scenario(full: Env, delta: Env) -> None:
        tid = str(uuid.uuid4())
        for i in range(3):
            await full.turn(tid, f"full {i}")
        before = texts(await full.values(tid))
        assert texts(await delta.values(tid)) == before  # delta reads full
        for i in range(4):  # past the snapshot frequency (3)
            await delta.turn(tid, f"delta {i}")
        after = texts(await delta.values(tid))
        assert after[: len(before)] == before and len(after) == len(before) + 8
        assert (await delta.history(tid))[0].metadata[METADATA_KEY] == "delta"
        with pytest.raises(CheckpointModeMismatch):
            await full.values(tid)

    with_envs(settings, tmp_path, scenario)


def test_s4_database_records_the_mode_and_refuses_other_processes(
    settings: Settings, redis_url: str, template_database: str
) -> None:
    """S4: the first process records its mode; a process with another mode or frequency
    refuses to start with a message saying how to migrate; only full -> delta is allowed."""
    with (
        private_settings(settings, redis_url, template_database) as s,
        psycopg.connect(s.dsn, autocommit=True, row_factory=dict_row) as conn,
    ):
        ensure_recorded_mode(conn, s)  # full, 10: recorded
        ensure_recorded_mode(conn, s)  # same settings: fine
        delta = s.model_copy(update={"checkpoint_mode": "delta"})
        with pytest.raises(CheckpointModeRecordMismatch, match="migrate --to delta"):
            ensure_recorded_mode(conn, delta)
        with pytest.raises(CheckpointModeRecordMismatch):
            ensure_recorded_mode(conn, s.model_copy(update={"checkpoint_snapshot_every": 5}))
        assert "full -> delta" in migrate_recorded_mode(conn, "delta", 10)
        ensure_recorded_mode(conn, delta)
        with pytest.raises(CheckpointModeRecordMismatch):
            ensure_recorded_mode(conn, s)  # a full process is now refused
        with pytest.raises(CheckpointModeRecordMismatch, match="not supported"):
            migrate_recorded_mode(conn, "full", 10)


@pytest.mark.parametrize("mode", ["full", "delta"])
def test_s5_rollback_is_a_new_linear_head_equal_to_the_pre_run_state(
    settings: Settings, tmp_path: Path, mode: str
) -> None:
    """S5, R5: after a run that wrote several checkpoints, rollback writes one new head whose
    values equal the pre-run state; its parent is the old head (history stays linear), it
    records what it undid, and the thread goes on from the restored state."""

    async def scenario(full: Env, delta: Env) -> None:
        env = full if mode == "full" else delta
        tid = str(uuid.uuid4())
        await env.turn(tid, "before")
        pre_id = await env.accessor.ahead_id(tid)
        pre = await env.values(tid)
        for i in range(4):  # the run to undo: many checkpoints, an artifact, new messages
            await env.turn(tid, f"undo {i}")
        old_head = await env.accessor.ahead_id(tid)
        n_before = len(await env.history(tid))
        new_id = await env.accessor.arollback(
            tid, "lead_agent", pre_id, metadata={"threadrun_rollback_of": "run-x"}
        )
        assert new_id is not None and new_id not in (pre_id, old_head)
        restored = await env.values(tid)
        assert texts(restored) == texts(pre)
        assert restored.get("artifacts", []) == pre.get("artifacts", [])
        hist = await env.history(tid)
        assert len(hist) == n_before + 1
        head = hist[0]
        assert head.checkpoint["id"] == new_id
        assert head.parent_config["configurable"]["checkpoint_id"] == old_head  # type: ignore[index]
        assert head.metadata["threadrun_rollback_of"] == "run-x"
        assert head.metadata[METADATA_KEY] == mode
        snap = await env.accessor.aget_snapshot(tid, "lead_agent")
        assert snap.next == ()  # no agent node was started or scheduled
        await env.turn(tid, "after")
        assert texts(await env.values(tid))[: len(texts(pre)) + 1] == [*texts(pre), "after"]
        # Nothing written since the target: nothing to do.
        again = await env.accessor.ahead_id(tid)
        assert await env.accessor.arollback(tid, "lead_agent", again) is None

    with_envs(settings, tmp_path, scenario)


def test_s5_rollback_of_a_first_run_empties_the_thread(settings: Settings, tmp_path: Path) -> None:
    """R5: the pre-run state of a thread's first run is the empty thread."""

    async def scenario(full: Env, delta: Env) -> None:
        tid = str(uuid.uuid4())
        await full.turn(tid, "first")
        assert await full.accessor.arollback(tid, "lead_agent", None) is not None
        values = await full.values(tid)
        assert texts(values) == [] and not values.get("artifacts")

    with_envs(settings, tmp_path, scenario)


@pytest.mark.parametrize("mode", ["full", "delta"])
def test_s5_rollback_restores_a_paused_thread_with_next_and_pending_writes(
    settings: Settings, mode: CheckpointMode
) -> None:
    """S5, R5: the pre-run state of a resume run is a paused thread: one task waiting on an
    interrupt, a parallel task already finished (its writes pending on the checkpoint).
    After the resume run is rolled back, the same task is next, the same interrupt waits,
    and resuming again does not re-run the finished task (its pending writes came back)."""
    ran: list[str] = []

    def fast(state: dict[str, Any]) -> dict[str, Any]:
        ran.append("fast")
        return {"messages": [AIMessage(content="fast done")]}

    def ask(state: dict[str, Any]) -> dict[str, Any]:
        answer = interrupt("approve?")
        return {"messages": [AIMessage(content=f"answer: {answer}")]}

    async def scenario() -> None:
        pool = await make_async_pool(settings, name="test-paused", max_size=2)
        try:
            saver = FencedPostgresSaver(pool, mode=mode)
            b: StateGraph[Any] = StateGraph(thread_state_schema(mode, 3))
            b.add_node("fast", fast)
            b.add_node("ask", ask)
            b.add_edge(START, "fast")
            b.add_edge(START, "ask")
            b.add_edge("fast", END)
            b.add_edge("ask", END)
            graph = b.compile()
            accessor = CheckpointStateAccessor(saver, _Registry({"g": graph}))  # type: ignore[arg-type]
            bound = graph.copy(update={"checkpointer": saver})
            cfg = {"configurable": {"thread_id": str(uuid.uuid4())}}
            tid = cfg["configurable"]["thread_id"]
            await bound.ainvoke({"messages": [{"role": "user", "content": "go"}]}, cfg)
            paused = await accessor.aget_snapshot(tid, "g")
            assert paused.next == ("ask",) and len(paused.interrupts) == 1
            pre_id, recorded = await accessor.arollback_point(tid)  # as the executor does
            recorded = json.loads(json.dumps(recorded))  # through the runs row (jsonb)
            await bound.ainvoke(Command(resume="yes"), cfg)  # the run to undo
            done = await accessor.aget_snapshot(tid, "g")
            assert done.next == () and "answer: yes" in texts(done.values)
            assert ran == ["fast"]
            # The resume wrote onto the pre-run checkpoint itself: its pending writes now
            # hold the answer, so only the copy taken at run start restores the pause.
            await accessor.arollback(
                tid, "g", pre_id, pending_writes=accessor.load_writes(recorded)
            )
            again = await accessor.aget_snapshot(tid, "g")
            assert again.next == ("ask",)
            assert [i.value for i in again.interrupts] == ["approve?"]
            assert texts(again.values) == texts(paused.values)
            await bound.ainvoke(Command(resume="no"), cfg)
            final = await accessor.aget_snapshot(tid, "g")
            assert sorted(texts(final.values)) == sorted(["go", "fast done", "answer: no"])
            assert ran == ["fast"]  # restored from its pending writes, not run again
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_s5_replace_goes_through_the_state_only_graph(settings: Settings) -> None:
    """S5, C2: a state replacement (the compaction commit) is a new linear head written
    through the state-only graph: no node starts and nothing is scheduled, the thread goes on
    normally; a thread paused on an interrupt is refused (409) rather than silently unpaused."""

    def ask(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"answer: {interrupt('approve?')}")]}

    b: StateGraph[Any] = StateGraph(thread_state_schema("full", 3))
    b.add_node("ask", ask)
    b.add_edge(START, "ask")
    b.add_edge("ask", END)
    graph = b.compile()
    pool = make_pool(settings, name="test-replace", max_size=2)
    try:
        saver = StatePostgresSaver(pool, mode="full")
        accessor = CheckpointStateAccessor(saver, _Registry({"g": graph}))  # type: ignore[arg-type]
        bound = graph.copy(update={"checkpointer": saver})
        tid = str(uuid.uuid4())
        cfg = {"configurable": {"thread_id": tid}}
        bound.invoke({"messages": [{"role": "user", "content": "go"}]}, cfg)
        paused = accessor.get(tid, "g")
        assert paused["next"] == ["ask"]
        with pytest.raises(Conflict, match="paused before ask"):
            accessor.replace(tid, "g", {"summary_text": "no"})
        assert accessor.get(tid, "g")["checkpoint_id"] == paused["checkpoint_id"]
        bound.invoke(Command(resume="yes"), cfg)
        before = accessor.get(tid, "g")
        out = accessor.replace(tid, "g", {"summary_text": "the user said go"})
        after = accessor.get(tid, "g")
        assert after["checkpoint_id"] == out["checkpoint"]["checkpoint_id"]
        assert after["parent_checkpoint"]["checkpoint_id"] == before["checkpoint_id"]
        assert after["values"]["summary_text"] == "the user said go"
        assert after["values"]["messages"] == before["values"]["messages"]
        assert after["next"] == []
        bound.invoke({"messages": [{"role": "user", "content": "again"}]}, cfg)
        assert accessor.get(tid, "g")["next"] == ["ask"]  # the graph runs on from the new head
    finally:
        pool.close()
