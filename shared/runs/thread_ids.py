"""Thread ids are per owner (A4): public ids and storage ids.

A thread has a *public id*, the one its owner sees and sends, and a *storage id*, the
global key of `threads.thread_id` that every table, the checkpointer, Redis keys and the
workspaces use. A thread the server names has one id for both. A thread whose id the
client chose is stored under `storage_id(owner, public_id)`, always, whether or not
another user has a thread with that public id: one user's choice never meets another
user's thread, so `POST /threads {"thread_id": X}` answers the same whoever else has X
(no 409 telling that X exists, no id squatted ahead of the client that will choose it).

The web translates at its edges: a client's id is resolved to the storage id on the way
in (`RunStore.resolve_thread_id`), and on the way out every storage id it resolved is
written back as the public id *at the positions that hold a thread id* (`PublicIds`): the
`thread_id` of a thread, run, cron, journal event or memory fact, the `configurable` of a
checkpoint config, a checkpoint's own `thread_id`, the `thread_id` LangGraph writes into a
checkpoint's or a stream chunk's metadata. Nothing else is looked at: what a user wrote
(metadata, values, input, messages, a run's config apart from its thread id) comes back
as it went in, whatever ids it holds, and every id is looked up once, so one thread's
public id equal to another's storage id is never translated twice.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from shared import serde

OWNER_NAMESPACE = uuid.UUID("6f0f7a44-5d1e-4c57-9a53-0d6c2f1b7e21")
"""The root of the per-owner namespaces (fixed: changing it would orphan every stored
client-chosen thread)."""


def owner_namespace(owner: str) -> uuid.UUID:
    """The uuid5 namespace of one owner's client-chosen thread ids."""
    return uuid.uuid5(OWNER_NAMESPACE, owner)


def storage_id(owner: str, public_id: str) -> str:
    """Where `owner`'s thread with the client-chosen `public_id` is stored."""
    return str(uuid.uuid5(owner_namespace(owner), str(uuid.UUID(public_id))))


ID_EVENTS = frozenset(
    {"metadata", "checkpoints", "debug", "messages", "messages/metadata", "events"}
)
"""The stream events whose data holds a thread id (`event_data`); every other event
(values, updates, custom, tasks, messages/partial, ...) is the graph's own and is relayed
as it is."""

_UUID_TEXT = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)

Shape = Callable[["PublicIds", Any], None]
"""Writes public ids at one JSON shape's id positions, in place."""


class PublicIds:
    """One caller's storage id -> public id map, written at thread-id positions only.

    `aliases` is read live (a WebSocket session's map grows as its frames name threads).
    Each method takes freshly decoded JSON and changes it in place; values of any other
    type or shape are left alone, so a malformed body is relayed as it came.
    """

    __slots__ = ("_known", "_storage", "aliases")

    def __init__(self, aliases: Mapping[str, str]) -> None:
        self.aliases = aliases
        self._known = -1
        self._storage: list[tuple[str, bytes]] = []

    def __bool__(self) -> bool:
        return bool(self._storages())

    def _storages(self) -> list[tuple[str, bytes]]:
        if self._known != len(self.aliases):  # the map only grows: re-read it when it did
            self._storage = [(s, s.encode()) for s, p in self.aliases.items() if s != p]
            self._known = len(self.aliases)
        return self._storage

    def occurs_in(self, data: str | bytes) -> bool:
        """Whether a storage id occurs anywhere in `data` (the cheap test before a parse)."""
        if isinstance(data, bytes):
            return any(b in data for _, b in self._storages())
        return any(s in data for s, _ in self._storages())

    def public(self, value: Any) -> Any:
        """The public id of a storage id (anything else as it is)."""
        return self.aliases.get(value, value) if isinstance(value, str) else value

    def text(self, value: str) -> str:
        """A server-made message or header with every storage id in it as its public id
        (one lookup per UUID in the text, so nothing is translated twice)."""
        if not self:
            return value
        return _UUID_TEXT.sub(lambda m: self.aliases.get(m[0], m[0]), value)

    # -- the typed shapes ----------------------------------------------------------------------
    def owned(self, obj: Any, key: str = "thread_id") -> None:
        """A record that names its thread (thread, run, cron, journal event, checkpoint)."""
        if isinstance(obj, dict) and key in obj:
            obj[key] = self.public(obj[key])

    def config(self, obj: Any) -> None:
        """A RunnableConfig: its `configurable.thread_id`."""
        if isinstance(obj, dict):
            self.owned(obj.get("configurable"))

    def run(self, obj: Any) -> None:
        """A run: its thread and the thread id of its config."""
        self.owned(obj)
        kwargs = obj.get("kwargs") if isinstance(obj, dict) else None
        if isinstance(kwargs, dict):
            self.config(kwargs.get("config"))

    def snapshot(self, obj: Any) -> None:
        """A state snapshot (state, history, a `checkpoints` event): its configs, its
        checkpoints, the thread id LangGraph puts in its metadata, its tasks' subgraph states."""
        if not isinstance(obj, dict):
            return
        self.config(obj.get("config"))
        self.config(obj.get("parent_config"))
        self.owned(obj.get("checkpoint"))
        self.owned(obj.get("parent_checkpoint"))
        self.owned(obj.get("metadata"))
        tasks = obj.get("tasks")
        for task in tasks if isinstance(tasks, list) else ():
            state = task.get("state") if isinstance(task, dict) else None
            if isinstance(state, dict) and "configurable" in state:
                self.config(state)
            else:
                self.snapshot(state)

    def event_data(self, name: str, data: Any) -> None:
        """A stream event's data, by the event's name (`|namespace` suffix allowed)."""
        mode = name.split("|", 1)[0]
        if mode == "metadata":
            self.owned(data)
        elif mode == "checkpoints":
            self.snapshot(data)
        elif mode == "debug":
            if isinstance(data, dict) and data.get("type") == "checkpoint":
                self.snapshot(data.get("payload"))
        elif mode == "messages":  # [chunk, metadata]: LangGraph's metadata of the chunk
            if isinstance(data, list) and len(data) == 2:
                self.owned(data[1])
        elif mode == "messages/metadata":  # {message id: {"metadata": ...}}
            for entry in data.values() if isinstance(data, dict) else ():
                if isinstance(entry, dict):
                    self.owned(entry.get("metadata"))
        elif mode == "events" and isinstance(data, dict):  # astream_events' metadata
            self.owned(data.get("metadata"))

    def event_text(self, name: str, data: str) -> str:
        """An event's encoded data with its ids translated; the same string when the
        event holds no thread id or no storage id occurs in it (no parse: the hot path)."""
        if name.split("|", 1)[0] not in ID_EVENTS or not self.occurs_in(data):
            return data
        return self.event_bytes(name, data.encode()).decode()

    def event_bytes(self, name: str, data: bytes) -> bytes:
        """`event_text` on bytes, for data a storage id was seen in."""
        if name.split("|", 1)[0] not in ID_EVENTS:
            return data
        try:
            obj = serde.loads(data)
        except ValueError:
            return data
        self.event_data(name, obj)
        return serde.dumps(obj)

    def protocol(self, message: Any) -> None:
        """A thread streaming protocol message (event, error, command answer)."""
        if not isinstance(message, dict):
            return
        kind = message.get("type")
        if kind == "event":
            params = message.get("params")
            if isinstance(params, dict) and isinstance(message.get("method"), str):
                self.event_data(message["method"], params.get("data"))
        elif kind == "error":
            self.message(message)
        elif kind == "success":
            self.owned(message.get("result"))

    def message(self, obj: Any) -> None:
        """An error body's server-made `message` / `detail` / `error` texts."""
        if isinstance(obj, dict):
            for key in ("message", "detail"):
                if isinstance(obj.get(key), str):
                    obj[key] = self.text(obj[key])

    def ws_frame(self, text: str) -> str:
        """One WebSocket frame of docs/websocket.md, translated at its id positions."""
        if not self.occurs_in(text):
            return text
        try:
            frame = serde.loads(text)
        except ValueError:
            return text
        if not isinstance(frame, dict):
            return text
        kind = frame.get("type")
        if kind == "event" and isinstance(frame.get("event"), str):
            self.event_data(frame["event"], frame.get("data"))
        elif kind == "run.created":
            self.run(frame.get("run"))
        elif kind == "error":
            self.message(frame)
        else:
            self.owned(frame)
        return serde.dumps_str(frame)


def each(shape: Shape) -> Shape:
    """The shape of a list of `shape`."""

    def walk(ids: PublicIds, obj: Any) -> None:
        for item in obj if isinstance(obj, list) else ():
            shape(ids, item)

    return walk


def field(key: str, shape: Shape) -> Shape:
    """The shape of an object whose `key` holds `shape`."""

    def walk(ids: PublicIds, obj: Any) -> None:
        if isinstance(obj, dict):
            shape(ids, obj.get(key))

    return walk


class SseTranslator:
    """Translates an SSE body message by message (`event:` name, then its `data:` by
    `data_of`); a message with no storage id in it goes out byte for byte, and a chunk
    made of whole such messages (what the web writes per Redis read) is not split at all.
    A chunk that ends inside a message keeps that part until the message is complete.
    `data_of` gets the data as bytes a storage id occurs in and answers it translated."""

    def __init__(self, ids: PublicIds, data_of: Callable[[PublicIds, str, bytes], bytes]) -> None:
        self._ids = ids
        self._data_of = data_of
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        """What can be sent of the stream so far."""
        if not self._tail and chunk.endswith(b"\n\n") and not self._ids.occurs_in(chunk):
            return chunk
        data = self._tail + chunk
        cut = data.rfind(b"\n\n") + 2 if b"\n\n" in data else 0
        self._tail = data[cut:]
        return b"".join(self._message(m) for m in _messages(data[:cut]))

    def flush(self) -> bytes:
        """The rest held back (the stream ended)."""
        tail, self._tail = self._tail, b""
        return self._message(tail) if tail else b""

    def _message(self, raw: bytes) -> bytes:
        if not self._ids.occurs_in(raw):
            return raw
        head, sep, rest = raw.partition(b"data:")
        data, _, end = rest.partition(b"\n")
        if not sep or b"data:" in end:  # not one of ours (one line of JSON): as it is
            return raw
        at = head.rfind(b"event:")
        name = head[at + 6 :].partition(b"\n")[0].strip().decode(errors="replace")
        if at < 0 or not name:
            name = "message"
        data = data.removeprefix(b" ")
        return head + b"data: " + self._data_of(self._ids, name, data) + b"\n" + end


def _messages(data: bytes) -> Iterable[bytes]:
    """The messages of whole SSE text, each with its blank line."""
    start = 0
    while start < len(data):
        end = data.find(b"\n\n", start)
        end = len(data) if end < 0 else end + 2
        yield data[start:end]
        start = end


def run_event_data(ids: PublicIds, name: str, data: bytes) -> bytes:
    """A run stream's SSE data (`event` the event's name)."""
    return ids.event_bytes(name, data)


def protocol_event_data(ids: PublicIds, _name: str, data: bytes) -> bytes:
    """The thread streaming protocol's SSE data (a whole protocol message)."""
    if not ids.occurs_in(data):
        return data
    try:
        message = serde.loads(data)
    except ValueError:
        return data
    ids.protocol(message)
    return serde.dumps(message)
