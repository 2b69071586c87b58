"""A graph that pauses on `interrupt()` for an approval, then answers: the test graph of
thread `interrupts` (LangGraph's dynamic interrupt, which a static `interrupt_before` is not:
that one pauses with no interrupt in the thread's tasks)."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

QUESTION = {"question": "approve?"}


class ApprovalState(TypedDict):
    """A conversation."""

    messages: Annotated[list[AnyMessage], add_messages]


def ask(state: ApprovalState) -> dict[str, Any]:
    """Pause for the approval, then say what it was."""
    answer = interrupt(QUESTION)
    return {"messages": [AIMessage(content=f"approved: {answer}")]}


def build() -> Any:
    """The uncompiled graph (tests compile it with their saver)."""
    builder = StateGraph(ApprovalState)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder


graph = build().compile()
