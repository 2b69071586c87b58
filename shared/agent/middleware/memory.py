"""Memory injection (SPEC M2, M3) in `before_agent` and memory write (M4) in `after_agent`.

Injection freezes the user's memory block and today's date into the `memory_context`
channel on a thread's first run; later runs the same day change nothing, and a run
after midnight refreshes only the date (the frozen block stays, so the prompt prefix of
a long thread is stable). The read runs in a thread, off the event loop, bounded by
`memory_injection_timeout_s`: on timeout nothing new is injected and whatever is frozen
stays. A failed read is fail-open (no memory this run, nothing frozen, retried next
run) unless the read policy is `fail_closed`, which fails the run.

Writing hands the thread's messages to the manager once per agent run; the manager
keeps user inputs and final replies and only admits them into the memory queue. A
failure to admit is logged and the run goes on (G3: memory write fails open).

Both do nothing for a run without `configurable.user_id` / `thread_id` (no one to
remember for).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import logging
from collections.abc import Callable
from typing import Annotated, Any, NotRequired

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain.agents.middleware.types import OmitFromInput
from langchain_core.messages import AnyMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.runtime import Runtime
from typing_extensions import TypedDict

from shared.agent.middleware.summarization import SummaryContext
from shared.journal.journal import journal_from_config, sha256_text
from shared.memory.manager import MemoryManager

log = logging.getLogger(__name__)

ManagerFactory = Callable[[], MemoryManager]


class MemoryContext(TypedDict):
    """The frozen memory of a thread (M2)."""

    text: str
    sha256: str
    date: str  # ISO date the block was last dated (system metadata)
    frozen_on: str  # ISO date the block was read


class MemoryState(AgentState[Any]):
    """The channel the injection middleware adds to the assembled state (S1)."""

    memory_context: NotRequired[Annotated[MemoryContext | None, OmitFromInput]]


def utc_today() -> dt.date:
    """Today in UTC (the default clock)."""
    return dt.datetime.now(dt.UTC).date()


def run_identity(config: RunnableConfig) -> tuple[str, str, str, str | None] | None:
    """(thread_id, user_id, agent_name, run_id) of the run, or None without a user/thread."""
    conf = config.get("configurable") or {}
    thread_id, user_id = conf.get("thread_id"), conf.get("user_id")
    if not thread_id or not user_id:
        return None
    agent_name = conf.get("agent_name") or conf.get("graph_id") or "lead_agent"
    run_id = conf.get("run_id")
    return str(thread_id), str(user_id), str(agent_name), str(run_id) if run_id else None


def injection_update(
    frozen: MemoryContext | None, today: dt.date, read: Callable[[], str | None] | None
) -> dict[str, Any] | None:
    """The state update of one injection decision (pure apart from `read`)."""
    day = today.isoformat()
    if frozen is not None:
        if frozen["date"] == day:
            return None
        return {"memory_context": {**frozen, "date": day}}
    if read is None:
        return None
    text = read()
    if text is None:
        return None
    ctx: MemoryContext = {"text": text, "sha256": sha256_text(text), "date": day, "frozen_on": day}
    return {"memory_context": ctx}


class MemoryInjectionMiddleware(AgentMiddleware[MemoryState, Any, Any]):
    """Freeze memory + date into the thread on its first run (M2, M3)."""

    state_schema = MemoryState

    def __init__(
        self,
        manager: ManagerFactory,
        *,
        timeout_s: float,
        today: Callable[[], dt.date] = utc_today,
    ) -> None:
        super().__init__()
        self._manager = manager
        self.timeout_s = timeout_s
        self.today = today
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def _reader(self, config: RunnableConfig) -> Callable[[], str | None] | None:
        ident = run_identity(config)
        if ident is None:
            return None
        _, user_id, agent_name, _ = ident
        return lambda: self._manager().context(agent_name, user_id)

    def _journal(self, config: RunnableConfig, update: dict[str, Any] | None) -> None:
        journal = journal_from_config(config)
        ctx = (update or {}).get("memory_context")
        if journal is not None and ctx and ctx.get("frozen_on") == ctx.get("date") and ctx["text"]:
            journal.record_memory_context(ctx["text"], source="memory.injection")

    async def abefore_agent(
        self, state: MemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Inject on the first run; re-date after midnight; else nothing."""
        config = get_config()
        reader = self._reader(config)
        timeout = self.timeout_s

        async def read_bounded() -> str | None:
            assert reader is not None
            return await asyncio.wait_for(asyncio.to_thread(reader), timeout)

        frozen = state.get("memory_context")
        if frozen is None and reader is not None:
            try:
                text = await read_bounded()
            except TimeoutError:
                log.warning("memory read timed out after %.1fs; nothing injected", timeout)
                return None
            update = injection_update(None, self.today(), lambda: text)
        else:
            update = injection_update(frozen, self.today(), None)
        self._journal(config, update)
        return update

    def before_agent(self, state: MemoryState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Sync graphs: the same decision, the read bounded in a worker thread."""
        config = get_config()
        reader = self._reader(config)
        frozen = state.get("memory_context")
        if frozen is None and reader is not None:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(2, "memory-read")
            future = self._pool.submit(reader)
            try:
                text = future.result(timeout=self.timeout_s)
            except concurrent.futures.TimeoutError:
                log.warning("memory read timed out after %.1fs; nothing injected", self.timeout_s)
                return None
            update = injection_update(None, self.today(), lambda: text)
        else:
            update = injection_update(frozen, self.today(), None)
        self._journal(config, update)
        return update


class MemoryWriteMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Admit the run's messages into the memory queue once per agent run (M4)."""

    def __init__(self, manager: ManagerFactory) -> None:
        super().__init__()
        self._manager = manager

    def _admit(self, messages: list[AnyMessage], config: RunnableConfig) -> None:
        ident = run_identity(config)
        if ident is None:
            return
        thread_id, user_id, agent_name, run_id = ident
        try:
            self._manager().add(thread_id, messages, agent_name, user_id, trace_id=run_id)
        except Exception:  # G3: memory write fails open
            log.exception("memory update not admitted", extra={"thread_id": thread_id})

    async def aafter_agent(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Hand the messages to the manager (off the loop); changes no state."""
        await asyncio.to_thread(self._admit, list(state["messages"]), get_config())
        return None

    def after_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Sync graphs: the same."""
        self._admit(list(state["messages"]), get_config())
        return None


def urgent_flush_hook(manager: ManagerFactory) -> Callable[[SummaryContext], None]:
    """Before-summarization hook: admit the messages about to be summarized, urgently (M5)."""

    def flush(ctx: SummaryContext) -> None:
        if not ctx.thread_id or not ctx.user_id:
            return
        manager().add(
            ctx.thread_id,
            ctx.messages_to_summarize,
            ctx.agent_name or "lead_agent",
            ctx.user_id,
            urgent=True,
        )

    return flush
