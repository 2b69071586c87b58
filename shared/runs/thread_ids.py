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

The worker writes the public id at the same positions of the stream events it publishes
(`PublicIds.at_source`, workers/public_ids.py), so the web relays them as they are; what it
did not write (an older worker's events) still holds the storage id and is translated here.
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

Shape = Callable[["PublicIds", Any], object]
"""Writes public ids at one JSON shape's id positions, in place."""


class PublicIds:
    """One caller's storage id -> public id map, written at thread-id positions only.

    `aliases` is read live (a WebSocket session's map grows as its frames name threads).
    Each method takes freshly decoded JSON and changes it in place (and returns it); values
    of any other type or shape are left alone, so a malformed body is relayed as it came.
    `copy=True` (the worker's, `at_source`): nothing is changed in place, every object on
    the way to a translated position is copied and the copy returned (the graph's own
    objects, a config LangGraph still writes checkpoints with, stay as they are).
    """

    __slots__ = ("_copy", "_known", "_storage", "aliases")

    def __init__(self, aliases: Mapping[str, str], *, copy: bool = False) -> None:
        self.aliases = aliases
        self._copy = copy
        self._known = -1
        self._storage: list[tuple[str, bytes]] = []

    @classmethod
    def at_source(cls, storage: str, public: str | None) -> PublicIds | None:
        """The worker's writer of one thread's public id into the events it publishes, or
        None when it must leave them to the web.

        Why it is safe: every storage id a web reader translates is a client-chosen
        thread's (`storage_id`: a version 5 UUID), and every reader of this thread's
        stream has resolved it (its map holds `storage` -> `public`). An event written with
        `public` therefore holds no storage id at its id positions, goes out as it is
        (`occurs_in`: no parse), and if a storage id occurs elsewhere in it the web's
        translation gives it back unchanged, as `public` is nobody's storage id, unless it
        is a version 5 UUID itself (then it may be another thread's storage id: X2 = X1's
        storage id, tests/unit/test_public_ids_typed.py), which stays the web's to
        translate. An event the worker did not write (an older worker's, a shape this
        misses) still holds `storage`, and is translated as before."""
        if not public or public == storage or storage_shaped(public):
            return None
        return cls({storage: public}, copy=True)

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

    def _put(self, obj: dict[str, Any], key: Any, value: Any) -> dict[str, Any]:
        """`obj` with `key` set to `value`: in place, or a copy (`copy=True`)."""
        if self._copy:
            return {**obj, key: value}
        obj[key] = value
        return obj

    def _at(self, obj: dict[str, Any], key: str, shape: Callable[[Any], Any]) -> dict[str, Any]:
        """`obj` with `shape` applied to its `key` (if it has one)."""
        if key not in obj:
            return obj
        value = obj[key]
        new = shape(value)
        return obj if new is value else self._put(obj, key, new)

    # -- the typed shapes ----------------------------------------------------------------------
    def owned(self, obj: Any, key: str = "thread_id") -> Any:
        """A record that names its thread (thread, run, cron, journal event, checkpoint)."""
        if isinstance(obj, dict) and key in obj:
            value = self.public(obj[key])
            if value is not obj[key]:
                return self._put(obj, key, value)
        return obj

    def config(self, obj: Any) -> Any:
        """A RunnableConfig: its `configurable.thread_id`."""
        return self._at(obj, "configurable", self.owned) if isinstance(obj, dict) else obj

    def run(self, obj: Any) -> Any:
        """A run: its thread and the thread id of its config."""
        obj = self.owned(obj)
        kwargs = obj.get("kwargs") if isinstance(obj, dict) else None
        if isinstance(kwargs, dict):
            obj = self._at(obj, "kwargs", lambda kw: self._at(kw, "config", self.config))
        return obj

    def snapshot(self, obj: Any) -> Any:
        """A state snapshot (state, history, a `checkpoints` event): its configs, its
        checkpoints, the thread id LangGraph puts in its metadata, its tasks' subgraph states."""
        if not isinstance(obj, dict):
            return obj
        obj = self._at(obj, "config", self.config)
        obj = self._at(obj, "parent_config", self.config)
        obj = self._at(obj, "checkpoint", self.owned)
        obj = self._at(obj, "parent_checkpoint", self.owned)
        obj = self._at(obj, "metadata", self.owned)
        tasks = obj.get("tasks")
        if isinstance(tasks, list):
            new = [self._task(task) for task in tasks]
            if any(a is not b for a, b in zip(new, tasks, strict=True)):
                obj = self._put(obj, "tasks", new)
        return obj

    def _task(self, task: Any) -> Any:
        if not isinstance(task, dict) or "state" not in task:
            return task
        state = task["state"]
        if isinstance(state, dict) and "configurable" in state:
            return self._at(task, "state", self.config)
        return self._at(task, "state", self.snapshot)

    def event_data(self, name: str, data: Any) -> Any:
        """A stream event's data, by the event's name (`|namespace` suffix allowed)."""
        mode = name.split("|", 1)[0]
        if mode == "metadata":
            return self.owned(data)
        if mode == "checkpoints":
            return self.snapshot(data)
        if mode == "debug":
            if isinstance(data, dict) and data.get("type") == "checkpoint":
                return self._at(data, "payload", self.snapshot)
        elif mode == "messages":  # [chunk, metadata]: LangGraph's metadata of the chunk
            # (the worker's is the tuple LangGraph streams; JSON has only lists)
            if isinstance(data, list | tuple) and len(data) == 2:
                meta = self.owned(data[1])
                if meta is not data[1]:
                    if self._copy or isinstance(data, tuple):
                        return [data[0], meta]
                    data[1] = meta
        elif mode == "messages/metadata":  # {message id: {"metadata": ...}}
            if isinstance(data, dict):
                for key, entry in list(data.items()):
                    if isinstance(entry, dict):
                        new = self._at(entry, "metadata", self.owned)
                        if new is not entry:
                            data = self._put(data, key, new)
        elif mode == "events" and isinstance(data, dict):  # astream_events' metadata
            return self._at(data, "metadata", self.owned)
        return data

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
        return serde.dumps(self.event_data(name, obj))

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


def storage_shaped(value: str) -> bool:
    """Whether `value` could be a client-chosen thread's storage id: a version 5 UUID
    (`storage_id`), in any spelling; server-made ids are version 4."""
    try:
        return uuid.UUID(value).version == 5
    except ValueError:
        return False


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
