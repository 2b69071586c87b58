"""Redis Streams bridge: fenced publishing (worker side) and gap-exact subscription (web side)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aredis

from shared import lua
from shared.bridge.base import END_EVENT, Event, Gap, Heartbeat, StreamItem, parse_cursor
from shared.errors import LeaseLost, StreamCursorInvalid
from shared.redis_keys import Keys
from shared.settings import Settings

log = logging.getLogger(__name__)

PUBLISH_RETRY_DELAYS_S = (0.1, 0.5, 1.0, 2.0)
"""Back-off between publish retries on connection errors; then the run fails."""

STREAM_TTL_RUNNING_S = 86_400
"""A stream's TTL while its run is live, refreshed on every publish (bounds orphans)."""


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Ids the publish got, and a cancel request the owner must honour ('' if none)."""

    ids: list[str]
    cancel_action: str


def _trim_slack(maxlen: int) -> int:
    """Entries allowed above maxlen before a trim batch (approximate retention, B3)."""
    return max(1, min(100, maxlen // 10))


class StreamPublisher:
    """Worker side of B1: fenced XADD of batches of events (L2)."""

    def __init__(self, client: aredis.Redis, keys: Keys, settings: Settings) -> None:
        self._client = client
        self._keys = keys
        self._maxlen = settings.stream_maxlen
        self._slack = _trim_slack(settings.stream_maxlen)
        self._end_ttl = settings.stream_ttl_after_end_s
        self._script = client.register_script(lua.source("publish"))

    async def publish(
        self, run_id: str, lease_value: str, events: list[tuple[str, bytes]], *, end: bool = False
    ) -> PublishResult:
        """Append events in order; raise LeaseLost if `lease_value` is not the current lease."""
        k = self._keys
        args: list[str | bytes | int] = [
            lease_value,
            self._maxlen,
            self._slack,
            self._end_ttl if end else STREAM_TTL_RUNNING_S,
        ]
        for name, data in events:
            args.append(name)
            args.append(data)
        out = await self._script(
            keys=[k.lease(run_id), k.stream(run_id), k.stream_meta(run_id), k.cancel(run_id)],
            args=args,
        )
        head = out[0].decode() if isinstance(out[0], bytes) else str(out[0])
        if head == "!fenced":
            raise LeaseLost(f"run {run_id}: publish fenced (lease {lease_value} is not current)")
        return PublishResult(ids=[i.decode() for i in out[1:]], cancel_action=head)


def _decode_entry(entry: Any) -> tuple[str, str, str, int]:
    """(id, event, data, n) from an XRANGE/XREAD entry."""
    raw_id, fields = entry
    if isinstance(fields, list):  # Lua replies come as flat lists
        fields = dict(zip(fields[::2], fields[1::2], strict=True))
    return (
        raw_id.decode(),
        fields[b"e"].decode(),
        fields[b"d"].decode(),
        int(fields[b"n"]),
    )


class StreamSubscriber:
    """Web side of B1: replay after a cursor with exact gap detection, then follow live."""

    def __init__(self, client: redis.Redis, keys: Keys, settings: Settings) -> None:
        self._client = client
        self._keys = keys
        self._heartbeat_ms = int(settings.stream_heartbeat_s * 1000)
        self._read = client.register_script(lua.source("read_after"))
        self.batch = 500

    def _read_after(self, run_id: str, cursor: str) -> list:  # type: ignore[type-arg]
        k = self._keys
        return self._read(keys=[k.stream(run_id), k.stream_meta(run_id)], args=[cursor, self.batch])  # type: ignore[no-any-return]

    def check_cursor(self, run_id: str, last_event_id: str | None) -> str:
        """Validate a client cursor before any bytes are sent (400 instead of a broken stream)."""
        cursor = parse_cursor(last_event_id)
        if cursor:
            res = self._read_after(run_id, cursor)
            if res[0] == b"beyond":
                raise StreamCursorInvalid(
                    f"Last-Event-ID {cursor} is beyond the last event {res[1].decode()} of run {run_id}"
                )
        return cursor

    def _gap(self, run_id: str, cursor: str) -> Gap:
        res = self._read_after(run_id, cursor) if cursor else [b"missing"]
        first = last = None
        if res[0] == b"gap":
            first, last = (res[1].decode() or None), (res[2].decode() or None)
        elif res[0] == b"ok" and len(res) > 2:
            first, last = _decode_entry(res[2])[0], _decode_entry(res[-1])[0]
        return Gap(run_id, cursor or None, first, last)

    def subscribe(
        self,
        run_id: str,
        last_event_id: str | None = None,
        *,
        is_terminal: Callable[[], bool],
    ) -> Iterator[StreamItem]:
        """Yield events after `last_event_id`, heartbeats while idle, a Gap, and stop after `end`."""
        for batch in self.subscribe_batches(run_id, last_event_id, is_terminal=is_terminal):
            yield from batch

    def subscribe_batches(
        self,
        run_id: str,
        last_event_id: str | None = None,
        *,
        is_terminal: Callable[[], bool],
    ) -> Iterator[list[StreamItem]]:
        """Like `subscribe`, one list per Redis read (so a relay can write them in one go).

        `is_terminal` answers whether the run has ended durably; it is consulted only when
        the stream is missing (never created, expired, or lost with Redis).
        """
        cursor = parse_cursor(last_event_id)
        requested = cursor
        last_n: int | None = None
        # Phase 1: catch up with the atomic, gap-checked read.
        while True:
            res = self._read_after(run_id, cursor)
            tag = res[0]
            if tag == b"missing":
                if cursor or is_terminal():
                    yield [Gap(run_id, requested or None, None, None)]
                    return
                # Not started yet: wait for the stream to appear.
                appeared = self._client.xread(
                    {self._keys.stream(run_id): "0-0"}, count=1, block=self._heartbeat_ms
                )
                if not appeared:
                    yield [Heartbeat()]
                continue
            if tag == b"beyond":
                raise StreamCursorInvalid(
                    f"Last-Event-ID {cursor} is beyond the last event {res[1].decode()} of run {run_id}"
                )
            if tag == b"gap":
                yield [
                    Gap(run_id, requested or None, res[1].decode() or None, res[2].decode() or None)
                ]
                return
            entries = res[2:]
            counter = int(res[1])
            out: list[StreamItem] = []
            for raw in entries:
                eid, name, data, n = _decode_entry(raw)
                out.append(Event(eid, name, data))
                if name == END_EVENT:
                    yield out
                    return
                cursor, last_n = eid, n
            if out:
                yield out
            if last_n is None and cursor:
                last_n = counter  # the cursor is the newest entry
            if len(entries) < self.batch:
                break
        # Phase 2: follow live; contiguity of `n` proves nothing was trimmed or lost.
        key = self._keys.stream(run_id)
        while True:
            got: Any = self._client.xread(
                {key: cursor or "0-0"}, count=self.batch, block=self._heartbeat_ms
            )
            if not got:
                if not self._client.exists(key) and is_terminal():
                    yield [self._gap(run_id, cursor)]
                    return
                yield [Heartbeat()]
                continue
            out = []
            for raw in got[0][1]:
                eid, name, data, n = _decode_entry(raw)
                if last_n is not None and n != last_n + 1:
                    out.append(self._gap(run_id, cursor))
                    yield out
                    return
                out.append(Event(eid, name, data))
                if name == END_EVENT:
                    yield out
                    return
                cursor, last_n = eid, n
            yield out

    def last_event(self, run_id: str) -> Event | None:
        """The newest retained event, if any."""
        got: Any = self._client.xrevrange(self._keys.stream(run_id), count=1)
        if not got:
            return None
        eid, name, data, _ = _decode_entry(got[0])
        return Event(eid, name, data)


class EventSink:
    """Coalescing, ordered publisher for one run attempt.

    `emit` never waits for Redis: events go to a buffer and one flusher task sends
    everything buffered in a single fenced script call. Under load this batches
    naturally (many events per round trip); when idle the first event goes out at once,
    so latency stays one round trip.
    """

    def __init__(
        self,
        publisher: StreamPublisher,
        run_id: str,
        lease_value: str,
        *,
        on_cancel: Callable[[str], None],
        on_lost: Callable[[LeaseLost], None],
    ) -> None:
        self._pub = publisher
        self._run_id = run_id
        self._lease_value = lease_value
        self._on_cancel = on_cancel
        self._on_lost = on_lost
        self._buf: list[tuple[str, bytes]] = []
        self._task: asyncio.Task[None] | None = None
        self.lost: LeaseLost | None = None
        self.published = 0
        self.first_id: str | None = None

    def emit(self, event: str, data: bytes) -> None:
        """Queue one event for publishing (in order)."""
        if self.lost is not None:
            return
        self._buf.append((event, data))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        while self._buf and self.lost is None:
            batch, self._buf = self._buf, []
            try:
                res = await self._publish_with_retry(batch)
            except LeaseLost as exc:
                self.lost = exc
                self._on_lost(exc)
                return
            if self.first_id is None and res.ids:
                self.first_id = res.ids[0]
            self.published += len(res.ids)
            if res.cancel_action:
                self._on_cancel(res.cancel_action)

    async def _publish_with_retry(self, batch: list[tuple[str, bytes]]) -> PublishResult:
        """Publish, retrying connection errors briefly (a Redis failover, a restart)."""
        delays = PUBLISH_RETRY_DELAYS_S
        for attempt, delay in enumerate((*delays, None)):
            try:
                return await self._pub.publish(self._run_id, self._lease_value, batch)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if delay is None:
                    raise
                log.warning("run %s: publish failed (%s), retry %d", self._run_id, exc, attempt + 1)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def drain(self) -> None:
        """Wait until everything emitted so far is published (or the lease is lost)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        if self._task is not None and self._task.done() and not self._task.cancelled():
            exc = self._task.exception()
            if exc is not None:
                raise exc

    async def publish_end(self, data: bytes) -> None:
        """Drain, then publish `end` with the after-end TTL (B7)."""
        await self.drain()
        if self.lost is not None:
            raise self.lost
        await self._pub.publish(self._run_id, self._lease_value, [(END_EVENT, data)], end=True)
