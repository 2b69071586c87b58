"""A task's run followed through its Redis Stream (the web's `StreamSubscriber`, as the
REST API's SSE): exact replay after a cursor, and the gap rule (B5) — when the events
after the cursor are gone, the stream does not pretend: it waits for the run to end and
closes with the durable outcome, its status update saying `gap` in its metadata.

Each A2A answer of a streamed task carries the id of the run event that made it (SSE
`id:`), so `SubscribeToTask` with `Last-Event-ID` resumes exactly after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from app.protocols.a2a.mapping import StreamTranslator, TaskView
from app.services import Services, current_services
from shared.bridge.base import BEFORE_FIRST, END_EVENT, Event, Gap, Heartbeat


@dataclass(frozen=True, slots=True)
class Out:
    """One A2A stream answer (`result` None: a heartbeat), with its run event id."""

    result: dict[str, Any] | None
    event_id: str | None = None


def follow(
    run_id: str,
    translator: StreamTranslator,
    final: Callable[[], TaskView],
    *,
    cursor: str | None = BEFORE_FIRST,
    admitted: bool = False,
) -> Iterator[Out]:
    """The answers of a run's events after `cursor`, then its closing answers (`final()`
    is the task's durable view, read once the run has ended)."""
    svc = current_services()
    last_id: str | None = None
    gap: Gap | None = None
    for batch in svc.run_batches(run_id, cursor, admitted=admitted):
        for item in batch:
            if isinstance(item, Heartbeat):
                yield Out(None)
            elif isinstance(item, Gap):
                gap = item
            elif isinstance(item, Event) and item.event != END_EVENT:
                last_id = item.id
                for result in translator.feed(item.event, item.data):
                    yield Out(result, item.id)
            elif isinstance(item, Event):
                last_id = item.id
    if gap is not None:
        yield from _await_terminal(svc, run_id)
    view = final()
    closing = translator.final(view)
    if gap is not None:
        closing[-1]["statusUpdate"]["metadata"] = {"threadrun": {"gap": gap.payload()}}
    for result in closing:
        yield Out(result, last_id)


def _await_terminal(svc: Services, run_id: str) -> Iterator[Out]:
    """Heartbeats until the run has a terminal status (after a gap, nothing else tells)."""
    while not svc.runs.is_terminal(run_id):
        yield Out(None)
        time.sleep(svc.settings.stream_heartbeat_s / 5)


def waited(outs: Iterator[Out], keepalive_s: float) -> Iterator[bytes]:
    """Drain a follow for an answer that waits (SendMessage): a newline at most every
    `keepalive_s` while it lasts (JSON parsers skip leading whitespace; a proxy sees bytes)."""
    sent = time.monotonic()
    for _ in outs:
        now = time.monotonic()
        if now - sent >= keepalive_s:
            sent = now
            yield b"\n"
