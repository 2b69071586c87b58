"""S1/S2 at the graph level: ThreadState's channels, schema assembly, concurrent writes."""

from __future__ import annotations

import operator
from typing import Annotated, Any, NotRequired

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, AgentState, TodoListMiddleware
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Overwrite

from shared.agent.model import BuiltinChatModel
from shared.state import reducers
from shared.state.reducers import SandboxConflict, add_messages, merge_delegations
from shared.state.thread_state import THREAD_STATE_FIELDS, ThreadState

S1_FIELDS = {
    "messages",
    "sandbox",
    "thread_data",
    "title",
    "artifacts",
    "todos",
    "goal",
    "uploaded_files",
    "viewed_images",
    "promoted",
    "delegations",
    "skill_context",
    "summary_text",
    "background_tasks",
}

REDUCERS = {
    "messages": add_messages,
    "sandbox": reducers.merge_sandbox,
    "thread_data": reducers.keep_last,
    "title": reducers.keep_last,
    "artifacts": reducers.merge_artifacts,
    "todos": reducers.merge_todos,
    "goal": reducers.keep_last,
    "uploaded_files": reducers.merge_uploaded_files,
    "viewed_images": reducers.merge_viewed_images,
    "promoted": reducers.merge_promoted,
    "delegations": reducers.merge_delegations,
    "skill_context": reducers.keep_last,
    "summary_text": reducers.keep_last,
    "background_tasks": reducers.merge_background_tasks,
}


def operators(graph: Any, keys: Any) -> dict[str, Any]:
    """Channel class and reducer of each key, as the compiled graph will run them."""
    return {
        k: (type(graph.channels[k]), getattr(graph.channels[k], "operator", None)) for k in keys
    }


def state_only(schema: Any, checkpointer: Any = None) -> CompiledStateGraph[Any]:
    """A graph of `schema` whose only node does nothing (to read or update state)."""
    graph = StateGraph(schema)
    graph.add_node("noop", lambda state: {})
    graph.add_edge(START, "noop")
    return graph.compile(checkpointer=checkpointer)


# --- S1: the schema ----------------------------------------------------------------------


def test_s1_thread_state_has_every_field_and_extends_agent_state() -> None:
    assert set(THREAD_STATE_FIELDS) == S1_FIELDS
    assert set(ThreadState.__annotations__) >= S1_FIELDS
    assert set(AgentState.__annotations__) <= set(ThreadState.__annotations__)
    assert "messages" in ThreadState.__required_keys__
    assert not (S1_FIELDS - {"messages"}) & ThreadState.__required_keys__


def test_s2_each_channel_folds_with_its_reducer() -> None:
    channels = StateGraph(ThreadState).channels
    assert {k: getattr(channels[k], "operator", None) for k in S1_FIELDS} == REDUCERS


def test_s1_create_agent_merges_middleware_channels_and_thread_state_wins() -> None:
    """S1 "the final schema is the assembled one": create_agent does the assembly.

    Middleware schemas are merged in order, then state_schema last, so a middleware adds
    its channels and a field ThreadState also declares keeps ThreadState's reducer
    (LangChain's todo middleware declares `todos` with no reducer at all).
    """

    class NotesState(AgentState[Any]):
        notes: NotRequired[Annotated[list[str], operator.add]]
        title: NotRequired[str]  # a clash: ThreadState's keep_last must win

    class Notes(AgentMiddleware[NotesState, Any]):
        state_schema = NotesState

    agent = create_agent(
        BuiltinChatModel(),
        [],
        state_schema=ThreadState,
        middleware=[Notes(), TodoListMiddleware()],
    )
    assert getattr(agent.channels["notes"], "operator", None) is operator.add
    assert operators(agent, S1_FIELDS) == operators(state_only(ThreadState), S1_FIELDS)

    # The assembled schema of a built graph is its builder's; a state-only graph (S5
    # rollback/compaction) built on it folds every channel exactly as the agent does.
    assembled = agent.builder.state_schema
    keys = set(assembled.__annotations__)
    assert keys == S1_FIELDS | {"notes", "jump_to", "structured_response"}
    assert operators(state_only(assembled), keys) == operators(agent, keys)


def test_s1_run_input_carries_only_messages_title_and_goal(tmp_path: Any) -> None:
    """Runtime-derived fields are OmitFromInput: a run's input cannot forge them (G3)."""
    agent = create_agent(BuiltinChatModel(tokens=3), [], state_schema=ThreadState)
    assert set(agent.get_input_jsonschema()["properties"]) == {"messages", "title", "goal"}
    assert set(agent.get_output_jsonschema()["properties"]) >= S1_FIELDS
    out = agent.invoke(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "title": "Ducks",
            "sandbox": {"sandbox_id": "someone-elses"},
            "artifacts": ["../../etc/passwd"],
            "delegations": {"d1": {"status": "completed"}},
        }
    )
    assert out["title"] == "Ducks"
    assert "sandbox" not in out
    assert out["artifacts"] == []
    assert out["delegations"] == {}


# --- S2 through LangGraph: concurrent writes in one super-step ---------------------------


def two_writers(write_a: dict[str, Any], write_b: dict[str, Any]) -> CompiledStateGraph[Any]:
    """START fans out to nodes a and b: their writes land in the same super-step, a first."""
    graph = StateGraph(ThreadState)
    graph.add_node("a", lambda state: write_a)
    graph.add_node("b", lambda state: write_b)
    graph.add_edge(START, "a")
    graph.add_edge(START, "b")
    return graph.compile()


STATUSES = ["pending", "running", "completed", "failed", "cancelled"]
record = st.fixed_dictionaries(
    {"status": st.sampled_from(STATUSES), "version": st.integers(0, 2)},
    optional={"result": st.sampled_from(["ok", "partial"])},
)
ledgers = st.dictionaries(st.sampled_from(["d1", "d2"]), record, max_size=2)
path_lists = st.lists(st.sampled_from(["outputs/a.md", "outputs/b.md", "outputs/c.md"]))


def test_s2_parallel_nodes_writes_are_applied_in_a_fixed_order() -> None:
    """The baseline: LangGraph applies a's writes before b's, so the orders below differ."""
    ab = two_writers({"artifacts": ["outputs/a.md"]}, {"artifacts": ["outputs/b.md"]})
    ba = two_writers({"artifacts": ["outputs/b.md"]}, {"artifacts": ["outputs/a.md"]})
    assert ab.invoke({"messages": []})["artifacts"] == ["outputs/a.md", "outputs/b.md"]
    assert ba.invoke({"messages": []})["artifacts"] == ["outputs/b.md", "outputs/a.md"]


@settings(max_examples=40, deadline=None)
@given(
    start=st.fixed_dictionaries({"artifacts": path_lists, "delegations": ledgers}),
    a=st.fixed_dictionaries({"artifacts": path_lists, "delegations": ledgers}),
    b=st.fixed_dictionaries({"artifacts": path_lists, "delegations": ledgers}),
)
def test_s2_two_parallel_nodes_give_the_same_state_in_both_orders(
    start: dict[str, Any], a: dict[str, Any], b: dict[str, Any]
) -> None:
    first = two_writers(a, b).invoke({"messages": [], **start})
    second = two_writers(b, a).invoke({"messages": [], **start})
    assert first["delegations"] == second["delegations"]
    assert first["delegations"] == merge_delegations(
        merge_delegations(start["delegations"], a["delegations"]), b["delegations"]
    )
    assert set(first["artifacts"]) == set(second["artifacts"])
    assert set(first["artifacts"]) == set(start["artifacts"] + a["artifacts"] + b["artifacts"])
    assert len(first["artifacts"]) == len(set(first["artifacts"]))


def test_s2_terminal_delegation_survives_a_stale_parallel_write() -> None:
    done = {"d1": {"status": "completed", "version": 3, "result": "ok"}}
    stale = {"d1": {"status": "running", "version": 2}}
    for pair in ((done, stale), (stale, done)):
        out = two_writers({"delegations": pair[0]}, {"delegations": pair[1]}).invoke(
            {"messages": []}
        )
        assert out["delegations"] == done


def test_s2_same_sandbox_from_two_parallel_nodes_is_one_sandbox() -> None:
    same = {"sandbox": {"sandbox_id": "sb-1"}}
    assert two_writers(same, dict(same)).invoke({"messages": []})["sandbox"] == {
        "sandbox_id": "sb-1"
    }


def test_s2_two_sandboxes_in_one_step_raise_through_invoke() -> None:
    graph = two_writers({"sandbox": {"sandbox_id": "sb-1"}}, {"sandbox": {"sandbox_id": "sb-2"}})
    with pytest.raises(SandboxConflict, match="sb-1.*sb-2"):
        graph.invoke({"messages": []})


def sandbox_graph() -> CompiledStateGraph[Any]:
    """One node that binds the sandbox the run's config names."""

    def acquire(state: ThreadState, config: RunnableConfig) -> dict[str, Any]:
        return {"sandbox": {"sandbox_id": config["configurable"]["sandbox"]}}

    graph = StateGraph(ThreadState)
    graph.add_node("acquire", acquire)
    graph.add_edge(START, "acquire")
    return graph.compile(checkpointer=InMemorySaver())


def cfg(sandbox: str, thread_id: str = "t") -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "sandbox": sandbox}}


def test_s2_a_state_update_with_another_sandbox_is_refused() -> None:
    graph = sandbox_graph()
    graph.invoke({"messages": []}, cfg("sb-1"))
    graph.invoke({"messages": []}, cfg("sb-1"))  # the same id again: idempotent
    with pytest.raises(SandboxConflict):
        graph.update_state(cfg("sb-1"), {"sandbox": {"sandbox_id": "sb-2"}})
    assert graph.get_state(cfg("sb-1")).values["sandbox"] == {"sandbox_id": "sb-1"}

    # The deliberate escape hatch (an operator rebinding a thread): Overwrite skips the
    # reducer. Nothing in the agent writes one.
    graph.update_state(cfg("sb-1"), {"sandbox": Overwrite({"sandbox_id": "sb-2"})})
    assert graph.get_state(cfg("sb-1")).values["sandbox"] == {"sandbox_id": "sb-2"}


def test_s2_a_run_with_another_sandbox_fails_closed_and_stays_failed() -> None:
    """The conflicting write stays pending on the head checkpoint: reading or resuming that
    checkpoint raises again, nothing ever picks one id; a new input starts from the last
    good values (sb-1), without the refused write."""
    graph = sandbox_graph()
    graph.invoke({"messages": []}, cfg("sb-1"))
    with pytest.raises(SandboxConflict):
        graph.invoke({"messages": []}, cfg("sb-2"))
    with pytest.raises(SandboxConflict):
        graph.get_state(cfg("sb-1"))
    with pytest.raises(SandboxConflict):
        graph.invoke(None, cfg("sb-1"))
    assert graph.invoke({"messages": []}, cfg("sb-1"))["sandbox"] == {"sandbox_id": "sb-1"}


def test_s2_state_survives_a_checkpoint_round_trip() -> None:
    """Every channel's value is plain data the checkpoint serializer stores and restores."""
    values: dict[str, Any] = {
        "sandbox": {"sandbox_id": "sb-1"},
        "thread_data": {"workspace_path": "/w/t", "outputs_path": "/w/t/outputs"},
        "title": "Ducks",
        "artifacts": ["outputs/a.md"],
        "todos": [{"content": "draft", "status": "in_progress"}],
        "goal": "a report",
        "uploaded_files": [{"path": "uploads/x.csv", "size": 3}],
        "viewed_images": [{"path": "uploads/y.png", "mime_type": "image/png"}],
        "promoted": {"catalog_hash": "h1", "items": ["web"]},
        "delegations": {"d1": {"status": "completed", "version": 1, "result": "ok"}},
        "skill_context": "skill: charts",
        "summary_text": "earlier: hello",
        "background_tasks": {"b1": {"status": "running", "version": 0}},
    }
    graph = StateGraph(ThreadState)
    graph.add_node("write", lambda state: values)
    graph.add_edge(START, "write")
    saver = InMemorySaver()
    config: RunnableConfig = {"configurable": {"thread_id": "t"}}
    graph.compile(checkpointer=saver).invoke({"messages": []}, config)
    restored = state_only(ThreadState, saver).get_state(config).values
    assert {k: restored[k] for k in values} == values
