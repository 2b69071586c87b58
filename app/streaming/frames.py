"""Bridge items as protocol-neutral frames: what a client is sent, before SSE or WebSocket
writes it (A1, A2, B5-B7).

The decisions live here once: which events a client's stream modes keep, that `end` is the
last frame and carries the run's status, that a gap is the last frame too, that a heartbeat
is a frame of its own. `sse.py` and `ws.py` only serialise the frames.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from shared import metrics, serde
from shared.bridge.base import END_EVENT, Event, Gap, Heartbeat, StreamItem
from shared.vocab import CONTROL_EVENTS, event_names

KeepEvent = Callable[[Event], bool]
"""Whether a client's stream modes keep an event."""


def keep_all(_event: Event) -> bool:
    """Every event (no stream modes asked)."""
    return True


def event_filter(modes: list[str] | None) -> KeepEvent:
    """Keep only the events of the requested stream modes (`shared/vocab.py`'s table);
    control events always pass."""
    if not modes:
        return keep_all
    wanted = CONTROL_EVENTS | event_names(modes)

    def keep(event: Event) -> bool:
        return event.event.split("|", 1)[0] in wanted

    return keep


@dataclass(frozen=True, slots=True)
class EventFrame:
    """One run event."""

    event: Event


@dataclass(frozen=True, slots=True)
class EndFrame:
    """The run's `end` event: the last frame of the stream (B7)."""

    event: Event

    @property
    def status(self) -> object:
        """The terminal status the `end` event carries (None if its data has none)."""
        try:
            data = serde.loads(self.event.data)
        except ValueError:
            return None
        return data.get("status") if isinstance(data, dict) else None


@dataclass(frozen=True, slots=True)
class GapFrame:
    """Events after the cursor are gone: the last frame of the stream (B5)."""

    gap: Gap


@dataclass(frozen=True, slots=True)
class HeartbeatFrame:
    """Nothing happened for a heartbeat interval (B6)."""


Frame = EventFrame | EndFrame | GapFrame | HeartbeatFrame


def from_item(item: StreamItem, keep: KeepEvent = keep_all) -> Frame | None:
    """The frame for one bridge item; None for an event the stream modes leave out."""
    if isinstance(item, Event):
        if item.event == END_EVENT:
            return EndFrame(item)
        return EventFrame(item) if keep(item) else None
    if isinstance(item, Gap):
        return GapFrame(item)
    if isinstance(item, Heartbeat):
        return HeartbeatFrame()
    raise TypeError(f"not a stream item: {item!r}")


def from_batch(batch: Iterable[StreamItem], keep: KeepEvent = keep_all) -> list[Frame]:
    """The frames for one read of the bridge; each gap is counted as sent (ops metric)."""
    out: list[Frame] = []
    for item in batch:
        frame = from_item(item, keep)
        if frame is None:
            continue
        if isinstance(frame, GapFrame):
            metrics.gap_sent()
        out.append(frame)
    return out


def is_last(frame: Frame) -> bool:
    """Whether nothing follows this frame (the run's end, or a gap)."""
    return isinstance(frame, EndFrame | GapFrame)
