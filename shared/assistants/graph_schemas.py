"""What a compiled graph says about itself, in the LangGraph Agent Server's JSON shapes:
its drawing (`GET /assistants/{id}/graph`), its JSON Schemas (`…/schemas`) and those of
its subgraphs (`…/subgraphs`). Plain functions over a `Pregel`, no IO."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from langgraph.channels.base import BaseChannel
from langgraph.pregel import Pregel
from pydantic import TypeAdapter, create_model

from shared.vocab import JSONObject

log = logging.getLogger(__name__)

Graph = Pregel[Any, Any, Any, Any]

EXCLUDED_CONFIG_KEYS = (
    "__pregel_checkpointer",
    "__pregel_store",
    "checkpoint_id",
    "checkpoint_ns",
    "thread_id",
)
"""Runtime keys of `configurable` that no client sets, left out of the config schema."""


def drawing(graph: Graph, xray: bool | int) -> JSONObject:
    """The graph's nodes and edges (`get_graph(xray).to_json()`), without the node classes'
    import paths, as the LangGraph Agent Server answers. NotImplementedError when the
    graph cannot be drawn."""
    drawn: JSONObject = graph.get_graph(xray=xray).to_json()
    for node in drawn.get("nodes", []):
        data = node.get("data")
        if isinstance(data, dict):
            data.pop("id", None)
    return drawn


def schemas(graph: Graph) -> JSONObject:
    """The input, output, state, config and context JSON Schemas; a schema the graph
    cannot give is None (logged), never an error for the whole answer."""
    return {
        "input_schema": _or_none(graph, "input", graph.get_input_jsonschema),
        "output_schema": _or_none(graph, "output", graph.get_output_jsonschema),
        "state_schema": _or_none(graph, "state", lambda: state_jsonschema(graph)),
        "config_schema": _or_none(graph, "config", lambda: config_jsonschema(graph)),
        "context_schema": _or_none(graph, "context", graph.get_context_jsonschema),
    }


def subgraph_schemas(graph: Graph, namespace: str | None, recurse: bool) -> dict[str, JSONObject]:
    """`{namespace: schemas}` of the graph's subgraphs (only `namespace` when given)."""
    return {
        ns: schemas(sub)
        for ns, sub in graph.get_subgraphs(namespace=namespace, recurse=recurse)
        if isinstance(sub, Pregel)  # a remote graph would describe itself over the network
    }


def state_jsonschema(graph: Graph) -> JSONObject:
    """A model of the graph's stream channels, each typed by its update type, or `Any`
    where that type has no JSON Schema (the LangGraph Agent Server's construction)."""
    fields: dict[str, Any] = {}
    for name in graph.stream_channels_list:
        channel = graph.channels[name]
        update_type = channel.UpdateType if isinstance(channel, BaseChannel) else Any
        try:
            TypeAdapter(update_type).json_schema()
        except Exception:  # noqa: BLE001 - any type pydantic cannot describe becomes Any
            update_type = Any
        fields[name] = (update_type, None)
    schema: JSONObject = create_model(graph.get_name("State"), **fields).model_json_schema()
    return schema


def config_jsonschema(graph: Graph) -> JSONObject:
    """The schema of `config.configurable`: the graph's context schema (what LangGraph 1.x
    puts under `configurable`), without runtime keys; `{}` for a graph without one.

    Built from `get_context_jsonschema` rather than the deprecated `config_schema()`,
    which since LangGraph 1.0 wraps exactly that schema.
    """
    schema = graph.get_context_jsonschema()
    if not schema:
        return {}
    for key in EXCLUDED_CONFIG_KEYS:
        schema.get("properties", {}).pop(key, None)
    return schema


def _or_none(graph: Graph, what: str, build: Callable[[], JSONObject | None]) -> JSONObject | None:
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 - one missing schema must not fail the others
        log.warning("no %s schema for graph %s: %r", what, graph.name, exc)
        return None
