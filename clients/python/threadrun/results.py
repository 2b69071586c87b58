"""What a caller of `RunStream` receives: live events and the recovery notices around them.

These are plain frozen records with no behaviour beyond parsing a `gap` payload, so every
other module of the client (errors included: `StreamReplayGapError` carries the gaps) can
import them without pulling in IO or recovery logic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ClientItem",
    "GapInfo",
    "Reconnecting",
    "RunEnded",
    "StateReloaded",
    "StreamEvent",
]


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One live event of the run; `data` is decoded JSON."""

    id: str
    event: str
    data: Any


@dataclass(frozen=True, slots=True)
class GapInfo:
    """The body of a `gap` control event (B5)."""

    run_id: str | None
    requested_event_id: str | None
    earliest_available_event_id: str | None
    latest_available_event_id: str | None
    code: str = "stream_replay_gap"

    @classmethod
    def from_payload(cls, payload: Any) -> GapInfo:
        """Parse the gap payload (tolerant: a malformed one is a gap with null bounds)."""
        p: Mapping[str, Any] = payload if isinstance(payload, Mapping) else {}

        def opt(key: str) -> str | None:
            value = p.get(key)
            return str(value) if value not in (None, "") else None

        return cls(
            run_id=opt("run_id"),
            requested_event_id=opt("requested_event_id"),
            earliest_available_event_id=opt("earliest_available_event_id"),
            latest_available_event_id=opt("latest_available_event_id"),
            code=str(p.get("code") or "stream_replay_gap"),
        )


@dataclass(frozen=True, slots=True)
class StateReloaded:
    """The live view was incomplete: transient state dropped, durable state reloaded (B9)."""

    state: dict[str, Any]
    gap: GapInfo


@dataclass(frozen=True, slots=True)
class RunEnded:
    """The run reached a terminal status (`interrupted` = cancelled)."""

    run_id: str
    status: str


@dataclass(frozen=True, slots=True)
class Reconnecting:
    """The connection dropped; the client resumes after `last_event_id` in `delay` seconds."""

    run_id: str
    attempt: int
    delay: float
    last_event_id: str | None
    reason: str


ClientItem = StreamEvent | StateReloaded | RunEnded | Reconnecting
"""One item of a run's stream, as `RunStream` yields it."""
