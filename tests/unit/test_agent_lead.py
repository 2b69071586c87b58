"""The lead agent graph, end to end with an in-memory checkpointer."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver

from shared.agent.lead_agent import build_lead_agent, graph
from shared.settings import Settings


def user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def run_config(workspace: Path, thread_id: str, **knobs: Any) -> RunnableConfig:
    return RunnableConfig(
        configurable={"thread_id": thread_id, "workspace_dir": workspace, **knobs}
    )


def test_module_graph_is_compiled_without_a_checkpointer() -> None:
    assert graph.name == "lead_agent"
    assert graph.checkpointer is None
    assert {"model", "tools"} <= set(graph.nodes)


def test_streams_writes_the_artifact_and_remembers_the_thread(tmp_path: Path) -> None:
    agent = graph.copy(update={"checkpointer": InMemorySaver()})
    config = run_config(tmp_path, "thread-1", tokens=12)

    async def scenario() -> tuple[list[tuple[str, Any]], dict[str, Any]]:
        events = [
            (mode, data)
            async for mode, data in agent.astream(
                user("Please write a report about ducks"),
                config,
                stream_mode=["messages", "values", "updates"],
            )
        ]
        second = await agent.ainvoke(user("and now?"), config)
        return events, second

    events, second = asyncio.run(scenario())
    modes = {mode for mode, _ in events}
    assert modes == {"messages", "values", "updates"}

    streamed = [data for mode, data in events if mode == "messages"]
    model_chunks = [
        chunk
        for chunk, meta in streamed
        if isinstance(chunk, AIMessageChunk) and meta["langgraph_node"] == "model"
    ]
    # Two model calls (tool call, then the answer), each exactly `tokens` tokens.
    assert len(model_chunks) == 24
    assert all(len(str(c.content).split()) == 1 for c in model_chunks)
    assert model_chunks[11].tool_call_chunks[0]["name"] == "write_artifact"
    assert model_chunks[11].usage_metadata is not None
    assert model_chunks[23].usage_metadata is not None

    updates = [data for mode, data in events if mode == "updates"]
    assert [next(iter(u)) for u in updates] == ["model", "tools", "model"]

    artifact = tmp_path / "thread-1" / "outputs" / "report.md"
    assert "Please write a report about ducks" in artifact.read_text()

    final_values = [data for mode, data in events if mode == "values"][-1]
    tool_message = final_values["messages"][2]
    assert isinstance(tool_message, ToolMessage)
    assert json.loads(tool_message.text) == {
        "path": "outputs/report.md",
        "size": artifact.stat().st_size,
    }
    answer = final_values["messages"][-1]
    assert isinstance(answer, AIMessage)
    assert answer.text.startswith("(turn 1) Saved artifact outputs/report.md")
    assert answer.name == "lead_agent"

    reply = second["messages"][-1]
    assert reply.text.startswith("(turn 2) You said: and now?")
    assert len(reply.text.split()) == 12
    assert len(second["messages"]) == 6


def test_sync_invoke_and_per_run_knobs(tmp_path: Path) -> None:
    agent = graph.copy(update={"checkpointer": InMemorySaver()})
    out = agent.invoke(user("hello"), run_config(tmp_path, "thread-2", tokens=6))
    assert out["messages"][-1].text == "(turn 1) You said: hello t0005"
    out = agent.invoke(user("hello"), run_config(tmp_path, "thread-3", tokens=7))
    assert len(out["messages"][-1].text.split()) == 7


def test_build_lead_agent_takes_its_defaults_from_settings(tmp_path: Path) -> None:
    agent = build_lead_agent(Settings(builtin_tokens=5))
    out = agent.invoke(user("hi"), run_config(tmp_path, "thread-4"))
    assert out["messages"][-1].text == "(turn 1) You said: hi"


def test_token_delay_knob_reaches_the_model_inside_the_graph(tmp_path: Path) -> None:
    config = run_config(tmp_path, "thread-5", tokens=5, token_delay_ms=30)
    started = time.perf_counter()
    out = asyncio.run(graph.ainvoke(user("slow please"), config))
    assert time.perf_counter() - started >= 0.14
    assert len(out["messages"][-1].text.split()) == 5
