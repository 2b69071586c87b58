"""A graph for the chat page's browser tests of a stream that fails mid-answer
(tests/e2e/test_chat_ux.py), served only by the config file those tests write.

`cutoff_chat` streams the first CUT_AFTER words of ANSWER token by token through a
LangChain fake chat model, so the page receives real `messages` events, then raises the way
a provider whose stream broke does: the run ends `error` and the thread's state has no
answer (the node failed), only the user's message.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

ANSWER = (
    "Night trains leave the central station at ten, stop twice in the mountains and arrive"
    " at the coast by breakfast; the sleeper cars are booked weeks ahead in summer."
)
CUT_AFTER = 12
"""Words streamed before the failure."""
FAILURE = "model stream broke: the provider closed the connection mid-answer (HTTP 500)"


class State(TypedDict):
    """The conversation."""

    messages: Annotated[list[AnyMessage], add_messages]


def partial() -> str:
    """What the page has received when the stream breaks."""
    return " ".join(ANSWER.split(" ")[:CUT_AFTER])


async def answer(state: State, config: RunnableConfig) -> dict[str, Any]:
    """Stream the first CUT_AFTER words of ANSWER, then fail."""
    model = GenericFakeChatModel(messages=iter([AIMessage(content=ANSWER)]))
    words = 0
    async for chunk in model.astream(state["messages"], config):
        await asyncio.sleep(0.01)
        if str(chunk.content).strip():
            words += 1
        if words >= CUT_AFTER:
            raise RuntimeError(FAILURE)
    raise AssertionError("unreachable: the answer is longer than CUT_AFTER words")


graph = (
    StateGraph(State)
    .add_node("answer", answer)
    .add_edge(START, "answer")
    .add_edge("answer", END)
    .compile()
)
