"""Per-process subscription hub: one reader thread follows every stream this process's clients follow.

Without it each live subscriber holds a Redis connection blocked in its own XREAD; with
it, one blocking `XREAD … STREAMS k1 k2 …` on one connection serves them all and fans
each entry out to per-subscriber queues. A new or departing stream wakes the reader with
`CLIENT UNBLOCK`, so it never waits out a block timeout.

Exactness stays with the subscriber (shared/bridge/subscriber.py): entries carry the
publisher's count `n`, and a subscriber that sees a jump knows something was trimmed or
lost. A subscriber whose queue overflows (a slow client) is detached and re-reads from
its own cursor through the gap-checked snapshot, so one slow client never slows the hub
or other clients.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)

QUEUE_LIMIT = 4096
"""Entries buffered per subscriber before it is detached (it then catches up on its own)."""


class SharedEntries:
    """One XREAD reply's entries of one stream, as every subscriber of it gets them.

    The first subscriber that needs them decoded (the stream encoding: decompression,
    shared/bridge/codec.py) decodes them for all: a run followed by a thousand clients
    costs one decode an entry, not a thousand.
    """

    __slots__ = ("_decoded", "_lock", "raw")

    def __init__(self, raw: list[Any]) -> None:
        self.raw = raw
        self._decoded: list[Any] | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.raw)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.raw)

    def decoded(self, decode: Callable[[list[Any]], list[Any]]) -> list[Any]:
        """`decode(raw)`, computed once (a failure is not remembered: the next one retries)."""
        with self._lock:
            if self._decoded is None:
                self._decoded = decode(self.raw)
            return self._decoded


@dataclass(eq=False)
class Subscription:
    """One subscriber's queue on one stream."""

    key: str
    cursor: str
    queue: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    pos: str = ""  # the newest id offered to it (starts at its cursor)
    size: int = 0
    overflowed: bool = False

    def __post_init__(self) -> None:
        self.pos = self.pos or self.cursor

    def offer(self, entries: SharedEntries) -> None:
        """Hand entries to the subscriber unless it has fallen too far behind."""
        if self.overflowed:
            return
        if self.size + len(entries) > QUEUE_LIMIT:
            self.overflowed = True
            self.queue.put(None)  # wake it: it must catch up by itself
            return
        self.size += len(entries)
        self.queue.put(entries)

    def take(self, timeout: float) -> SharedEntries | None:
        """The next entries (None = detached), or raise queue.Empty after `timeout`."""
        got = self.queue.get(timeout=timeout)
        if got is not None:
            self.size -= len(got)
        return got  # type: ignore[no-any-return]


class SubscriptionHub:
    """The reader thread and the registry of followed streams."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        batch: int = 500,
        block_ms: int = 5000,
        linger_s: float = 0.0,
        reconnect_base_s: float = 0.1,
        reconnect_cap_s: float = 1.0,
    ) -> None:
        self._client = client
        # The reader's waits between reconnects: base, doubling, up to the cap (the client
        # retries' THREADRUN_REDIS_RETRY_BASE_S / _CAP_S: 0.1, 0.2, 0.4, 0.8, then 1 s).
        self._reconnect_base_s = reconnect_base_s
        self._reconnect_cap_s = reconnect_cap_s
        self._batch = batch
        self._block_ms = block_ms
        # With no stream to follow the reader waits this long for the next attach before it
        # closes its connection and ends: a web process that streams one run after another
        # would otherwise connect (and start a thread) again on every first event's path.
        self._linger_s = linger_s
        self._attached = threading.Event()
        self._lock = threading.Lock()
        self._streams: dict[str, dict[Subscription, None]] = {}
        self._positions: dict[str, str] = {}
        self._conn: redis.Redis | None = None
        self._conn_id: int | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    # --- subscriber side ------------------------------------------------------------------
    def attach(self, key: str, cursor: str) -> Subscription:
        """Follow `key` after `cursor` (a real id: the subscriber has caught up to it)."""
        sub = Subscription(key, cursor)
        with self._lock:
            subs = self._streams.setdefault(key, {})
            position = self._positions.get(key)
            if position is None or _less(cursor, position):
                # Start (or restart) the hub's read of this stream at the earliest cursor
                # any subscriber needs; subscribers drop entries they already have.
                self._positions[key] = cursor
            subs[sub] = None
        self._attached.set()
        self._ensure_thread()
        self._wake()
        return sub

    def detach(self, sub: Subscription) -> None:
        """Stop following (idempotent)."""
        removed = False
        with self._lock:
            subs = self._streams.get(sub.key)
            if subs is not None:
                subs.pop(sub, None)
                if not subs:
                    del self._streams[sub.key]
                    self._positions.pop(sub.key, None)
                    removed = True
        if removed:
            self._wake()  # stop following it now, not after the block timeout

    @property
    def followed(self) -> int:
        """How many streams the reader follows."""
        with self._lock:
            return len(self._streams)

    # --- reader side -------------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._run, name="threadrun-hub", daemon=True)
            self._thread.start()

    def _wake(self) -> None:
        conn_id = self._conn_id
        if conn_id is None:
            return
        try:
            self._client.client_unblock(conn_id)
        except redis.RedisError:
            log.debug("hub wake failed", exc_info=True)

    def _connect(self) -> redis.Redis:
        # A dedicated connection: CLIENT UNBLOCK needs to know which one is blocked. It is
        # built like the client's (with Sentinel: the same Sentinel-managed connection class,
        # so it finds the current master), but without command retries: a retry reconnects
        # under a new client id (after a failover, on another server), and `_wake` would
        # then unblock someone else while this read waits out its block. A failed read ends
        # here instead, and `_run` reconnects and learns the new id.
        pool = redis.ConnectionPool(
            connection_class=self._client.connection_pool.connection_class,
            max_connections=1,
            **{**self._client.connection_pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)},
        )
        conn = redis.Redis(connection_pool=pool, single_connection_client=True)
        try:
            self._conn_id = int(conn.client_id())
        except BaseException:
            self._drop(conn)
            raise
        return conn

    def _drop(self, conn: redis.Redis | None) -> None:
        """Forget the reader's connection and close its socket (`Redis.close` of a client
        on a pool of its own only hands the connection back to that pool)."""
        self._conn = None
        self._conn_id = None
        if conn is not None:
            conn.close()
            conn.connection_pool.disconnect()

    def _run(self) -> None:
        failures = 0
        while not self._stopped.is_set():
            try:
                if self._conn is None:
                    self._conn = self._connect()
                self._attached.clear()
                with self._lock:
                    streams: dict[Any, Any] = dict(self._positions)
                if not streams:
                    if self._attached.wait(self._linger_s) and not self._stopped.is_set():
                        continue  # a follower came within the linger: same connection
                    self._drop(self._conn)
                    with self._lock:
                        if not self._positions:
                            self._thread = None
                            return
                    continue
                got: Any = self._conn.xread(streams, count=self._batch, block=self._block_ms)
            except redis.RedisError as exc:
                failures += 1
                if failures == 1:
                    log.warning("hub read failed; reconnecting", exc_info=True)
                else:
                    log.info("hub reconnect %d failed: %s", failures, exc)
                self._drop(self._conn)
                # Back off like the client retries (shared/redis_clients.py): a failover
                # takes seconds, and every attempt asks the Sentinels.
                backoff = self._reconnect_base_s * 2 ** (failures - 1)
                self._stopped.wait(min(self._reconnect_cap_s, backoff))
                continue
            failures = 0
            self._deliver(streams, got or [])

    def _deliver(self, read_from: dict[Any, Any], got: list[Any]) -> None:
        """Fan one XREAD reply out, keeping every subscriber's view contiguous.

        An `attach` may rewind a stream's position while the read was in flight. Then the
        position is left where the attach put it (the next read fetches the earlier
        entries), and a subscriber that needs entries before this batch does not get it:
        handing it a batch that starts after a hole would look like a gap.
        """
        for raw_key, entries in got:
            key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            if not entries:
                continue
            start = read_from[key]
            last = entries[-1][0].decode()
            with self._lock:
                if key not in self._positions:
                    continue
                if self._positions[key] == start:
                    self._positions[key] = last
                subs = list(self._streams.get(key, ()))
            shared = SharedEntries(entries)
            for sub in subs:
                if _less(sub.pos, start):
                    continue  # it needs earlier entries: the rewound read brings them
                sub.offer(shared)
                if _less(sub.pos, last):
                    sub.pos = last

    def close(self) -> None:
        """Stop the reader thread."""
        self._stopped.set()
        self._attached.set()
        self._wake()


def _less(a: str, b: str) -> bool:
    ams, _, aseq = a.partition("-")
    bms, _, bseq = b.partition("-")
    return (int(ams), int(aseq or 0)) < (int(bms), int(bseq or 0))
