"""The lead agent graph, end to end with an in-memory checkpointer."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from shared.agent.lead_agent import (
    LEAD_TOOLS,
    build_lead_agent,
    build_subagent,
    graph,
    save_artifact,
)
from shared.settings import Settings
from shared.state.accessor import snapshot_to_json
from shared.state.reducers import merge_artifacts
from shared.state.thread_state import THREAD_STATE_FIELDS, ThreadState
from shared.workspaces import OWNERLESS


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
    # Agent nodes only: the SPEC §8 middleware hooks are nodes of their own.
    nodes = [next(iter(u)) for u in updates]
    assert [n for n in nodes if "." not in n] == ["model", "tools", "model"]

    artifact = tmp_path / OWNERLESS / "thread-1" / "outputs" / "report.md"
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
    # write_artifact's Command recorded the path in the thread's state, in the tools step.
    tools_update = next(u["tools"] for u in updates if "tools" in u)
    assert tools_update["artifacts"] == ["outputs/report.md"]
    assert final_values["artifacts"] == ["outputs/report.md"]

    reply = second["messages"][-1]
    assert reply.text.startswith("(turn 2) You said: and now?")
    assert len(reply.text.split()) == 12
    assert len(second["messages"]) == 6
    assert second["artifacts"] == ["outputs/report.md"]


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


# --- ThreadState (S1) and the artifacts channel (S2) ------------------------------------


def test_s1_the_lead_agent_runs_on_thread_state() -> None:
    channels = graph.builder.channels
    assert set(THREAD_STATE_FIELDS) <= set(graph.builder.state_schema.__annotations__)
    assert getattr(channels["artifacts"], "operator", None) is merge_artifacts
    assert [t.name for t in LEAD_TOOLS] == ["write_artifact", "read_artifact", "list_artifacts"]


def test_s2_artifacts_show_up_in_the_thread_state_values(tmp_path: Path) -> None:
    """What GET /threads/{id}/state answers (snapshot_to_json of the head checkpoint)."""
    agent = graph.copy(update={"checkpointer": InMemorySaver()})
    config = run_config(tmp_path, "thread-6", tokens=8)
    forged = {**user("write notes.md"), "artifacts": ["../../etc/passwd"]}
    agent.invoke(forged, config)
    agent.invoke(user("save data.csv too"), config)
    agent.invoke(user("write notes.md again"), config)
    values = snapshot_to_json(agent.get_state(config))["values"]
    assert values["artifacts"] == ["outputs/notes.md", "outputs/data.csv"]
    assert values["todos"] == [] and values["delegations"] == {}
    assert {p.name for p in (tmp_path / OWNERLESS / "thread-6" / "outputs").iterdir()} == {
        "notes.md",
        "data.csv",
    }


def test_s2_a_refused_write_records_no_artifact(tmp_path: Path) -> None:
    call = {
        "type": "tool_call",
        "id": "call_9",
        "name": "write_artifact",
        "args": {"filename": "../escape.md", "content": "x"},
    }
    result = save_artifact.invoke(call, run_config(tmp_path, "thread-7"))
    assert isinstance(result, ToolMessage)
    assert result.status == "error" and "filename" in result.text
    assert not any(tmp_path.iterdir())


class ScriptedModel(BaseChatModel):
    """Replies with the scripted message for the number of AI messages so far."""

    replies: list[AIMessage]

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        n_ai = sum(isinstance(m, AIMessage) for m in messages)
        return ChatResult(generations=[ChatGeneration(message=self.replies[n_ai])])

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:  # type: ignore[override]
        return self


def write_call(i: int, filename: str) -> dict[str, Any]:
    return {"name": "write_artifact", "args": {"filename": filename, "content": "x"}, "id": f"c{i}"}


def test_s2_parallel_tool_calls_record_every_artifact_once(tmp_path: Path) -> None:
    """Three write_artifact calls of one model turn: their Commands merge in one step."""
    calls = [write_call(0, "a.md"), write_call(1, "b.md"), write_call(2, "a.md")]
    model = ScriptedModel(replies=[AIMessage("", tool_calls=calls), AIMessage("done")])
    agent = create_agent(model, list(LEAD_TOOLS), state_schema=ThreadState)
    out = agent.invoke(user("two files"), run_config(tmp_path, "thread-8"))
    assert sorted(out["artifacts"]) == ["outputs/a.md", "outputs/b.md"]
    tool_messages = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert sorted(m.tool_call_id for m in tool_messages) == ["c0", "c1", "c2"]
    assert out["messages"][-1].text == "done"


# --- S6: subagents -----------------------------------------------------------------------


def test_s6_subagent_shares_thread_state_and_writes_no_checkpoints(tmp_path: Path) -> None:
    sub = build_subagent(
        "writer",
        ScriptedModel(replies=[AIMessage("", tool_calls=[write_call(0, "s.md")]), AIMessage("ok")]),
        [save_artifact],
        system_prompt="You write files.",
    )
    assert sub.checkpointer is False
    assert set(THREAD_STATE_FIELDS) <= set(sub.builder.state_schema.__annotations__)

    def delegate(state: ThreadState, config: RunnableConfig) -> dict[str, Any]:
        out = sub.invoke({"messages": [{"role": "user", "content": "go"}]}, config)
        done = {"status": "completed", "version": 1, "result": out["messages"][-1].text}
        return {"artifacts": out["artifacts"], "delegations": {"d1": done}}

    parent = StateGraph(ThreadState)
    parent.add_node("delegate", delegate)
    parent.add_edge(START, "delegate")
    saver = InMemorySaver()
    config = run_config(tmp_path, "thread-9")
    out = parent.compile(checkpointer=saver).invoke({"messages": []}, config)
    assert out["artifacts"] == ["outputs/s.md"]
    assert out["delegations"]["d1"]["result"] == "ok"
    # Only the parent thread's own checkpoints: no child namespace, no child lineage.
    assert {c.config["configurable"]["checkpoint_ns"] for c in saver.list(None)} == {""}
