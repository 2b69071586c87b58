"""The test graphs of tests/e2e/test_durability.py: five steps in a row (`graph`), and two
tasks of one step side by side (`fanout`: `fast` ends at once, `slow` pauses), each appending
its name to the state's `log` after a pause. Each execution of a step is also appended to the
file named by `configurable.trace` (one line, the step's name, when it starts), so a test
counts which steps an attempt ran again after its worker was killed."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

STEPS = ("s1", "s2", "s3", "s4", "s5")


class StepsState(TypedDict):
    """What the steps did, in order (the input's items first)."""

    log: Annotated[list[str], operator.add]


def step(
    name: str, *, pause: bool = True
) -> Callable[[StepsState, RunnableConfig], Awaitable[dict[str, Any]]]:
    """The node `name`: trace its start, pause `configurable.step_s` (if `pause`), log its name."""

    async def node(state: StepsState, config: RunnableConfig) -> dict[str, Any]:
        conf = config.get("configurable") or {}
        if trace := conf.get("trace"):
            with Path(trace).open("a") as f:
                f.write(f"{name}\n")
        if pause:
            await asyncio.sleep(float(conf.get("step_s") or 0))
        return {"log": [name]}

    return node


def build() -> Any:
    """s1 -> s2 -> s3 -> s4 -> s5."""
    builder = StateGraph(StepsState)
    for name in STEPS:
        builder.add_node(name, step(name))
    for a, b in zip((START, *STEPS), (*STEPS, END), strict=True):
        builder.add_edge(a, b)
    return builder


def build_fanout() -> Any:
    """START -> (fast, slow) -> END: one step of two tasks."""
    builder = StateGraph(StepsState)
    builder.add_node("fast", step("fast", pause=False))
    builder.add_node("slow", step("slow"))
    for name in ("fast", "slow"):
        builder.add_edge(START, name)
        builder.add_edge(name, END)
    return builder


graph = build().compile()
fanout = build_fanout().compile()
