"""Open SSE/WebSocket connections and stream subscribers, across every web process.

Each web process counts its own in a `ConnectionTracker` (in memory, no IO on the request
path); a `ConnectionReporter` thread writes the counts to a Redis hash of that process
with a TTL of three report periods, and indexes the process in a sorted set. Readers sum
the hashes of the processes that reported recently, so a crashed process drops out
within one TTL and any web process gives the same answer.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis

from shared.redis_keys import OPS_WEB_TTL_PERIODS, Keys

log = logging.getLogger(__name__)

SUB_PREFIX = "sub:"


@dataclass(frozen=True, slots=True)
class Ticket:
    """One open connection or subscription (returned by `open`, given to `close`)."""

    transport: str
    run_id: str | None


class ConnectionTracker:
    """This process's open connections by transport, and subscribers by run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._transports: Counter[str] = Counter()
        self._runs: Counter[str] = Counter()
        self.changed = threading.Event()

    def open(self, transport: str | None, run_id: str | None = None) -> Ticket:
        """Count a connection (`transport` set) and/or a subscriber of `run_id`."""
        with self._lock:
            if transport:
                self._transports[transport] += 1
            if run_id:
                self._runs[run_id] += 1
        self.changed.set()
        return Ticket(transport or "", run_id)

    def close(self, ticket: Ticket) -> None:
        """Undo one `open`."""
        with self._lock:
            if ticket.transport:
                self._transports[ticket.transport] -= 1
                if self._transports[ticket.transport] <= 0:
                    del self._transports[ticket.transport]
            if ticket.run_id:
                self._runs[ticket.run_id] -= 1
                if self._runs[ticket.run_id] <= 0:
                    del self._runs[ticket.run_id]
        self.changed.set()

    def snapshot(self) -> dict[str, int]:
        """`{transport: n, "sub:<run_id>": n}`."""
        with self._lock:
            out = dict(self._transports)
            out.update({SUB_PREFIX + r: n for r, n in self._runs.items()})
        return out


TRACKER = ConnectionTracker()
"""The process's tracker: counters only, no connection (the reporter holds the client)."""


def process_id() -> str:
    """A name for this web process, unique across hosts and restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class ConnectionReporter:
    """Writes a tracker's counts to Redis every `period_s` (sooner after a change)."""

    client: redis.Redis
    keys: Keys
    tracker: ConnectionTracker
    period_s: float
    proc: str = field(default_factory=process_id)
    min_gap_s: float = 0.2
    _stop: threading.Event = field(default_factory=threading.Event)
    _start_lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the daemon thread (idempotent, thread-safe; cheap once started)."""
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="threadrun-ops-report", daemon=True
                )
                self._thread.start()

    def halt(self) -> None:
        """Stop reporting; the record expires by itself (for a Redis that is gone)."""
        self._stop.set()
        self.tracker.changed.set()

    def stop(self) -> None:
        """Stop reporting and remove this process's record."""
        self.halt()
        try:
            self.client.delete(self.keys.ops_web(self.proc))
            self.client.zrem(self.keys.ops_web_index(), self.proc)
        except redis.RedisError:
            pass

    def report(self) -> None:
        """One write of the current counts."""
        snap = self.tracker.snapshot()
        key = self.keys.ops_web(self.proc)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(key)
        if snap:
            pipe.hset(key, mapping=dict[Any, Any](snap))
        pipe.hset(key, "_alive", 1)
        pipe.expire(key, max(1, int(self.period_s * OPS_WEB_TTL_PERIODS)))
        pipe.zadd(self.keys.ops_web_index(), {self.proc: time.time()})
        pipe.execute()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tracker.changed.clear()
            try:
                self.report()
            except redis.RedisError as exc:
                log.warning("ops connection report failed: %s", exc)
            self.tracker.changed.wait(self.period_s)
            self._stop.wait(self.min_gap_s)  # coalesce bursts of opens/closes


@dataclass(frozen=True, slots=True)
class Connections:
    """Counts summed over the live web processes."""

    by_transport: dict[str, int]
    subscribers: dict[str, int]
    processes: int


def read_connections(client: redis.Redis, keys: Keys, period_s: float) -> Connections:
    """Sum the records of web processes that reported within the TTL; prune the rest."""
    index = keys.ops_web_index()
    cutoff = time.time() - period_s * OPS_WEB_TTL_PERIODS
    client.zremrangebyscore(index, "-inf", cutoff)
    procs = [p.decode() if isinstance(p, bytes) else str(p) for p in client.zrange(index, 0, -1)]
    pipe = client.pipeline(transaction=False)
    for p in procs:
        pipe.hgetall(keys.ops_web(p))
    transports: Counter[str] = Counter()
    subs: Counter[str] = Counter()
    alive = 0
    for rec in pipe.execute() if procs else []:
        if not rec:
            continue
        alive += 1
        for raw_k, raw_v in rec.items():
            k = raw_k.decode() if isinstance(raw_k, bytes) else str(raw_k)
            if k == "_alive":
                continue
            n = int(raw_v)
            if k.startswith(SUB_PREFIX):
                subs[k[len(SUB_PREFIX) :]] += n
            else:
                transports[k] += n
    return Connections(dict(transports), dict(subs), alive)
