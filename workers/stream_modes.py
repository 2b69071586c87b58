"""A run's LangGraph stream as the Agent Server's events, for the stream modes a client asked.

LangGraph has one `messages` stream mode: `(message chunk, metadata)` tuples. The Agent
Server offers it twice: `messages-tuple` sends those tuples as they are (event `messages`),
and `messages` sends what a chat UI renders: `messages/metadata` the first time a message
id appears, then `messages/partial` with the whole message accumulated so far for each
chunk, or `messages/complete` for a message that arrived whole. Every other mode passes
through unchanged. Which LangGraph mode feeds each requested one is the table of
`shared/vocab.py`. Events of a subgraph carry its namespace as `|ns` after the name.

The `events` mode is LangChain's `astream_events` (v2): the run is driven through it, every
callback event is sent as an `events` event, and the graph's own stream (the root run's
`on_chain_stream` events) still feeds the other modes, so one execution serves them all.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, BaseMessageChunk, message_chunk_to_message

from shared.vocab import graph_modes

__all__ = ["EVENTS_MODE", "HIDDEN_TAG", "StreamTranslator", "graph_modes"]

EVENTS_MODE = "events"
HIDDEN_TAG = "langsmith:hidden"
"""Callback events of runs tagged so are internal (LangChain's convention): never sent."""


class StreamTranslator:
    """Turns one run's LangGraph stream items into `(event name, data)` pairs."""

    def __init__(self, requested: Sequence[str], *, subgraphs: bool) -> None:
        self._subgraphs = subgraphs
        self._requested = frozenset(requested)
        self._tuples = "messages-tuple" in requested
        self._messages = "messages" in requested
        self._seen: dict[str, BaseMessage] = {}

    @property
    def wants_events(self) -> bool:
        """Whether the run must be driven through `astream_events` (the `events` mode)."""
        return EVENTS_MODE in self._requested

    def callback_event(self, event: Mapping[str, Any], root_run_id: str) -> list[tuple[str, Any]]:
        """The events for one `astream_events` v2 event of the run whose root is `root_run_id`."""
        if event.get("event") == "on_chain_stream" and event.get("run_id") == root_run_id:
            return self.events(event["data"]["chunk"])  # the graph's own stream item
        if HIDDEN_TAG in (event.get("tags") or ()):
            return []
        return [(EVENTS_MODE, event)]

    def events(self, item: Any) -> list[tuple[str, Any]]:
        """The events for one item of `graph.astream(..., stream_mode=[...])`."""
        if self._subgraphs:
            ns, mode, chunk = item
            suffix = "|" + "|".join(ns) if ns else ""
        else:
            mode, chunk = item
            suffix = ""
        if mode != "messages":
            # A mode LangGraph needs a stream mode for but nobody asked (`events` alone).
            return [(mode + suffix, chunk)] if mode in self._requested else []
        out: list[tuple[str, Any]] = []
        if self._tuples:
            out.append(("messages" + suffix, chunk))
        if self._messages:
            out.extend((name + suffix, data) for name, data in self._message_events(chunk))
        return out

    def _message_events(self, chunk: Any) -> list[tuple[str, Any]]:
        message, metadata = chunk
        if not isinstance(message, BaseMessage):
            return []
        # A message without an id cannot be accumulated with its other chunks: key it alone.
        key = message.id or f"run-{uuid.uuid4()}"
        out: list[tuple[str, Any]] = []
        before = self._seen.get(key)
        if before is None:
            self._seen[key] = message
            out.append(("messages/metadata", {key: {"metadata": metadata}}))
        elif isinstance(before, BaseMessageChunk) and isinstance(message, BaseMessageChunk):
            self._seen[key] = before + message
        else:
            self._seen[key] = message  # a whole message replaces what was streamed of it
        whole = self._seen[key]
        if isinstance(whole, BaseMessageChunk):
            whole = message_chunk_to_message(whole)
        kind = "messages/partial" if isinstance(message, BaseMessageChunk) else "messages/complete"
        out.append((kind, [whole]))
        return out
