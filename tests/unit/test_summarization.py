"""Summarization (C1, C2): selection keeps tool pairs, failures change nothing, hook order."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from shared.agent.lead_agent import build_lead_agent
from shared.agent.middleware.summarization import (
    CompactOutcome,
    Summarizer,
    SummaryContext,
    select_for_summary,
    sha256_of,
)
from shared.agent.model import BuiltinChatModel
from shared.journal import MemoryEventStore, RunJournal
from shared.settings import Settings

CTX = SummaryContext("t1", "alice", "lead_agent", [])


def call(i: int, n: int = 1) -> list[AnyMessage]:
    """An AI message with n tool calls and their n results."""
    ids = [f"c{i}_{k}" for k in range(n)]
    ai = AIMessage("", tool_calls=[{"name": "t", "args": {}, "id": c} for c in ids])
    return [ai, *(ToolMessage("ok", tool_call_id=c) for c in ids)]


def assert_pairs_intact(left: Sequence[AnyMessage], right: Sequence[AnyMessage]) -> None:
    calls = {tc["id"] for m in left if isinstance(m, AIMessage) for tc in m.tool_calls}
    results = {m.tool_call_id for m in right if isinstance(m, ToolMessage)}
    assert not calls & results, "a tool call was split from its result"
    calls_r = {tc["id"] for m in right if isinstance(m, AIMessage) for tc in m.tool_calls}
    results_l = {m.tool_call_id for m in left if isinstance(m, ToolMessage)}
    assert not calls_r & results_l


def test_c1_select_keeps_the_tail_and_never_splits_a_tool_pair() -> None:
    history = [HumanMessage("a"), *call(1, 2), AIMessage("done"), HumanMessage("b"), *call(2, 3)]
    for keep in range(len(history) + 2):
        left, right = select_for_summary(history, keep)
        assert left + right == history
        assert len(right) >= min(keep, len(history))
        assert_pairs_intact(left, right)
    # keep=2 lands inside the 3 results of call 2: the whole call stays preserved.
    left, right = select_for_summary(history, 2)
    assert isinstance(right[0], AIMessage) and len(right) == 4


@given(st.lists(st.sampled_from(["h", "a", "t1", "t2"]), max_size=12), st.integers(0, 14))
def test_c1_select_never_splits_tool_pairs_property(kinds: list[str], keep: int) -> None:
    """Any history of human turns, answers and 1- or 2-result tool calls."""
    history: list[AnyMessage] = []
    for i, k in enumerate(kinds):
        if k == "h":
            history.append(HumanMessage(f"h{i}"))
        elif k == "a":
            history.append(AIMessage(f"a{i}"))
        else:
            history.extend(call(i, int(k[1])))
    left, right = select_for_summary(history, keep)
    assert left + right == history
    assert_pairs_intact(left, right)


class ScriptedModel(BaseChatModel):
    """A fake LLM: answers from a script; an Exception entry is raised."""

    script: list[Any]
    seen: list[list[BaseMessage]] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return ChatResult(generations=[ChatGeneration(message=AIMessage(answer))])


def long_history(turns: int = 6) -> list[AnyMessage]:
    out: list[AnyMessage] = []
    for i in range(turns):
        out += [
            HumanMessage(f"question {i} " + "word " * 20, id=f"h{i}"),
            AIMessage(f"answer {i}", id=f"a{i}"),
        ]
    return out


def summarizer(
    run: BaseChatModel, summary: BaseChatModel | None = None, hooks: Any = ()
) -> Summarizer:
    return Summarizer(run, summary_model=summary, trigger_tokens=50, keep_messages=2, hooks=hooks)


def test_c1_under_budget_and_nothing_to_compact_are_distinct() -> None:
    s = summarizer(ScriptedModel(script=[]))
    short = [HumanMessage("hi", id="h"), AIMessage("yo", id="a")]
    assert s.run(short, None, CTX, force=False).outcome is CompactOutcome.UNDER_BUDGET
    assert s.run(short, None, CTX, force=True).outcome is CompactOutcome.NOTHING_TO_COMPACT


@pytest.mark.parametrize("script", [[RuntimeError("down")], ["   "]], ids=["error", "blank"])
def test_c1_failure_or_blank_summary_changes_nothing_and_runs_no_hook(script: list[Any]) -> None:
    hooks: list[str] = []
    s = summarizer(ScriptedModel(script=script), hooks=[lambda ctx: hooks.append("hook")])
    result = s.run(long_history(), "old summary", CTX, force=False)
    assert result.outcome is CompactOutcome.SUMMARY_FAILED
    assert result.update is None and hooks == []


def test_c1_summary_model_failure_falls_back_to_the_run_model() -> None:
    run, summary = (
        ScriptedModel(script=["from the run model"]),
        ScriptedModel(script=[RuntimeError("x")]),
    )
    result = summarizer(run, summary).run(long_history(), None, CTX, force=False)
    assert result.outcome is CompactOutcome.COMPACTED
    assert result.update is not None and result.update["summary_text"] == "from the run model"


def test_c2_order_summary_then_hooks_then_journal_then_one_update() -> None:
    order: list[str] = []
    model = ScriptedModel(script=["the summary"])

    async def async_hook(ctx: SummaryContext) -> None:
        order.append(f"async hook saw {len(ctx.messages_to_summarize)}")

    def sync_hook(ctx: SummaryContext) -> None:
        assert model.seen, "hooks run only after the summary exists"
        order.append("sync hook")

    def failing_hook(ctx: SummaryContext) -> None:
        raise RuntimeError("contained")

    history = long_history()
    s = summarizer(model, hooks=[sync_hook, failing_hook, async_hook])
    result = s.run(
        history,
        "before",
        CTX,
        force=False,
        journal_record=lambda r: order.append(f"journal {r['summarized']}"),
    )
    assert order == ["sync hook", "async hook saw 10", "journal 10"]
    assert result.outcome is CompactOutcome.COMPACTED and result.update is not None
    msgs = result.update["messages"]
    assert isinstance(msgs[0], RemoveMessage) and msgs[0].id == REMOVE_ALL_MESSAGES
    assert msgs[1:] == history[-2:]
    assert result.update["summary_text"] == "the summary"
    assert result.record["output_sha256"] == sha256_of("the summary")
    # The previous summary is part of the summary model's input.
    assert "Previous summary: before" in model.seen[0][1].text


def test_c1_c2_lead_agent_summarizes_when_over_budget_and_journals_hashes() -> None:
    settings = Settings(summary_trigger_tokens=80, summary_keep_messages=2, memory_enabled=False)
    agent = build_lead_agent(settings).copy(update={"checkpointer": InMemorySaver()})
    store = MemoryEventStore()
    run_id = "00000000-0000-0000-0000-000000000001"
    journal = RunJournal(store, run_id=run_id, thread_id="t1")
    config: Any = {"configurable": {"thread_id": "t1"}, "callbacks": [journal]}

    async def turns() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i in range(4):
            out = await agent.ainvoke(
                {"messages": [HumanMessage(f"turn {i} " + "blah " * 15)]}, config
            )
        return out

    out = asyncio.run(turns())
    assert out["summary_text"].startswith('The user said "turn 0')
    assert len(out["messages"]) < 8
    asyncio.run(journal.flush())
    page = store.list_run_events(run_id, categories=["middleware"], limit=500)
    events = [e for e in page.events if e.type == "summary.created"]
    assert events and set(events[0].payload) >= {"source_sha256", "output_sha256", "summarized"}
    # usage of the summary call is billed to the middleware (J2)
    assert any(
        t.startswith("middleware:SummarizationMiddleware") for t in journal.usage()["by_tag"]
    )


def test_builtin_model_summarizes_user_lines_and_blank_without_them() -> None:
    model = BuiltinChatModel()
    s = summarizer(model)
    result = s.run(long_history(), None, CTX, force=False)
    assert result.update is not None
    assert result.update["summary_text"].count("The user said") == 5
    no_users: list[AnyMessage] = [AIMessage("x " * 40, id=f"a{i}") for i in range(4)]
    assert s.run(no_users, None, CTX, force=False).outcome is CompactOutcome.SUMMARY_FAILED
