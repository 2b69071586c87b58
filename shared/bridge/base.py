"""The bridge contract: what a subscriber receives, and cursor parsing (B1, B4, B5)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from shared.errors import StreamCursorInvalid

END_EVENT = "end"
START_CURSORS = frozenset({"", "-1", "0", "-", "0-0"})
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
    """'' for "from the start of what is retained", else a validated stream id (B4)."""
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
