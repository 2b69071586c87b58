"""A chat graph for the chat page's browser tests (tests/e2e/test_chat_page.py), served only by
the config file those tests write.

`markdown_chat` answers every message with the same Markdown (a heading, a list, inline code
and a fenced Python block), streamed token by token through a LangChain fake chat model, so
the page's progressive Markdown rendering sees real `messages` events. The built-in model
cannot be used for this: it joins its tokens with single spaces, which loses the newlines a
code block needs.

A message containing "fail" makes the model call raise, the way a provider error would, the
first time the node answers it; the next attempt at the same message (the page's Retry, a
run with no input that re-runs the failed node from the thread's checkpoint) is answered.
Which attempt this is survives processes: a marker file per thread and message in the
temporary directory (the tests' worker runs on this machine).
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
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


def first_attempt(thread_id: str, message_id: str) -> bool:
    """True the first time this thread's message is answered (a marker file says so after)."""
    key = hashlib.sha256(f"{thread_id}/{message_id}".encode()).hexdigest()[:32]
    marker = Path(tempfile.gettempdir()) / f"threadrun-chat-graph-failed-{key}"
    try:
        marker.touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


async def answer(state: State, config: RunnableConfig) -> State:
    """Stream ANSWER, or fail like a provider error the first time "fail" is asked."""
    humans = [m for m in state["messages"] if isinstance(m, HumanMessage)]
    last = humans[-1] if humans else None
    if last is not None and "fail" in last.text.lower():
        thread_id = str(config.get("configurable", {}).get("thread_id", ""))
        if first_attempt(thread_id, str(last.id)):
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
