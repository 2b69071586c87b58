"""L2/L5 with held pending writes (shared/state/held_writes.py) on real PostgreSQL: a task's
writes commit in the transaction of the checkpoint that follows them, with the same rows as
when written at once; writes no checkpoint follows (an interrupt) are written by `flush`;
a step whose other task runs on does not keep them past the linger; a stale attempt writes
none of them."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from shared.db import make_async_pool, make_pool
from shared.errors import LeaseLost
from shared.runs.leases import lease_value
from shared.runs.store import RunStore
from shared.settings import Settings
from shared.state.held_writes import HeldWrites
from shared.state.savers import HELD_WRITES_KEY, LEASE_KEY, RUN_KEY, FencedPostgresSaver
from tests.conftest import claimed_run


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(*, ask: bool = False, slow_s: float = 0.0) -> StateGraph[State]:
    """a -> (b, c in one step; c sleeps `slow_s`) -> d; `ask`: b interrupts."""

    async def a(_: State) -> State:
        return {"log": ["a"]}

    async def b(_: State) -> State:
        if ask:
            return {"log": [f"b:{interrupt('yes?')}"]}
        return {"log": ["b"]}

    async def c(_: State) -> State:
        await asyncio.sleep(slow_s)
        return {"log": ["c"]}

    async def d(_: State) -> State:
        return {"log": ["d"]}

    g = StateGraph(State)
    for name, fn in (("a", a), ("b", b), ("c", c), ("d", d)):
        g.add_node(name, fn)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("a", "c")
    g.add_edge(["b", "c"], "d")
    g.add_edge("d", END)
    return g


@pytest.fixture
def store(settings: Settings) -> Iterator[RunStore]:
    pool = make_pool(settings, name="test-held-store", max_size=2)
    yield RunStore(pool)
    pool.close()


def _config(tid: str, run_id: str, epoch: int, held: HeldWrites | None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": tid, RUN_KEY: run_id, LEASE_KEY: lease_value(epoch, "w1")}
    if held is not None:
        conf[HELD_WRITES_KEY] = held
    return {"configurable": conf}


class CountingSaver(FencedPostgresSaver):
    """Counts the write transactions it opens (LangGraph's writes ask for a pipeline, its
    reads do not)."""

    transactions = 0

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[Any]:
        async with super()._cursor(pipeline=pipeline) as cur:
            self.transactions += pipeline
            yield cur


def _writes(settings: Settings, tid: str) -> list[tuple[str, str, int]]:
    """The thread's pending-write rows as (channel, task path, idx), sorted."""
    with psycopg.connect(settings.dsn) as conn:
        rows = conn.execute(
            "SELECT channel, task_path, idx FROM checkpoint_writes WHERE thread_id = %s",
            (tid,),
        ).fetchall()
    return sorted((str(c), str(p), int(i)) for c, p, i in rows)


def _run(settings: Settings, scenario: Callable[[CountingSaver], Any]) -> Any:
    async def main() -> Any:
        apool = await make_async_pool(settings, name="test-held", max_size=2)
        try:
            return await scenario(CountingSaver(apool, mode="full"))
        finally:
            await apool.close()

    return asyncio.run(main())


def test_l5_held_writes_commit_with_their_checkpoint(settings: Settings, store: RunStore) -> None:
    """L5: held, a run's pending writes are the same rows as written at once, in fewer
    transactions: each one-task step's writes go in its checkpoint's transaction."""
    at_once_tid, at_once_run, at_once_epoch = claimed_run(store, "w1")
    held_tid, held_run, held_epoch = claimed_run(store, "w1")

    async def scenario(saver: CountingSaver) -> tuple[int, int, int]:
        graph = _graph().compile(checkpointer=saver)
        await graph.ainvoke({"log": []}, _config(at_once_tid, at_once_run, at_once_epoch, None))
        at_once = saver.transactions
        saver.transactions = 0
        held = HeldWrites(linger_s=30)
        out = await graph.ainvoke({"log": []}, _config(held_tid, held_run, held_epoch, held))
        assert sorted(out["log"]) == ["a", "b", "c", "d"]
        left = len(held)
        await held.flush()
        return at_once, saver.transactions, left

    at_once, with_held, left = _run(settings, scenario)
    assert _writes(settings, held_tid) == _writes(settings, at_once_tid) != []
    assert left == 0  # every step here ends with a checkpoint: none waits for `flush`
    with psycopg.connect(settings.dsn) as conn:
        row = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = %s", (held_tid,))
        checkpoints = row.fetchone()[0]  # type: ignore[index]
    writes = at_once - checkpoints  # the transactions of pending writes, written at once
    assert writes > 0 and with_held == checkpoints, (at_once, with_held, checkpoints)


def test_l5_writes_no_checkpoint_follows_are_written_by_flush(
    settings: Settings, store: RunStore
) -> None:
    """L5: an interrupt's writes have no checkpoint after them: `flush` writes them, and the
    thread's state shows the interrupt, as when written at once."""
    tid, run_id, epoch = claimed_run(store, "w1")

    async def scenario(saver: CountingSaver) -> tuple[int, Any]:
        graph = _graph(ask=True).compile(checkpointer=saver)
        held = HeldWrites(linger_s=30)
        config = _config(tid, run_id, epoch, held)
        await graph.ainvoke({"log": []}, config)
        waiting = len(held)
        await held.flush()
        state = await graph.aget_state({"configurable": {"thread_id": tid}})
        return waiting, state

    waiting, state = _run(settings, scenario)
    assert waiting > 0
    assert [i.value for i in state.interrupts] == ["yes?"]
    assert "__interrupt__" in [c for c, _, _ in _writes(settings, tid)]


def test_l5_a_long_step_does_not_hold_a_finished_tasks_writes(
    settings: Settings, store: RunStore
) -> None:
    """L5: b ends while c sleeps in the same step: b's writes are committed within the
    linger, long before the step's checkpoint."""
    tid, run_id, epoch = claimed_run(store, "w1")

    async def scenario(saver: CountingSaver) -> list[str]:
        graph = _graph(slow_s=2.0).compile(checkpointer=saver)
        held = HeldWrites(linger_s=0.05)
        task = asyncio.create_task(graph.ainvoke({"log": []}, _config(tid, run_id, epoch, held)))
        seen: list[str] = []
        for _ in range(100):  # up to 1 s, well inside c's 2 s
            await asyncio.sleep(0.01)
            seen = [c for c, _, _ in await asyncio.to_thread(_writes, settings, tid)]
            if "log" in seen:
                break
        assert not task.done()
        await task
        await held.flush()
        return seen

    assert "log" in _run(settings, scenario)


def test_l2_a_stale_attempt_writes_none_of_its_held_writes(
    settings: Settings, store: RunStore
) -> None:
    """L2: the run re-claimed by a newer epoch, the old attempt's `flush` raises LeaseLost
    and writes nothing; the writes stay held (nothing is dropped silently)."""
    tid, run_id, epoch = claimed_run(store, "w1")

    async def scenario(saver: CountingSaver) -> int:
        graph = _graph(ask=True).compile(checkpointer=saver)
        held = HeldWrites(linger_s=30)
        await graph.ainvoke({"log": []}, _config(tid, run_id, epoch, held))
        before = len(_writes(settings, tid))
        assert await asyncio.to_thread(store.requeue, run_id, epoch, "test")
        assert (await asyncio.to_thread(store.claim, run_id, "w2")).run is not None
        waiting = len(held)
        with pytest.raises(LeaseLost):
            await held.flush()
        assert len(_writes(settings, tid)) == before
        return waiting - len(held)

    assert _run(settings, scenario) == 0
