"""Thread ids are per owner (A4): public ids and storage ids.

A thread has a *public id*, the one its owner sees and sends, and a *storage id*, the
global key of `threads.thread_id` that every table, the checkpointer, Redis keys and the
workspaces use. A thread the server names has one id for both. A thread whose id the
client chose is stored under `storage_id(owner, public_id)`, always, whether or not
another user has a thread with that public id: one user's choice never meets another
user's thread, so `POST /threads {"thread_id": X}` answers the same whoever else has X
(no 409 telling that X exists, no id squatted ahead of the client that will choose it).

The web translates at its edges: a client's id is resolved to the storage id on the way
in (`RunStore.resolve_thread_id`), and every storage id it resolved is written back as
the public id on the way out (`AliasRewriter`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

OWNER_NAMESPACE = uuid.UUID("6f0f7a44-5d1e-4c57-9a53-0d6c2f1b7e21")
"""The root of the per-owner namespaces (fixed: changing it would orphan every stored
client-chosen thread)."""


def owner_namespace(owner: str) -> uuid.UUID:
    """The uuid5 namespace of one owner's client-chosen thread ids."""
    return uuid.uuid5(OWNER_NAMESPACE, owner)


def storage_id(owner: str, public_id: str) -> str:
    """Where `owner`'s thread with the client-chosen `public_id` is stored."""
    return str(uuid.uuid5(owner_namespace(owner), str(uuid.UUID(public_id))))


class AliasRewriter:
    """Writes public ids in place of storage ids in a byte stream, chunk by chunk.

    A plain byte replace is exact here: both ids are 36-character canonical UUID strings,
    and a storage id of a client-chosen thread is a uuid5 of its owner's namespace that
    nothing else (no other thread, run, checkpoint or message id) can equal; only the
    responses of the owner who resolved it are rewritten. Structured translation is used
    where the shape is ours (threads, runs, crons); this covers what we only pass through:
    checkpoint configs in state and history, stream events that embed a config
    (checkpoints/debug/tasks modes), error messages, headers. A chunk that ends with the
    beginning of a storage id keeps that tail until the next chunk completes it or not.
    """

    def __init__(self, aliases: Mapping[str, str]) -> None:
        self._pairs = [(s.encode(), p.encode()) for s, p in aliases.items() if s != p]
        self._tail = b""

    def __bool__(self) -> bool:
        return bool(self._pairs)

    def rewrite(self, data: bytes) -> bytes:
        """The whole of `data`, rewritten."""
        for storage, public in self._pairs:
            data = data.replace(storage, public)
        return data

    def feed(self, chunk: bytes) -> bytes:
        """What can be sent of the stream so far; a possibly cut id waits for `flush`."""
        data = self.rewrite(self._tail + chunk)
        keep = self._partial_tail(data)
        self._tail = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep] if keep else data

    def flush(self) -> bytes:
        """The rest held back (the stream ended)."""
        tail, self._tail = self._tail, b""
        return tail

    def _partial_tail(self, data: bytes) -> int:
        """The length of the longest end of `data` that begins a storage id (not a whole one)."""
        best = 0
        for storage, _ in self._pairs:
            for n in range(min(len(storage) - 1, len(data)), best, -1):
                if data.endswith(storage[:n]):
                    best = n
                    break
        return best


def rewrite_text(text: str, aliases: Mapping[str, str]) -> str:
    """`text` with public ids in place of the storage ids of `aliases` (WebSocket frames)."""
    for storage, public in aliases.items():
        if storage != public:
            text = text.replace(storage, public)
    return text
