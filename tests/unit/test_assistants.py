"""A1: the pure rules of assistants (config/context sync, patches, the merge under a run's own
values, who may write), their request models, and the graph introspection shapes."""

from __future__ import annotations

import datetime as dt
import operator
import typing
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from pydantic import ValidationError

from app.schemas import (
    AssistantCreate,
    AssistantField,
    AssistantGraphQuery,
    AssistantUpdate,
    RunCreate,
    SubgraphsQuery,
)
from shared.assistants import graph_schemas
from shared.assistants.model import (
    ASSISTANT_FIELDS,
    Assistant,
    AssistantPatch,
    OnConflict,
    check_writable,
    merged_config,
    merged_context,
    synced,
)
from shared.errors import AssistantReadOnly, ValidationFailed
from shared.runs.model import RunRequest

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def assistant(**over: Any) -> Assistant:
    fields: dict[str, Any] = {
        "assistant_id": "a1",
        "graph_id": "lead_agent",
        "name": "mine",
        "version": 1,
        "created_at": NOW,
        "updated_at": NOW,
        "owner": "alice",
        "metadata": {"team": "x"},
        "config": {"configurable": {"tokens": 3}, "tags": ["a"]},
        "context": {"tokens": 3},
    }
    return Assistant(**{**fields, **over})


def test_sync_keeps_configurable_and_context_in_step() -> None:
    """config.configurable becomes the context, a context becomes config.configurable."""
    assert synced({"configurable": {"k": 1}}, None) == ({"configurable": {"k": 1}}, {"k": 1})
    assert synced({"tags": ["t"]}, {"k": 2}) == (
        {"tags": ["t"], "configurable": {"k": 2}},
        {"k": 2},
    )
    assert synced({}, None) == ({}, None)
    assert synced({}, {}) == ({}, {})


def test_sync_refuses_both_with_400() -> None:
    """Both configurable and context would disagree: 400 naming `context`."""
    with pytest.raises(ValidationFailed) as info:
        synced({"configurable": {"k": 1}}, {"k": 2})
    assert info.value.status == 400 and info.value.field == "context"


def test_patch_keeps_what_is_not_given_and_merges_metadata() -> None:
    """A PATCH replaces given fields, merges metadata, keeps an unsent config and context."""
    current = assistant()
    same = AssistantPatch().applied_to(current)
    assert (same.graph_id, same.name, same.config, same.context) == (
        "lead_agent",
        "mine",
        current.config,
        current.context,
    )
    new = AssistantPatch(
        name="renamed", metadata={"v": 2}, config={"configurable": {"tokens": 5}}
    ).applied_to(current)
    assert new.name == "renamed" and new.metadata == {"team": "x", "v": 2}
    assert new.config == {"configurable": {"tokens": 5}} and new.context == {"tokens": 5}
    by_context = AssistantPatch(context={"tokens": 7}).applied_to(current)
    assert by_context.config == {"configurable": {"tokens": 7}}
    assert by_context.context == {"tokens": 7}


def test_run_values_lie_on_top_of_the_assistant_version() -> None:
    """The run's config wins key-wise in configurable and metadata; its context key-wise."""
    base = {"configurable": {"tokens": 3, "model": "m"}, "tags": ["a"], "metadata": {"x": 1}}
    own = {"configurable": {"tokens": 5}, "metadata": {"y": 2}}
    assert merged_config(base, own) == {
        "configurable": {"tokens": 5, "model": "m"},
        "tags": ["a"],
        "metadata": {"x": 1, "y": 2},
    }
    assert merged_config({}, {}) == {}
    assert merged_config({}, {"tags": ["b"]}) == {"tags": ["b"]}
    assert merged_context({}, None) is None
    assert merged_context({"a": 1, "b": 1}, {"b": 2}) == {"a": 1, "b": 2}
    assert merged_context({"a": 1}, None) == {"a": 1}


def test_apply_to_names_the_assistant_and_merges() -> None:
    """A run on an assistant carries its id, and its version's config under its own."""
    request = RunRequest(
        thread_id="t", assistant_id="lead_agent", config={"configurable": {"x": 1}}
    )
    applied = request.on_assistant(assistant())
    assert applied.assistant_id == "a1" and applied.thread_id == "t"
    assert applied.config == {"configurable": {"tokens": 3, "x": 1}, "tags": ["a"]}
    assert applied.context == {"tokens": 3}


def test_system_assistants_are_read_only() -> None:
    """A system assistant is nobody's to change (403); one's own is."""
    check_writable(assistant(), "alice")
    with pytest.raises(AssistantReadOnly):
        check_writable(assistant(owner=None), "alice")
    assert assistant(owner=None).system and not assistant().system


def test_select_fields_match_the_sdk_shape() -> None:
    """The request model's Literal and the shape's field list are one list."""
    assert set(typing.get_args(AssistantField)) == set(ASSISTANT_FIELDS)


def test_create_and_update_models() -> None:
    """Unknown fields are ignored, bad values are 422; only the config keys given reach the
    assistant."""
    spec = AssistantCreate.model_validate(
        {"graph_id": "g", "config": {"configurable": {"k": 1}}, "if_exists": "do_nothing"}
    ).to_spec()
    assert spec.config == {"configurable": {"k": 1}} and spec.if_exists is OnConflict.DO_NOTHING
    assert spec.name is None and spec.metadata == {}
    assert AssistantCreate.model_validate({"graph_id": "g", "nme": "x"}).to_spec().name is None
    with pytest.raises(ValidationError):
        AssistantCreate.model_validate({"graph_id": "g", "assistant_id": "not-a-uuid"})
    patch = AssistantUpdate.model_validate({"metadata": {"a": 1}}).to_patch()
    assert patch == AssistantPatch(metadata={"a": 1})


def test_run_config_carries_only_given_keys() -> None:
    """A run's config has no empty defaults that would hide its assistant's tags or metadata."""
    request = RunCreate.model_validate(
        {"assistant_id": "a", "config": {"configurable": {"tokens": 2}}}
    ).to_request("t")
    assert request.config == {"configurable": {"tokens": 2}}


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [("true", True), ("False", False), ("1", 1), ("3", 3), (None, False)],
)
def test_xray_is_a_flag_or_a_depth(raw: str | None, parsed: bool | int) -> None:
    """`xray` true/false, or a depth >= 1 (kept an int: 1 is not True here)."""
    q = AssistantGraphQuery.model_validate({} if raw is None else {"xray": raw})
    assert q.xray == parsed and type(q.xray) is type(parsed)


@pytest.mark.parametrize("raw", ["0", "-2", "deep"])
def test_bad_xray_is_refused(raw: str) -> None:
    """Anything else is a 422 on `xray`."""
    with pytest.raises(ValidationError):
        AssistantGraphQuery.model_validate({"xray": raw})


def test_recurse_flag() -> None:
    """`recurse` reads the SDK's `true`/`false`."""
    assert SubgraphsQuery.model_validate({"recurse": "true"}).recurse is True
    assert SubgraphsQuery.model_validate({}).recurse is False


# --- graph introspection --------------------------------------------------------------------


class Inner(TypedDict):
    items: Annotated[list[str], operator.add]


class Outer(TypedDict):
    items: Annotated[list[str], operator.add]
    count: int


@dataclass
class Ctx:
    model: str = "m"


def _graph() -> Any:
    inner = StateGraph(Inner)
    inner.add_node("step", lambda s: {"items": ["i"]})
    inner.add_edge(START, "step")
    inner.add_edge("step", END)
    outer = StateGraph(Outer, context_schema=Ctx)
    outer.add_node("child", inner.compile())
    outer.add_node("last", lambda s: {"count": 1})
    outer.add_edge(START, "child")
    outer.add_edge("child", "last")
    outer.add_edge("last", END)
    return outer.compile(name="outer")


def test_drawing_is_nodes_and_edges_without_import_paths() -> None:
    """`get_graph().to_json()` without node class paths; xray draws the subgraph's nodes."""
    flat = graph_schemas.drawing(_graph(), False)
    ids = {n["id"] for n in flat["nodes"]}
    assert {"__start__", "child", "last", "__end__"} <= ids
    assert all(
        "id" not in n.get("data", {}) for n in flat["nodes"] if isinstance(n.get("data"), dict)
    )
    assert {"source": "child", "target": "last"} in [
        {"source": e["source"], "target": e["target"]} for e in flat["edges"]
    ]
    deep = graph_schemas.drawing(_graph(), True)
    assert any(n["id"].startswith("child:") for n in deep["nodes"])


def test_schemas_of_a_graph_and_its_subgraphs() -> None:
    """Input, output, state, config and context schemas; subgraphs by namespace."""
    out = graph_schemas.schemas(_graph())
    assert set(out) == {
        "input_schema",
        "output_schema",
        "state_schema",
        "config_schema",
        "context_schema",
    }
    assert set(out["state_schema"]["properties"]) == {"items", "count"}
    assert out["context_schema"]["properties"]["model"]["default"] == "m"
    assert "model" in out["config_schema"]["properties"]
    subs = graph_schemas.subgraph_schemas(_graph(), None, False)
    assert list(subs) == ["child"]
    assert set(subs["child"]["state_schema"]["properties"]) == {"items"}
    assert subs["child"]["context_schema"] is None and subs["child"]["config_schema"] == {}
    assert graph_schemas.subgraph_schemas(_graph(), "nope", True) == {}
