"""A graph that writes to and reads from its store, and a deterministic embedding function:
registered only in the config files that tests/e2e/test_store_e2e.py writes for its clusters."""

from __future__ import annotations

import math
from collections.abc import Sequence

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from typing_extensions import TypedDict

NAMESPACE = ("memories",)
SYNC_NAMESPACE = ("memories", "sync")
DIMS = 8
WORDS = ("cat", "dog", "fish", "car", "bus", "train", "red", "blue")
"""The embedding's axes: a text's vector counts these words (plus a constant)."""


class State(TypedDict, total=False):
    """The note to remember, and what the graph then saw in its store."""

    note: str
    seen: list[str]


async def remember(state: State, runtime: Runtime[None]) -> State:
    """Write the note from an async node."""
    assert runtime.store is not None
    await runtime.store.aput(NAMESPACE, "note", {"text": state["note"]})
    return {}


def remember_sync(state: State, runtime: Runtime[None]) -> State:
    """Write the note again from a sync node (runs in a thread: the store's sync path)."""
    assert runtime.store is not None
    runtime.store.put(SYNC_NAMESPACE, "note", {"text": state["note"]})
    return {}


async def recall(state: State, runtime: Runtime[None]) -> State:
    """Everything the store shows this run under `memories`."""
    assert runtime.store is not None
    items = await runtime.store.asearch(NAMESPACE, limit=100)
    return {"seen": sorted(f"{'/'.join(i.namespace)}:{i.key}:{i.value['text']}" for i in items)}


graph = (
    StateGraph(State)
    .add_node("remember", remember)
    .add_node("remember_sync", remember_sync)
    .add_node("recall", recall)
    .add_edge(START, "remember")
    .add_edge("remember", "remember_sync")
    .add_edge("remember_sync", "recall")
    .add_edge("recall", END)
    .compile()
)


def embed(texts: Sequence[str]) -> list[list[float]]:
    """Unit vectors of word counts over WORDS: texts sharing words score close."""
    out = []
    for text in texts:
        words = text.lower().split()
        vec = [float(words.count(w)) for w in WORDS[: DIMS - 1]] + [0.1]
        norm = math.sqrt(sum(x * x for x in vec))
        out.append([x / norm for x in vec])
    return out
