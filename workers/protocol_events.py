"""A run's stream as LangChain protocol events, for the thread streaming protocol
(`client.threads.stream`, app/protocols/thread_stream/).

A run admitted by that protocol (`StreamOptions.protocol_events`) is driven through
LangGraph's own protocol stream, `graph.astream_events(version="v3")`: LangGraph builds the
content-block `messages` events (message-start, content-block-start/-delta/-finish,
message-finish), the subgraph `lifecycle` events and the namespaces, so nothing here
reconstructs them from chunks. The transformers below add the channels the protocol defines
beside LangGraph's built-in values/messages/lifecycle: `updates`, `custom` (and a named
`custom:<name>` channel as `custom` with `{name, payload}`), `checkpoints` (reduced to the
protocol's `Checkpoint`: id, parent_id, step, source), `tasks` and `tools`.

Each event is published to the run's Redis Stream as `(method, params)`, so it has the
bridge's fencing, exact replay and gap rule like every event; the web front end adds the
envelope (`type`, `seq`, `event_id`) and what the protocol synthesizes from the run's
durable status (root lifecycle, `input.requested`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from langgraph.stream import (
    CheckpointsTransformer,
    CustomTransformer,
    StreamTransformer,
    TasksTransformer,
    UpdatesTransformer,
)

from shared.vocab import PROTOCOL_METHODS

__all__ = ["PROTOCOL_TRANSFORMERS", "ProtocolTranslator"]

# LangGraph marks its v3 stream experimental with a warning at every run; that it is, is
# said once here (and in docs/thread-stream.md), not in every worker log line.
warnings.filterwarnings("ignore", message="The v3 streaming protocol", category=Warning)


class ToolsTransformer(StreamTransformer):
    """LangGraph's `tools` stream mode (tool-started / -output-delta / -finished / -error)
    into the protocol's `tools` channel, as it is."""

    required_stream_modes: ClassVar[tuple[str, ...]] = ("tools",)

    def init(self) -> dict[str, Any]:
        """No projection of its own: the events go to the main log."""
        return {}

    def process(self, event: Any) -> bool:
        """Keep every event."""
        return True


class EarlyTasksTransformer(TasksTransformer):
    """`tasks` events reach the main log: LangGraph's lifecycle transformers fold them
    away, so this one runs before them."""

    before_builtins: ClassVar[bool] = True


PROTOCOL_TRANSFORMERS: Sequence[type[StreamTransformer]] = (
    UpdatesTransformer,
    CustomTransformer,
    CheckpointsTransformer,
    EarlyTasksTransformer,
    ToolsTransformer,
)
"""The channels LangGraph's v3 stream gives beside its built-in values/messages/lifecycle."""


def _checkpoint(data: Any) -> dict[str, Any] | None:
    """A `checkpoints` stream item as the protocol's `Checkpoint` (id, parent_id, step,
    source); None for a payload without an id."""
    if not isinstance(data, Mapping):
        return None
    configurable = (data.get("config") or {}).get("configurable") or {}
    checkpoint_id = configurable.get("checkpoint_id")
    if not isinstance(checkpoint_id, str):
        return None
    out: dict[str, Any] = {"id": checkpoint_id}
    parent = ((data.get("parent_config") or {}).get("configurable") or {}).get("checkpoint_id")
    if isinstance(parent, str):
        out["parent_id"] = parent
    metadata = data.get("metadata") or {}
    out["step"] = metadata.get("step", -1)
    out["source"] = metadata.get("source", "loop")
    return out


class ProtocolTranslator:
    """One v3 `ProtocolEvent` -> the `(method, params)` pairs the run publishes."""

    def events(self, event: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The pairs for one event (none for a method the protocol does not carry)."""
        method = str(event.get("method", ""))
        params = dict(event.get("params") or {})
        data = params.get("data")
        if method.startswith("custom:"):
            params["data"] = {"name": method.removeprefix("custom:"), "payload": data}
            method = "custom"
        elif method == "custom":
            params["data"] = {"payload": data}
        elif method == "messages":
            # (content-block event, metadata): the protocol carries the event; the metadata
            # (LangChain's run bookkeeping) stays out of the stream.
            if isinstance(data, (list, tuple)) and data and isinstance(data[0], Mapping):
                params["data"] = data[0]
            if not isinstance(params["data"], Mapping) or "event" not in params["data"]:
                return []  # a legacy whole-message tuple: the protocol has no shape for it
        elif method == "lifecycle" and isinstance(data, Mapping) and "namespace" in data:
            # LangGraph's lifecycle payload names the subgraph; on the wire that is the
            # event's namespace (the mux's own scope is its parent's).
            body = dict(data)
            params["namespace"] = list(body.pop("namespace") or [])
            params["data"] = body
        elif method == "checkpoints":
            checkpoint = _checkpoint(data)
            if checkpoint is None:
                return []
            params["data"] = checkpoint
        if method not in PROTOCOL_METHODS:
            return []
        return [(method, params)]
