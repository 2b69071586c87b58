"""SSE serialisation of frames (A1, B6): `id:`/`event:`/`data:` lines, comment heartbeats."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from app.streaming import frames
from app.streaming.frames import EndFrame, EventFrame, Frame, GapFrame, HeartbeatFrame, KeepEvent
from shared import serde
from shared.bridge.base import StreamItem
from shared.ops.connections import TRACKER

HEARTBEAT = b": heartbeat\n\n"


def encode(frame: Frame) -> bytes:
    """One SSE message; `end` is an ordinary event on this wire."""
    if isinstance(frame, EventFrame | EndFrame):
        item = frame.event
        return f"id: {item.id}\nevent: {item.event}\ndata: {item.data}\n\n".encode()
    if isinstance(frame, GapFrame):
        return b"event: gap\ndata: " + serde.dumps(frame.gap.payload()) + b"\n\n"
    if isinstance(frame, HeartbeatFrame):
        return HEARTBEAT
    raise TypeError(f"not a frame: {frame!r}")


def sse_body(
    batches: Iterator[list[StreamItem]],
    *,
    keep: KeepEvent = frames.keep_all,
    on_close: Callable[[bool], None] | None = None,
    run_id: str | None = None,
) -> Iterator[bytes]:
    """Encode batches of items; one write per Redis read. `on_close(ended)` runs at the end.
    The connection (and its run's subscriber) is counted for the ops view meanwhile."""
    ended = False
    ticket = TRACKER.open("sse", run_id)
    try:
        for batch in batches:
            out = frames.from_batch(batch, keep)
            ended = ended or any(frames.is_last(f) for f in out)
            chunk = b"".join(encode(f) for f in out)
            if chunk:
                yield chunk
    finally:
        TRACKER.close(ticket)
        if on_close is not None:
            on_close(ended)
