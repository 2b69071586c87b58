"""A graph factory in the official server's fullest form: an async context manager taking
the config and the server runtime (`graph(config, runtime: ServerRuntime[Ctx])`), as the
example `factory` graph of the peer suite this project is compared against.

The runtime decides the structure (`enable_search` adds a tools node, an admin user gets
an admin tool); the node reads the run's `context` (model, system prompt) through
LangGraph's own `Runtime`. The model is a fixed answer: "Bonjour !" when the system prompt
asks for French, else "Hello!", with the model name and the tools it was built with in
its `response_metadata`, so a test sees what the factory and the node were given.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.runtime import Runtime
from langgraph_sdk.runtime import ServerRuntime

OPENED: list[str] = []
"""What the factory was called for, in order: `enter <access>` and `exit <access>`."""


@dataclass(kw_only=True)
class FactoryContext:
    """The run's context: read by the factory (structure) and by the node (answer)."""

    model: str = "openai/gpt-4o-mini"
    system_prompt: str = "You are a helpful assistant."
    enable_search: bool = True


class State(TypedDict):
    """A conversation."""

    messages: Annotated[list[AnyMessage], add_messages]


@tool
def search_web(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


@tool
def delete_user(user_id: str) -> str:
    """Delete a user (admins only)."""
    return f"deleted {user_id}"


def build(tools: list[BaseTool]) -> Any:
    """The compiled graph for `tools` (a tools node only when there are some)."""

    def call_model(state: State, runtime: Runtime[FactoryContext]) -> dict[str, Any]:
        ctx = runtime.context
        french = "french" in ctx.system_prompt.lower()
        answer = AIMessage(
            content="Bonjour !" if french else "Hello!",
            response_metadata={
                "model_name": ctx.model.split("/", 1)[-1],
                "tools": [t.name for t in tools],
            },
        )
        return {"messages": [answer]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(State, context_schema=FactoryContext)
    builder.add_node("call_model", call_model)
    builder.add_edge(START, "call_model")
    if tools:
        builder.add_node("tools", ToolNode(tools))
        builder.add_conditional_edges("call_model", route, ["tools", END])
        builder.add_edge("tools", "call_model")
    else:
        builder.add_edge("call_model", END)
    return builder.compile(name="Factory Agent")


@asynccontextmanager
async def graph(
    config: dict[str, Any], runtime: ServerRuntime[FactoryContext]
) -> AsyncIterator[Any]:
    """Build the graph for this use of it; entered per use and exited afterwards."""
    ert = runtime.execution_runtime
    raw = ert.context if ert is not None else None
    ctx = raw if isinstance(raw, FactoryContext) else FactoryContext(**(raw or {}))
    tools: list[BaseTool] = [search_web] if ctx.enable_search else []
    user = runtime.user
    if user is not None and "admin" in (getattr(user, "permissions", None) or []):
        tools.append(delete_user)
    OPENED.append(f"enter {runtime.access_context}")
    try:
        yield build(tools)
    finally:
        OPENED.append(f"exit {runtime.access_context}")
