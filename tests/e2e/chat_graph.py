"""A chat graph for the chat page's browser tests (tests/e2e/test_chat_page.py), served only by
the config file those tests write.

`markdown_chat` answers every message with the same Markdown (a heading, a list, inline code
and a fenced Python block), streamed token by token through a LangChain fake chat model, so
the page's progressive Markdown rendering sees real `messages` events. The built-in model
cannot be used for this: it joins its tokens with single spaces, which loses the newlines a
code block needs.

A message containing "fail" makes the model call raise, the way a provider error would, the
first time it is sent; the same text sent again (the page's Retry) is answered. One worker
process holds no state for this: the count of identical user messages in the thread decides.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

ANSWER = """## Caching, briefly

A cache keeps **recent answers** close to the code that needs them, so a repeated
question costs a lookup instead of a round trip. Use `functools.lru_cache` for pure
functions:

```python
from functools import lru_cache


@lru_cache(maxsize=1024)
def price(sku: str) -> int:
    return slow_lookup(sku)  # runs once per sku
```

Things to decide up front:

1. **Size**: how many entries before the oldest go.
2. **Freshness**: a TTL, or explicit invalidation on write.
3. *Scope*: per process, or shared (Redis).

> A cache without an invalidation story is a bug with good latency.
"""
FAILURE = (
    "model call failed: POST http://127.0.0.1:9/v1/chat/completions answered "
    "500 Internal Server Error (provider openai, not retried)"
)


class PacedFakeChatModel(GenericFakeChatModel):
    """The fake model, one chunk every few milliseconds like a real provider (all at once,
    the page would receive the whole answer in one read and render it once)."""

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in self._stream(*args, **kwargs):
            await asyncio.sleep(0.004)
            yield chunk


class State(TypedDict):
    """The conversation."""

    messages: Annotated[list[AnyMessage], add_messages]


async def answer(state: State, config: RunnableConfig) -> State:
    """Stream ANSWER, or fail like a provider error the first time "fail" is asked."""
    humans = [m for m in state["messages"] if isinstance(m, HumanMessage)]
    last = humans[-1].text if humans else ""
    if "fail" in last.lower() and sum(m.text == last for m in humans) == 1:
        raise RuntimeError(FAILURE)
    model = PacedFakeChatModel(messages=iter([AIMessage(content=ANSWER)]))
    reply = await model.ainvoke(state["messages"], config)
    return {"messages": [reply]}


graph = (
    StateGraph(State)
    .add_node("answer", answer)
    .add_edge(START, "answer")
    .add_edge("answer", END)
    .compile()
)
