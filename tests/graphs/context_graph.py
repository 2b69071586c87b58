"""A compiled graph whose `context_schema` is a dataclass with defaults, read in its node as
`runtime.context.model`: a run that sends no `context` gets the defaults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.runtime import Runtime


@dataclass
class Context:
    """The run's context, every field with a default."""

    model: str = "builtin/default"
    greeting: str = "hi"


class State(TypedDict):
    """A conversation."""

    messages: Annotated[list[AnyMessage], add_messages]


def answer(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
    """Say which model and greeting the context gave."""
    ctx = runtime.context
    return {"messages": [AIMessage(content=f"{ctx.greeting} from {ctx.model}")]}


builder = StateGraph(State, context_schema=Context)
builder.add_node("answer", answer)
builder.add_edge(START, "answer")
builder.add_edge("answer", END)
graph = builder.compile()
