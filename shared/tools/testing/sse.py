"""Reading a run's SSE stream the way a test or a benchmark checks it.

Built on the client's `parse_sse` (what an event, a gap and a heartbeat are on the wire),
read one message at a time so that each message also keeps its `data:` text as sent: tests
check the wire (a gap's whole body, one `attempt` key in a `metadata` event), benchmarks
its size.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from shared import serde
from threadrun.client import StreamEvent, WireGap, WireHeartbeat, WireItem, parse_sse

START = "-1"
"""`Last-Event-ID` for "from the start of what is retained" (B4)."""


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One SSE message: what `parse_sse` read, and its `data:` text as sent."""

    item: WireItem
    text: str

    @property
    def id(self) -> str:
        """The event id ('' for a gap or a heartbeat: they carry none)."""
        return self.item.id if isinstance(self.item, StreamEvent) else ""

    @property
    def event(self) -> str:
        """The event name: `gap` for a gap, '' for a heartbeat."""
        if isinstance(self.item, StreamEvent):
            return self.item.event
        return "gap" if isinstance(self.item, WireGap) else ""

    @property
    def data(self) -> Any:
        """The decoded data (a gap's whole body as sent; None for a heartbeat)."""
        if isinstance(self.item, StreamEvent):
            return self.item.data
        return serde.loads(self.text) if self.text else None

    @property
    def heartbeat(self) -> bool:
        """Whether this is a heartbeat comment (B6)."""
        return isinstance(self.item, WireHeartbeat)


def _data_text(block: list[str]) -> str:
    """The `data:` lines of one message, joined as SSE defines it."""
    values = (line[5:] for line in block if line.startswith("data:"))
    return "\n".join(v[1:] if v.startswith(" ") else v for v in values)


def iter_sse(lines: Iterable[str], *, heartbeats: bool = False) -> Iterator[SseEvent]:
    """The messages of SSE `lines` as they arrive; heartbeats only if asked for."""
    block: list[str] = []
    for line in lines:
        block.append(line)
        if line and not line.startswith(":"):
            continue  # a field of the message still being read
        text = _data_text(block)
        for item in parse_sse(block):
            if heartbeats or not isinstance(item, WireHeartbeat):
                yield SseEvent(item, "" if isinstance(item, WireHeartbeat) else text)
        block = []


@contextmanager
def open_stream(
    client: httpx.Client,
    thread_id: str,
    run_id: str,
    last_event_id: str | None = START,
    *,
    params: Mapping[str, str] | None = None,
    timeout: float | httpx.Timeout | None = None,
) -> Iterator[httpx.Response]:
    """GET the run's stream after `last_event_id` (B4); fail unless it answers 200."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    with client.stream(
        "GET",
        f"/threads/{thread_id}/runs/{run_id}/stream",
        headers=headers,
        params=params,
        timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
    ) as res:
        if res.status_code != 200:
            res.read()
            raise AssertionError(
                f"GET stream of run {run_id}: HTTP {res.status_code}: {res.text[:500]}"
            )
        yield res


def read_stream(
    client: httpx.Client,
    thread_id: str,
    run_id: str,
    last_event_id: str | None = START,
    *,
    within: float = 60.0,
    timeout: float | None = None,
) -> list[SseEvent]:
    """Join the run's stream after `last_event_id` and read it until the server closes it
    (after `end` or a gap); fail if it is still open after `within` seconds. Idle streams
    carry a heartbeat every few seconds, so the deadline is checked even when no event comes.
    `timeout` is the request's (the client's by default).
    """
    events: list[SseEvent] = []
    deadline = time.monotonic() + within
    with open_stream(client, thread_id, run_id, last_event_id, timeout=timeout) as res:
        for msg in iter_sse(res.iter_lines(), heartbeats=True):
            if not msg.heartbeat:
                events.append(msg)
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the stream of run {run_id} is still open after {within} s "
                    f"(last events: {[e.event for e in events[-3:]]}, now only heartbeats)"
                )
    return events
