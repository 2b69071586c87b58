"""The state accessor's thread-level methods on the real Postgres saver: the heads of many
threads in one query (`values` and `interrupts` of thread objects), a thread's whole history
copied to a new id, and `keep_latest` pruning (S5: all through `CheckpointStateAccessor`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.pregel import Pregel
from langgraph.types import Command

from shared import serde
from shared.agent.lead_agent import build_lead_agent
from shared.db import DictPool, make_pool
from shared.errors import ValidationFailed
from shared.settings import Settings
from shared.state.accessor import CheckpointStateAccessor
from shared.state.modes import CheckpointMode
from shared.state.savers import StatePostgresSaver
from tests.graphs import approval


class _Registry:
    def __init__(self, graphs: dict[str, Pregel]) -> None:
        self._graphs = graphs

    def get(self, graph_id: str) -> Pregel:
        return self._graphs[graph_id]


class Env:
    """The web's accessor in one checkpoint mode, and the same graphs bound to its saver for
    running turns (what a worker does)."""

    def __init__(self, settings: Settings, pool: DictPool, mode: CheckpointMode, ws: Path) -> None:
        s = settings.model_copy(update={"checkpoint_mode": mode, "checkpoint_snapshot_every": 3})
        graphs: dict[str, Pregel] = {"lead_agent": build_lead_agent(s), "approval": approval.graph}
        self.saver = StatePostgresSaver(pool, mode=mode)
        self.accessor = CheckpointStateAccessor(self.saver, _Registry(graphs))  # type: ignore[arg-type]
        self.bound = {k: g.copy(update={"checkpointer": self.saver}) for k, g in graphs.items()}
        self.ws = ws

    def turn(self, thread_id: str, text: str) -> None:
        cfg = {"configurable": {"thread_id": thread_id, "workspace_dir": self.ws, "tokens": 4}}
        self.bound["lead_agent"].invoke({"messages": [{"role": "user", "content": text}]}, cfg)

    def ask(self, thread_id: str, resume: Any = None) -> None:
        cfg = {"configurable": {"thread_id": thread_id}}
        arg = Command(resume=resume) if resume is not None else {"messages": [("user", "go")]}
        self.bound["approval"].invoke(arg, cfg)

    def history(self, thread_id: str) -> list[dict[str, Any]]:
        page = self.accessor.history(
            thread_id, "lead_agent", limit=1000, before=None, metadata=None, checkpoint=None
        )
        return list(serde.loads(page.body()))

    def texts(self, thread_id: str, graph_id: str = "lead_agent") -> list[str]:
        values = self.accessor.get(thread_id, graph_id)["values"]
        return [m["content"] for m in values.get("messages", [])]


@pytest.fixture
def pool(settings: Settings) -> Iterator[DictPool]:
    p = make_pool(settings, name="test-heads", max_size=4)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(params=["full", "delta"])
def env(request: pytest.FixtureRequest, settings: Settings, pool: DictPool, tmp_path: Path) -> Env:
    return Env(settings, pool, request.param, tmp_path)


def new_id() -> str:
    return str(uuid.uuid4())


def test_s5_heads_are_each_threads_state_in_one_query(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S5: `heads` gives each thread's head values and pending interrupts (by task id) exactly
    as `get` does, for a page of threads, reading the heads in one query: no per-thread
    `get_tuple`. A thread with no checkpoint or no graph has no head."""
    ran, paused, never, no_graph = new_id(), new_id(), new_id(), new_id()
    env.turn(ran, "hello")
    env.turn(ran, "again")
    env.ask(paused)
    env.turn(no_graph, "hidden")
    per_thread_reads = 0
    original = PostgresSaver.get_tuple

    def counting(self: PostgresSaver, config: Any) -> Any:
        nonlocal per_thread_reads
        per_thread_reads += 1
        return original(self, config)

    monkeypatch.setattr(PostgresSaver, "get_tuple", counting)
    heads = env.accessor.heads(
        {ran: "lead_agent", paused: "approval", never: "lead_agent", no_graph: None}
    )
    assert per_thread_reads == 0
    assert set(heads) == {ran, paused}
    assert heads[ran].values == env.accessor.get(ran, "lead_agent")["values"]
    assert [m["content"] for m in heads[ran].values["messages"]][0::2] == ["hello", "again"]
    assert heads[ran].interrupts == {}
    state = env.accessor.get(paused, "approval")
    (task,) = state["tasks"]
    assert heads[paused].interrupts == {task["id"]: task["interrupts"]}
    (question,) = heads[paused].interrupts[task["id"]]
    assert question["value"] == approval.QUESTION and question["id"]
    assert heads[paused].values == state["values"]
    assert env.accessor.heads({}) == {} and env.accessor.heads({never: "lead_agent"}) == {}


def test_s5_copy_thread_copies_the_whole_history_and_then_diverges(env: Env) -> None:
    """S5: the copy has the source's every checkpoint (same ids, values, metadata), its
    pending writes (a paused copy resumes on its own) and continues independently."""
    source, paused = new_id(), new_id()
    for i in range(4):
        env.turn(source, f"turn {i}")
    env.ask(paused)
    copy, paused_copy = new_id(), new_id()
    env.accessor.copy_thread(source, copy)
    env.accessor.copy_thread(paused, paused_copy)

    def ids(history: list[dict[str, Any]]) -> list[Any]:
        return [(h["checkpoint_id"], h["values"], h["next"]) for h in history]

    assert ids(env.history(copy)) == ids(env.history(source))
    assert all(h["checkpoint"]["thread_id"] == copy for h in env.history(copy))
    env.turn(copy, "only on the copy")
    assert env.texts(copy)[-2] == "only on the copy"
    assert "only on the copy" not in env.texts(source)
    env.turn(source, "only on the source")
    assert "only on the source" not in env.texts(copy)
    assert env.accessor.heads({paused_copy: "approval"})[paused_copy].interrupts
    env.ask(paused_copy, resume="yes")
    assert env.texts(paused_copy, "approval") == ["go", "approved: yes"]
    assert env.accessor.heads({paused: "approval"})[paused].interrupts  # source still waits


def test_s5_keep_latest_keeps_only_the_head(
    settings: Settings, pool: DictPool, tmp_path: Path
) -> None:
    """S5: `keep_latest` leaves one checkpoint with the same values, a paused thread still
    waiting on its interrupt (pending writes kept), other threads untouched."""
    env = Env(settings, pool, "full", tmp_path)
    pruned, paused, other = new_id(), new_id(), new_id()
    for i in range(3):
        env.turn(pruned, f"turn {i}")
        env.turn(other, f"turn {i}")
    env.ask(paused)
    before = env.accessor.get(pruned, "lead_agent")
    other_history = len(env.history(other))
    env.accessor.keep_latest([pruned, paused])
    (head,) = env.history(pruned)
    assert head["values"] == before["values"] and head["checkpoint_id"] == before["checkpoint_id"]
    assert len(env.history(other)) == other_history > 1
    assert env.accessor.heads({paused: "approval"})[paused].interrupts
    env.ask(paused, resume="ok")
    assert env.texts(paused, "approval") == ["go", "approved: ok"]
    env.turn(pruned, "after the prune")
    assert env.texts(pruned)[-2] == "after the prune"
    with psycopg.connect(settings.dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM checkpoint_writes w WHERE w.thread_id = %s AND NOT EXISTS"
            " (SELECT 1 FROM checkpoints c WHERE c.thread_id = w.thread_id"
            "  AND c.checkpoint_id = w.checkpoint_id)",
            (pruned,),
        ).fetchone()
    assert row == (0,)


def test_s5_keep_latest_refuses_delta_threads(
    settings: Settings, pool: DictPool, tmp_path: Path
) -> None:
    """S4/S5: a delta thread's messages are rebuilt from older checkpoints, so keep_latest
    refuses it (422 naming `strategy`) and prunes nothing."""
    env = Env(settings, pool, "delta", tmp_path)
    tid = new_id()
    for i in range(4):
        env.turn(tid, f"turn {i}")
    n = len(env.history(tid))
    with pytest.raises(ValidationFailed) as err:
        env.accessor.keep_latest([tid])
    assert err.value.field == "strategy"
    assert len(env.history(tid)) == n
