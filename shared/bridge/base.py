"""The bridge contract: what a subscriber receives, and cursor parsing (B1, B4, B5)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

from shared.errors import StreamCursorInvalid

END_EVENT = "end"
START_CURSORS = frozenset({"", "-1", "0", "-"})
BEFORE_FIRST = "0-0"
"""A checked "from the very first event" cursor: a gap if anything was ever trimmed."""
_ID_RE = re.compile(r"^\d{1,19}-\d{1,19}$")


@dataclass(frozen=True, slots=True)
class Event:
    """One live event; `data` is already-encoded JSON."""

    id: str
    event: str
    data: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Nothing happened for a heartbeat interval (B6)."""


@dataclass(frozen=True, slots=True)
class Gap:
    """Events after the cursor are gone; reload durable state (B5). A value, not an error."""

    run_id: str
    requested_event_id: str | None
    earliest_available_event_id: str | None
    latest_available_event_id: str | None

    def payload(self) -> dict[str, Any]:
        """The `gap` control event's body."""
        return {
            "code": "stream_replay_gap",
            "run_id": self.run_id,
            "requested_event_id": self.requested_event_id,
            "earliest_available_event_id": self.earliest_available_event_id,
            "latest_available_event_id": self.latest_available_event_id,
            "recovery": "reload_durable_state",
        }


StreamItem = Event | Heartbeat | Gap


def parse_cursor(last_event_id: str | None) -> str:
    """'' for "from the start of what is retained" (-1, 0, -), else a validated stream id (B4).

    `0-0` is a real cursor ("before the first event"): unlike -1 it reports a gap when
    the start of the stream was trimmed, for a client that dropped before its first event.
    """
    if last_event_id is None:
        return ""
    value = last_event_id.strip()
    if value in START_CURSORS:
        return ""
    if not _ID_RE.match(value):
        raise StreamCursorInvalid(
            f"Last-Event-ID {last_event_id[:64]!r} is not an event id of this stream"
        )
    return value


class ReadKind(enum.Enum):
    """What a replay read found (B4, B5)."""

    MISSING = "missing"  # no stream: never created, expired, or lost with Redis
    BEYOND = "beyond"  # the cursor is after the last id ever issued: a client error
    GAP = "gap"  # something after the cursor is gone
    OK = "ok"  # the entries after the cursor are all there


@dataclass(frozen=True, slots=True)
class StreamMeta:
    """The bookkeeping the publisher keeps beside each stream (see shared/lua/publish.lua)."""

    exists: bool
    count: int  # n: events ever published to this incarnation
    origin: str | None  # o: first id of this incarnation
    last: str | None  # l: last id issued
    trimmed: str | None  # t: newest id trimmed away


def id_key(event_id: str) -> tuple[int, int]:
    """A stream id as a comparable (ms, seq) pair."""
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


def classify_read(cursor: str, meta: StreamMeta) -> ReadKind:
    """The pure gap decision: exact, because trimming only removes ids <= meta.trimmed."""
    if not meta.exists:
        return ReadKind.MISSING
    if not cursor:
        return ReadKind.OK
    if cursor == BEFORE_FIRST:
        return ReadKind.GAP if meta.trimmed is not None else ReadKind.OK
    c = id_key(cursor)
    if meta.last is not None and c > id_key(meta.last):
        return ReadKind.BEYOND
    if meta.origin is not None and c < id_key(meta.origin):
        return ReadKind.GAP  # the cursor belongs to an earlier incarnation (Redis lost it)
    if meta.trimmed is not None and id_key(meta.trimmed) > c:
        return ReadKind.GAP
    return ReadKind.OK
