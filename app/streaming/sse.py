"""SSE framing of bridge items (A1, B6): `id:`/`event:`/`data:` lines, heartbeats, gap, end."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from shared import metrics, serde
from shared.bridge.base import END_EVENT, Event, Gap, Heartbeat, StreamItem
from shared.ops.connections import TRACKER

HEARTBEAT = b": heartbeat\n\n"


def frame(item: StreamItem) -> bytes:
    """One SSE message."""
    if isinstance(item, Event):
        return f"id: {item.id}\nevent: {item.event}\ndata: {item.data}\n\n".encode()
    if isinstance(item, Gap):
        metrics.gap_sent()
        return b"event: gap\ndata: " + serde.dumps(item.payload()) + b"\n\n"
    if isinstance(item, Heartbeat):
        return HEARTBEAT
    raise TypeError(f"not a stream item: {item!r}")


def event_filter(modes: list[str] | None) -> Callable[[Event], bool]:
    """Keep only the requested stream modes (control events always pass)."""
    if not modes:
        return lambda _e: True
    wanted = {"messages" if m == "messages-tuple" else m for m in modes}
    control = {"metadata", "error", END_EVENT}

    def keep(event: Event) -> bool:
        base = event.event.split("|", 1)[0]
        return base in control or base in wanted

    return keep


def sse_body(
    batches: Iterator[list[StreamItem]],
    *,
    keep: Callable[[Event], bool] = lambda _e: True,
    on_close: Callable[[bool], None] | None = None,
    run_id: str | None = None,
) -> Iterator[bytes]:
    """Encode batches of items; one write per Redis read. `on_close(ended)` runs at the end.
    The connection (and its run's subscriber) is counted for the ops view meanwhile."""
    ended = False
    ticket = TRACKER.open("sse", run_id)
    try:
        for batch in batches:
            chunk = b"".join(
                frame(item) for item in batch if not isinstance(item, Event) or keep(item)
            )
            for item in batch:
                if isinstance(item, Gap) or (isinstance(item, Event) and item.event == END_EVENT):
                    ended = True
            if chunk:
                yield chunk
    finally:
        TRACKER.close(ticket)
        if on_close is not None:
            on_close(ended)
