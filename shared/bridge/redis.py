"""Web side of the bridge: gap-exact replay and live follow of a run's Redis Stream (B4-B7)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import redis

from shared import lua
from shared.bridge.base import END_EVENT, Event, Gap, Heartbeat, StreamItem, parse_cursor
from shared.errors import StreamCursorInvalid
from shared.redis_keys import Keys
from shared.settings import Settings

log = logging.getLogger(__name__)


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
