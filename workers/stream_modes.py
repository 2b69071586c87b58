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

Thread ids (A4): with `ids` set (workers/public_ids.py, a client-chosen thread) every
event is written with the thread's public id at the positions that hold a thread id (the
metadata of each token chunk above all), so the web relays it without parsing it; until it
is set, or for a thread it is never set for, the events name the storage id and the web
translates them as it always did (shared/runs/thread_ids.py, `PublicIds.at_source`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, BaseMessageChunk, message_chunk_to_message

from shared.runs.thread_ids import PublicIds
from shared.vocab import graph_modes

__all__ = ["EVENTS_MODE", "HIDDEN_TAG", "StreamTranslator", "graph_modes"]

EVENTS_MODE = "events"
THREAD_MODES = frozenset({"messages", "messages-tuple", "checkpoints", "debug", EVENTS_MODE})
"""The stream modes whose events hold the thread id (shared/runs/thread_ids.py `ID_EVENTS`;
the `metadata` event is the worker's own and names no thread)."""
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
        self.ids: PublicIds | None = None
        """The thread's public id to write at the id positions (None: leave the storage id)."""
        self.lookup: asyncio.Future[None] | None = None  # the lookup that sets `ids`, if any

    @property
    def names_threads(self) -> bool:
        """Whether events of the requested modes name the run's thread (token chunks'
        metadata, checkpoint configs, callback events): worth writing its public id into."""
        return not self._requested.isdisjoint(THREAD_MODES)

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
        return self._written([(EVENTS_MODE, event)])

    def events(self, item: Any) -> list[tuple[str, Any]]:
        """The events for one item of `graph.astream(..., stream_mode=[...])`."""
        return self._written(self._events(item))

    def _written(self, out: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """The events with the public id at their id positions (copies: the graph's
        objects are never changed), when there is one to write."""
        ids = self.ids
        if ids is None or not out:
            return out
        return [(name, ids.event_data(name, data)) for name, data in out]

    def _events(self, item: Any) -> list[tuple[str, Any]]:
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
