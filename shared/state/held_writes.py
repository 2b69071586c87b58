"""A run attempt's pending writes, held back to commit with the checkpoint that follows them.

LangGraph saves a task's writes (`aput_writes`) the moment the task ends, and the step's
checkpoint (`aput`) once every task of the step has ended. For a fenced saver each is a
transaction of its own: a gate wait, BEGIN and the epoch check, the rows, COMMIT. Most steps
have one task, so its writes are followed within the same tick by the checkpoint that
already holds their effect: three of a bench run's seven fenced transactions. Holding them
saves ~5 ms of CPU per 206-event run at C=50, over the worker and PostgreSQL
(docs/performance.md).

So a worker attempt holds its writes here (`FencedPostgresSaver.aput_writes`), and the next
checkpoint of the same thread and namespace whose parent is their checkpoint commits them
in its own transaction, before its rows (`FencedPostgresSaver.aput`). The rows are the ones
LangGraph would have written; only the transaction differs. Writes no checkpoint follows (an
interrupt, a failed node, a stopped run) or that wait longer than `linger_s` (a step whose
other tasks run on) are written alone, as before: by a timer, and by `flush` once the
attempt's graph has stopped, before anything reads the thread's state.

What holding changes: a worker that dies within `linger_s` of a task's end, before the
step's checkpoint, loses that task's writes, and the next attempt runs the task again from
the last checkpoint (L5) — as it already does for a task whose background write had not
committed yet, a window LangGraph's `durability="async"` accepts. Nothing that committed is
lost and nothing is written twice: a held write is taken by exactly one writer. A checkpoint
whose transaction fails takes its parent's held writes with it; the failure reaches the
graph and ends the attempt, and the next one runs those tasks again from the last checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HeldWrite:
    """One `aput_writes` call, held."""

    config: RunnableConfig
    writes: Sequence[tuple[str, Any]]
    task_id: str
    task_path: str

    @property
    def checkpoint(self) -> tuple[str, str, str]:
        """(thread id, namespace, checkpoint id) the writes belong to."""
        conf = self.config["configurable"]
        return str(conf["thread_id"]), str(conf["checkpoint_ns"]), str(conf["checkpoint_id"])


Writer = Callable[[HeldWrite], Awaitable[None]]


class HeldWrites:
    """One attempt's held writes (passed to the saver in `configurable`, see savers.py)."""

    def __init__(self, linger_s: float) -> None:
        self._linger_s = linger_s
        self._held: list[HeldWrite] = []
        self._writer: Writer | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._writing: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, write: HeldWrite, writer: Writer) -> None:
        """Keep `write` for the next checkpoint; `writer` writes it alone if none comes."""
        self._held.append(write)
        self._writer = writer
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._linger_s, self._due)

    def take(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> list[HeldWrite]:
        """The held writes of that checkpoint, in the order they were made, for the
        transaction of its child; they are no longer held."""
        key = (thread_id, checkpoint_ns, str(checkpoint_id))
        taken = [w for w in self._held if w.checkpoint == key]
        if taken:
            self._held = [w for w in self._held if w.checkpoint != key]
            if not self._held:
                self._disarm()
        return taken

    async def flush(self) -> None:
        """Write every held write now, each in its own fenced transaction; raises what a
        write raises (LeaseLost, a service error), the unwritten ones still held."""
        self._disarm()
        if self._writing is not None:  # a timer's writes: let them end (they re-hold on error)
            await asyncio.wait([self._writing])
        await self._write_held()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _due(self) -> None:
        self._timer = None
        if not self._held:
            return
        if self._writing is not None and not self._writing.done():  # try again later
            self._timer = asyncio.get_running_loop().call_later(self._linger_s, self._due)
            return
        self._writing = asyncio.ensure_future(self._write_in_background())

    async def _write_in_background(self) -> None:
        try:
            await self._write_held()
        except Exception:  # held again: the next checkpoint or `flush` writes them
            log.warning("held pending writes not written yet; retried later", exc_info=True)

    async def _write_held(self) -> None:
        held, self._held = self._held, []
        for i, write in enumerate(held):
            try:
                assert self._writer is not None  # set by the first `hold`
                await self._writer(write)
            except BaseException:
                self._held[:0] = held[i:]  # back in front, in order
                raise
