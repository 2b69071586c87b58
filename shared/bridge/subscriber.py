"""Web side of the bridge (a `BridgeSubscriber`): gap-exact replay and live follow of a run's Redis
Stream (B4-B7)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis
from cachetools import TTLCache

from shared import serde
from shared.bridge.base import (
    BEFORE_FIRST,
    END_EVENT,
    LOST_EVENT,
    Event,
    Gap,
    Heartbeat,
    ReadKind,
    StreamItem,
    StreamMeta,
    classify_read,
    id_key,
    parse_cursor,
)
from shared.bridge.codec import DICT_FIELD, DictionaryCache, UndecodableEntry, decode, needed
from shared.bridge.hub import SharedEntries, Subscription, SubscriptionHub
from shared.errors import StreamCursorInvalid
from shared.redis_keys import Keys
from shared.settings import Settings

log = logging.getLogger(__name__)


class Entry(NamedTuple):
    """One stream entry, its data decoded to the JSON text published."""

    id: str
    event: str
    data: str
    n: int


def _fields(entry: Any) -> tuple[str, dict[bytes, bytes]]:
    """(id, fields) of an XRANGE/XREAD entry."""
    raw_id, fields = entry
    if isinstance(fields, list):  # Lua replies come as flat lists
        fields = dict(zip(fields[::2], fields[1::2], strict=True))
    return raw_id.decode(), fields


class EntryDecoder:
    """Raw entries of a run's stream -> `Entry`s, fetching the run's compression
    dictionaries from its meta hash once per process (they never change)."""

    def __init__(self, client: redis.Redis, keys: Keys, cache: DictionaryCache | None = None):
        self._client = client
        self._keys = keys
        self._cache = cache or DictionaryCache()

    def entries(self, run_id: str, raw: list[Any]) -> list[Entry]:
        """Decode entries of `run_id`'s stream; UndecodableEntry if a dictionary is gone."""
        parsed = [_fields(e) for e in raw]
        meta_key = self._keys.stream_meta(run_id)
        dictionaries: dict[str, bytes] = {}
        missing: list[str] = []
        for ref in needed(f[b"d"] for _, f in parsed):
            body = self._cache.get(meta_key, ref)
            if body is None:
                missing.append(ref)
            else:
                dictionaries[ref] = body
        if missing:
            got: Any = self._client.hmget(meta_key, [DICT_FIELD + ref for ref in missing])
            for ref, body in zip(missing, got, strict=True):
                if body is not None:
                    self._cache.put(meta_key, ref, body)
                    dictionaries[ref] = body
        return [
            Entry(eid, f[b"e"].decode(), decode(f[b"d"], dictionaries.get).decode(), int(f[b"n"]))
            for eid, f in parsed
        ]


SEEK_SLACK = 64
SEEK_TRIES = 4
"""`cursor_before_entry` reads this many entries more than it needs, as often, so that a
run publishing fast while it reads does not make it miss the entry it looks for."""

UNSTARTED_END_ID = "0-1"
"""The id of the `end` a subscriber gets for a run that ended before it started (it has no
stream): resuming after it gives the same `end` again."""

_DETACHED = object()
"""The hub dropped a subscriber that fell too far behind."""


@dataclass(slots=True)
class _Follow:
    """Where a follower is: the last delivered id and its count."""

    cursor: str
    last_n: int | None
    idle: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One atomic replay read: the stream's bookkeeping and the entries after a cursor."""

    kind: ReadKind
    meta: StreamMeta
    entries: list[Any]
    first_id: str | None
    last_event: str | None  # the newest entry's event name


LIVENESS_ENTRIES = 65536
"""Answers RunLiveness keeps at most (two per followed stream)."""


class RunLiveness:
    """Idle followers' checks ("is the stream there?", "has the run ended?"), shared briefly.

    Every idle follower asks once per heartbeat; thousands of them following one run would
    each cost a Redis and a PostgreSQL round trip. An answer is reused for `ttl_s`: a
    terminal status never changes, and a stale "not ended" or "exists" only delays the
    rare lost-`end` path by at most one heartbeat.
    """

    def __init__(self, ttl_s: float) -> None:
        self._answers: TTLCache[tuple[str, str], bool] = TTLCache(LIVENESS_ENTRIES, ttl_s)
        self._lock = threading.Lock()

    def ask(self, what: str, key: str, probe: Callable[[], bool]) -> bool:
        """The cached answer to (`what`, `key`), or `probe()`'s."""
        with self._lock:
            hit = self._answers.get((what, key))
        if hit is not None:
            return hit
        value = bool(probe())
        with self._lock:
            self._answers[(what, key)] = value
        return value


class StreamSubscriber:
    """Web side of B1: replay after a cursor with exact gap detection, then follow live."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        settings: Settings,
        hub: SubscriptionHub | None = None,
        liveness: RunLiveness | None = None,
    ) -> None:
        self._client = client
        self._keys = keys
        self._heartbeat_s = settings.stream_heartbeat_s
        self._heartbeat_ms = int(settings.stream_heartbeat_s * 1000)
        self._hub = hub
        self.liveness = liveness or RunLiveness(settings.stream_heartbeat_s)
        self.decoder = EntryDecoder(client, keys)
        self.batch = 500

    @property
    def hub(self) -> SubscriptionHub | None:
        """The process's subscription hub, if followers share one."""
        return self._hub

    def snapshot(self, run_id: str, cursor: str) -> Snapshot:
        """Bounds and entries read in one MULTI/EXEC, so a trim in between cannot hide a gap.

        (A Lua script would be atomic too, but copying 500 entries through Lua cost Redis
        6x a plain XRANGE in `make bench`; MULTI keeps the reads native.)
        """
        k = self._keys
        pipe = self._client.pipeline(transaction=True)
        pipe.exists(k.stream(run_id))
        pipe.hmget(k.stream_meta(run_id), ["n", "o", "l", "t", "h"])
        pipe.xrange(k.stream(run_id), min=f"({cursor}" if cursor else "-", count=self.batch)
        pipe.xrange(k.stream(run_id), count=1)
        pipe.xrevrange(k.stream(run_id), count=1)
        exists, (n, origin, last, trimmed, lost), entries, first, newest = pipe.execute()
        meta = StreamMeta(
            exists=bool(exists),
            count=int(n or 0),
            origin=origin.decode() if origin else None,
            last=last.decode() if last else None,
            trimmed=trimmed.decode() if trimmed else None,
            lost=StreamMeta.parse_lost(lost),
        )
        first_id = first[0][0].decode() if first else None
        last_event = _fields(newest[0])[1][b"e"].decode() if newest else None
        return Snapshot(classify_read(cursor, meta), meta, entries, first_id, last_event)

    def cursor_before_entry(self, run_id: str, n: int) -> str | None:
        """The cursor after which entry `n` of the run's stream is read (its position, as
        entries carry it: the thread streaming protocol's `since`); None when entry `n` or
        a later one is gone or was never published, which is a gap for the reader.

        The entry before `n` is looked for from whichever end of the stream is nearer (a
        reconnect's cursor is usually near the end), by the positions entries carry, never
        by counting: a live run appends and trims while this reads."""
        if n <= 1:
            return BEFORE_FIRST  # from the very first event (a gap if it was trimmed)
        k = self._keys
        pipe = self._client.pipeline(transaction=True)
        pipe.hmget(k.stream_meta(run_id), ["n", "t"])
        pipe.xrange(k.stream(run_id), count=1)
        (count, trimmed), first = pipe.execute()
        if not first or count is None or n > int(count):
            return None
        want = n - 1  # the entry to read after
        n0 = int(_fields(first[0])[1][b"n"])
        if want < n0 - 1:
            return None  # entry n was trimmed
        if want == n0 - 1:
            return trimmed.decode() if trimmed else None
        from_start, from_end = want - n0 + 1, int(count) - want + 1
        for _ in range(SEEK_TRIES):
            if from_start <= from_end:  # what was appended meanwhile is beyond the read
                got: Any = self._client.xrange(k.stream(run_id), count=from_start + SEEK_SLACK)
            else:
                got = self._client.xrevrange(k.stream(run_id), count=from_end + SEEK_SLACK)
            positions = [(int(_fields(e)[1][b"n"]), e) for e in got]
            entry = next((e for p, e in positions if p == want), None)
            if entry is not None:
                return _fields(entry)[0]
            if from_start <= from_end or not positions or min(p for p, _ in positions) <= want:
                return None  # it was trimmed (or lost) meanwhile: the reader gets its gap
            from_end = max(p for p, _ in positions) - want + 1  # the run went on: read more
        return None

    def check_cursor(self, run_id: str, last_event_id: str | None) -> str:
        """Validate a client cursor before any bytes are sent (400 instead of a broken stream)."""
        cursor = parse_cursor(last_event_id)
        if cursor:
            snap = self._settled(run_id, cursor, self.snapshot(run_id, cursor))
            if snap.kind is ReadKind.BEYOND:
                raise StreamCursorInvalid(
                    f"Last-Event-ID {cursor} is beyond the last event {snap.meta.last} of run {run_id}"
                )
        return cursor

    def _settled(self, run_id: str, cursor: str, snap: Snapshot) -> Snapshot:
        """A BEYOND read re-checked while it may be the tail a failover lost (B4, B5).

        A replica promoted by a failover can lack the newest entries, so a client that saw
        them rejoins with a cursor beyond the stream's end. Until the publisher repairs the
        tail (it records the lost ids, shared/lua/publish.lua) that looks like a made-up
        cursor. A cursor the Redis clock has not reached yet, or one past a stream's `end`,
        is refused at once; another is read again for up to one heartbeat interval.
        """
        if snap.kind is not ReadKind.BEYOND or snap.last_event == END_EVENT:
            return snap
        now_s, now_us = self._client.time()
        if id_key(cursor)[0] > now_s * 1000 + now_us // 1000:
            return snap
        deadline = time.monotonic() + self._heartbeat_s
        while snap.kind is ReadKind.BEYOND and time.monotonic() < deadline:
            time.sleep(min(0.1, self._heartbeat_s / 10))
            snap = self.snapshot(run_id, cursor)
        return snap

    def _gap(self, run_id: str, requested: str, reason: str, snap: Snapshot | None = None) -> Gap:
        """The gap for a subscriber after `requested`, logged with why (B5: every
        gap says its reason in the log; `threadrun_stream_gaps_total` counts them)."""
        snap = snap or self.snapshot(run_id, "")
        if not snap.meta.exists:
            gap = Gap(run_id, requested or None, None, None)
        else:
            gap = Gap(run_id, requested or None, snap.first_id, snap.meta.last)
        log.warning(
            "stream gap: %s",
            reason,
            extra={
                "run_id": run_id,
                "requested": requested or None,
                "latest": gap.latest_available_event_id,
            },
        )
        return gap

    def _missing_stream(
        self, run_id: str, requested: str, unstarted_end: Callable[[], str | None] | None
    ) -> StreamItem | None:
        """The stream is missing and the client needs events from it (a cursor, or a run
        that has ended): None when it exists after all, else an `end` for a run that never
        started, else the gap.

        Read again after the terminal answer: a fast run can start, publish everything
        and end between the first read and that answer. A run's stream
        is complete before its terminal status is committed, so a stream still missing
        now was never created (the run never started), expired, or was lost with Redis.
        """
        if self._client.exists(self._keys.stream(run_id)):
            return None
        status = unstarted_end() if unstarted_end is not None else None
        if status is not None:
            data = serde.dumps({"run_id": run_id, "status": status}).decode()
            return Event(UNSTARTED_END_ID, END_EVENT, data)
        reason = "the stream expired or was lost" if requested else "a terminal run has no stream"
        return self._gap(run_id, requested, reason)

    def subscribe(
        self,
        run_id: str,
        last_event_id: str | None = None,
        *,
        is_terminal: Callable[[], bool],
        unstarted_end: Callable[[], str | None] | None = None,
    ) -> Iterator[StreamItem]:
        """Yield events after `last_event_id`, heartbeats while idle, a Gap, and stop after `end`."""
        for batch in self.subscribe_batches(
            run_id, last_event_id, is_terminal=is_terminal, unstarted_end=unstarted_end
        ):
            yield from batch

    def subscribe_batches(
        self,
        run_id: str,
        last_event_id: str | None = None,
        *,
        is_terminal: Callable[[], bool],
        unstarted_end: Callable[[], str | None] | None = None,
        admitted: bool = False,
    ) -> Generator[list[StreamItem], None, None]:
        """Like `subscribe`, one list per Redis read (so a relay can write them in one go).

        `is_terminal` answers whether the run has ended durably; it is consulted only when
        the stream is missing (never created, expired, or lost with Redis).
        `unstarted_end`, when given, answers the terminal status of a run that ended
        without ever starting (cancelled while pending: it never had a stream), else None;
        such a run's subscribers get an `end` with that status instead of a gap.

        `admitted`: the caller has just admitted the run and reads it from its first event
        (`BEFORE_FIRST`). Its stream cannot hold anything to catch up on yet and the run
        cannot have ended but by a cancel in the meantime, so the subscriber follows it
        live at once, from before its first entry, instead of reading a snapshot and
        asking PostgreSQL first: a read, a query and a hub re-attach less before the first
        event. Nothing is lost to that: entries arrive in order from the first one, whose
        count must be 1 (anything trimmed or lost before it is a gap, as for any cursor),
        and a run that ends without a stream is found at the first idle heartbeat.
        """
        cursor = parse_cursor(last_event_id)
        requested = cursor
        key = self._keys.stream(run_id)
        if admitted and cursor == BEFORE_FIRST:
            state = _Follow(cursor, last_n=0)
            done = yield from self._follow(run_id, key, state, is_terminal, unstarted_end)
            if done:
                return
            cursor = state.cursor  # detached (a slow reader): catch up from where it is
        while True:
            # Phase 1: catch up with atomic, gap-checked reads.
            last_n: int | None = None
            while True:
                snap = self._settled(run_id, cursor, self.snapshot(run_id, cursor))
                if snap.kind is ReadKind.MISSING:
                    # 0-0 ("before the first event") waits like -1: no stream yet means
                    # nothing was published, so nothing it asks for can be gone.
                    if (cursor and cursor != BEFORE_FIRST) or is_terminal():
                        ending = self._missing_stream(run_id, requested, unstarted_end)
                        if ending is None:
                            continue  # it appeared meanwhile: a fast run
                        yield [ending]
                        return
                    # Not started yet: wait for the stream to appear.
                    yield from self._until_created(key, is_terminal)
                    continue
                if snap.kind is ReadKind.BEYOND:
                    raise StreamCursorInvalid(
                        f"Last-Event-ID {cursor} is beyond the last event {snap.meta.last} of run {run_id}"
                    )
                if snap.kind is ReadKind.GAP:
                    yield [
                        self._gap(
                            run_id, requested, "the cursor's events were trimmed or lost", snap
                        )
                    ]
                    return
                try:
                    entries = self.decoder.entries(run_id, snap.entries)
                except UndecodableEntry as exc:
                    yield [self._gap(run_id, requested, f"undecodable entries: {exc}")]
                    return
                out: list[StreamItem] = []
                for eid, name, data, n in entries:
                    if name == LOST_EVENT:
                        out.append(self._gap(run_id, requested, "events were lost in a failover"))
                        yield out
                        return
                    out.append(Event(eid, name, data, n))
                    if name == END_EVENT:
                        yield out
                        return
                    cursor, last_n = eid, n
                if out:
                    yield out
                if not snap.entries and cursor == snap.meta.last and snap.last_event == END_EVENT:
                    return  # the cursor is the `end` event itself: nothing follows (B7)
                if last_n is None and cursor:
                    last_n = snap.meta.count  # the cursor is the newest entry
                if len(snap.entries) < self.batch:
                    break
            # Phase 2: follow live; contiguity of `n` proves nothing was trimmed or lost.
            state = _Follow(cursor, last_n)
            done = yield from self._follow(run_id, key, state, is_terminal, unstarted_end)
            if done:
                return
            cursor = state.cursor  # detached (a slow reader): catch up from where it is

    def _until_created(
        self, key: str, is_terminal: Callable[[], bool]
    ) -> Generator[list[StreamItem], None, None]:
        """Heartbeats while `key` has no entry and the run has not ended (one wait, attached
        across the heartbeats); the caller reads again after."""
        with self.entry_wait(key) as waiting:
            while not waiting.wait():
                yield [Heartbeat()]
                if is_terminal():
                    return

    def entry_wait(self, key: str, after: str = "0-0") -> EntryWait:
        """A wait, one heartbeat interval at a time, for `key` to get entries after `after`
        (close it, or use it as a context manager).

        Through the hub when there is one, so a client waiting for a queued run holds no
        Redis connection of its own (a blocked XREAD each would cap a gevent web process
        at the Redis connection count, not at its sockets). It stays attached across the
        heartbeats: attaching and detaching each one woke the hub twice per idle client
        and heartbeat, each wake a new XREAD over every followed stream, so 5,000 idle
        thread streams cost the web 74 % of a core (`python -m bench.growth --part rss`).
        """
        return EntryWait(self, key, after)

    def _follow(
        self,
        run_id: str,
        key: str,
        st: _Follow,
        is_terminal: Callable[[], bool],
        unstarted_end: Callable[[], str | None] | None,
    ) -> Generator[list[StreamItem], None, bool]:
        """Follow live entries (through the hub if there is one); True when finished,
        False when detached for being too slow (the caller catches up on its own)."""
        sub = self._hub.attach(key, st.cursor or "0-0") if self._hub is not None else None
        try:
            while True:
                entries = self._next_entries(key, st, sub)
                if entries is None:
                    ending = self._silent_end(run_id, key, st, is_terminal, unstarted_end)
                    if ending is not None:
                        yield [ending]
                        return True
                    yield [Heartbeat()]
                    continue
                if entries is _DETACHED:
                    return False
                st.idle = 0
                try:
                    decoded = self._decoded(run_id, entries)
                except UndecodableEntry as exc:
                    yield [self._gap(run_id, st.cursor, f"undecodable entries: {exc}")]
                    return True
                batch, done = self._accept(run_id, st, decoded)
                if batch:
                    yield batch
                if done:
                    return True
        finally:
            if sub is not None and self._hub is not None:
                self._hub.detach(sub)

    def _decoded(self, run_id: str, entries: SharedEntries | list[Any]) -> list[Entry]:
        """Entries read live, decoded (once for all subscribers of a hub read)."""
        if isinstance(entries, SharedEntries):
            return entries.decoded(lambda raw: self.decoder.entries(run_id, raw))
        return self.decoder.entries(run_id, entries)

    def _next_entries(self, key: str, st: _Follow, sub: Subscription | None) -> Any:
        """The next entries, None after an idle heartbeat interval, or _DETACHED."""
        if sub is None:
            got: Any = self._client.xread(
                {key: st.cursor or "0-0"}, count=self.batch, block=self._heartbeat_ms
            )
            return got[0][1] if got else None
        try:
            entries = sub.take(self._heartbeat_s)
        except queue.Empty:
            return None
        return _DETACHED if entries is None else entries

    def _silent_end(
        self,
        run_id: str,
        key: str,
        st: _Follow,
        is_terminal: Callable[[], bool],
        unstarted_end: Callable[[], str | None] | None,
    ) -> StreamItem | None:
        """After an idle heartbeat: how the run ended if it did without an `end` we can
        still get, else None (keep following).

        When the stream is missing and the run is terminal: the `end` of a run that never
        started (`unstarted_end`), else a gap. When the run has been terminal for two idle
        heartbeats in a row with its stream there: a gap (its `end` was lost, e.g. a
        publisher that gave up during a Redis outage). Two, because the terminal status is
        committed a moment before `end` is published. After a gap the client reloads
        durable state instead of waiting for ever.
        """
        st.idle += 1
        ask = self.liveness.ask
        if not ask("exists", key, lambda: bool(self._client.exists(key))):
            if not ask("terminal", key, is_terminal):
                return None
            ending = self._missing_stream(run_id, st.cursor, unstarted_end)
            if ending is None:
                st.idle = 0  # it appeared meanwhile: keep following
            return ending
        if st.idle >= 2 and ask("terminal", key, is_terminal):
            return self._gap(run_id, st.cursor, "the run ended and its end event is gone")
        return None

    def _accept(
        self, run_id: str, st: _Follow, entries: list[Entry]
    ) -> tuple[list[StreamItem], bool]:
        """Entries after the cursor, checked for contiguity; (items, finished)."""
        out: list[StreamItem] = []
        floor = id_key(st.cursor) if st.cursor else None
        for eid, name, data, n in entries:
            if floor is not None and id_key(eid) <= floor:
                continue  # already delivered (the hub re-read for another subscriber)
            if st.last_n is not None and n != st.last_n + 1:
                out.append(self._gap(run_id, st.cursor, f"entry {n} follows {st.last_n}"))
                return out, True
            if name == LOST_EVENT:
                out.append(self._gap(run_id, st.cursor, "events were lost in a failover"))
                return out, True
            out.append(Event(eid, name, data, n))
            if name == END_EVENT:
                return out, True
            st.cursor, st.last_n = eid, n
        return out, False

    def retained(self, run_id: str, name: str) -> list[Event]:
        """The retained events named `name` of the run's stream, oldest first (a bounded
        read: the stream keeps at most `stream_maxlen` entries)."""
        got: Any = self._client.xrange(self._keys.stream(run_id))
        try:
            entries = self.decoder.entries(run_id, got)
        except UndecodableEntry:
            return []
        return [Event(eid, e, data, n) for eid, e, data, n in entries if e == name]

    def last_event(self, run_id: str) -> Event | None:
        """The newest retained event, if any."""
        got: Any = self._client.xrevrange(self._keys.stream(run_id), count=1)
        if not got:
            return None
        try:
            eid, name, data, _ = self.decoder.entries(run_id, got)[0]
        except UndecodableEntry:
            return None  # its dictionary expired with it a moment ago
        return Event(eid, name, data)


class EntryWait:
    """`StreamSubscriber.entry_wait`: waits for a stream's entries after a cursor."""

    def __init__(self, subscriber: StreamSubscriber, key: str, after: str) -> None:
        self._subscriber = subscriber
        self._key = key
        self._after = after
        self._hub = subscriber._hub
        self._sub = self._hub.attach(key, after) if self._hub is not None else None

    def wait(self) -> bool:
        """Wait up to one heartbeat interval; True if entries came (or may have: after a
        detach, the caller re-reads; the next wait attaches again)."""
        s = self._subscriber
        if self._hub is None:
            return bool(s._client.xread({self._key: self._after}, count=1, block=s._heartbeat_ms))
        if self._sub is None:
            self._sub = self._hub.attach(self._key, self._after)
        try:
            got = self._sub.take(s._heartbeat_s)
        except queue.Empty:
            return False
        if got is None:  # detached: attach again next time
            self._hub.detach(self._sub)
            self._sub = None
        return True

    def close(self) -> None:
        """Stop waiting (idempotent)."""
        if self._sub is not None and self._hub is not None:
            self._hub.detach(self._sub)
        self._sub = None

    def __enter__(self) -> EntryWait:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
