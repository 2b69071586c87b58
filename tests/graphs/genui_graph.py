"""A graph that pushes generative UI (`langgraph.graph.ui`): a progress card it deletes,
then a weather card attached to its answer. The test graph of tests/e2e/test_genui.py,
served from tests/fixtures/genui_project/langgraph.json with its `ui` components."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage
from langgraph.config import get_config
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.ui import AnyUIMessage, delete_ui_message, push_ui_message, ui_message_reducer

CITY_TEMPS = {"paris": 21, "oslo": 4, "lima": 18}


class GenUiState(TypedDict):
    """A conversation and the UI messages its runs pushed."""

    messages: Annotated[list[AnyMessage], add_messages]
    ui: Annotated[Sequence[AnyUIMessage], ui_message_reducer]


def _city(state: GenUiState) -> str:
    text = str(state["messages"][-1].content) if state["messages"] else ""
    words = [w.strip("?!.,").lower() for w in text.split()]
    return next((w for w in reversed(words) if w in CITY_TEMPS), "paris")


def _progress_id() -> str:
    return f"progress-{get_config()['configurable'].get('run_id', 'run')}"


def fetch(state: GenUiState) -> dict[str, Any]:
    """Show a progress card while the 'forecast' is fetched."""
    push_ui_message(
        "progress", {"label": f"Fetching the weather in {_city(state)}"}, id=_progress_id()
    )
    return {}


def answer(state: GenUiState) -> dict[str, Any]:
    """Drop the progress card; answer with a weather card attached to the message."""
    city = _city(state)
    delete_ui_message(_progress_id())
    msg = AIMessage(
        id=f"answer-{_progress_id()}", content=f"Here is the weather in {city.title()}."
    )
    push_ui_message("weather", {"city": city.title(), "temp": CITY_TEMPS[city]}, message=msg)
    return {"messages": [msg]}


def build() -> Any:
    """The uncompiled graph."""
    builder = StateGraph(GenUiState)
    builder.add_node("fetch", fetch)
    builder.add_node("answer", answer)
    builder.add_edge(START, "fetch")
    builder.add_edge("fetch", "answer")
    builder.add_edge("answer", END)
    return builder


graph = build().compile()
