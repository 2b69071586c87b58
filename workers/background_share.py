"""The slots a worker keeps for runs a caller asked for (shared/runs/priority.py), and how
background runs yield while callers' runs are running anywhere (`CallerActivity`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis

from shared.runs.priority import BACKGROUND
from shared.runs.run_queue import RunQueue, Taken

CALLERS_TTL_S = 3.0
"""How long the deployment counts as busy with callers' runs after a worker last said so
(`CallerActivity`): a worker that dies stops saying it within this."""
CALLERS_REFRESH_S = 1.0
"""How often a worker running callers' runs says so again (a third of the TTL)."""
CALLERS_CACHE_S = 0.25
"""How long a background slot trusts its last look at the signal."""


class CallerActivity:
    """Whether runs a caller asked for are running anywhere in the deployment: a Redis key
    (`Keys.callers_busy`) that each worker running one keeps set with a short TTL.

    Background workers read it to yield (`BackgroundShare`): while a caller's run is
    running, cron firings start on at most `background_yield_slots` slots per worker, so
    their work in PostgreSQL and Redis (which no `nice` reaches) does not slow the caller's
    run either. Nothing waits on it: a lost key only makes firings go at full speed again.
    Setting it costs no round trip on a run's path: at most once a `CALLERS_REFRESH_S`,
    from a thread of its own while runs are held.
    """

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.redis = client
        self.key = key
        self.running = 0
        self._said_at = -CALLERS_REFRESH_S
        self._looked: tuple[float, bool] = (-CALLERS_CACHE_S, False)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self) -> None:
        """A caller's run starts on this worker."""
        with self._lock:
            self.running += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._keep, name="threadrun-callers", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def end(self) -> None:
        """A caller's run ended on this worker."""
        with self._lock:
            self.running -= 1

    def _keep(self) -> None:
        while True:
            self._wake.wait(CALLERS_REFRESH_S)
            self._wake.clear()
            now = time.monotonic()
            if self.running > 0 and now - self._said_at >= CALLERS_REFRESH_S:
                try:
                    self.redis.set(self.key, "1", ex=int(CALLERS_TTL_S))
                    self._said_at = now
                except redis.RedisError:
                    pass  # the signal only slows firings down; the next pass says it again

    def busy(self) -> bool:
        """Whether a caller's run is running somewhere (looked up at most every
        `CALLERS_CACHE_S`; an unreachable Redis counts as not busy)."""
        at, busy = self._looked
        now = time.monotonic()
        if now - at < CALLERS_CACHE_S:
            return busy
        try:
            busy = bool(self.redis.exists(self.key))
        except redis.RedisError:
            busy = False
        self._looked = (now, busy)
        return busy


class BackgroundShare:
    """Slots kept for runs a caller asked for: background runs (cron firings) hold at most
    `cap` of this worker's slots (shared/runs/priority.py), and at most `yield_slots`
    while `callers_busy()` says a caller's run is running (0: they never yield).

    A slot that frees while background runs hold the cap takes only a foreground run or a
    re-dispatch. When none waits, the message that woke it is owed: it is sent again when
    one of the background runs ends (`done`), so a waiting firing never lacks a message
    while this worker has room for it. A worker that dies owes nothing anyone needs: its
    runs' leases expire and the reaper re-dispatches the pending ones (R4).

    Called from Celery's task threads, hence the lock.
    """

    def __init__(
        self, cap: int, yield_slots: int = 0, callers_busy: Callable[[], bool] | None = None
    ) -> None:
        self.cap = max(1, cap)
        self.yield_slots = yield_slots
        self.callers_busy = callers_busy
        self.callers_here = True
        """Whether this worker consumes the runs queue too (a background worker does not)."""
        self.running = 0
        self.owed = 0
        self._lock = threading.Lock()

    def _limit(self, running: int) -> int:
        """The cap that holds now: the yield's while callers' runs are running (looked up
        only when it could matter)."""
        if not self.yield_slots or running < self.yield_slots or self.callers_busy is None:
            return self.cap
        return min(self.cap, self.yield_slots) if self.callers_busy() else self.cap

    def take(self, queue: RunQueue, *, background: bool = False) -> Taken | None:
        """The best waiting run this slot may start, or None (the message owed when a
        background run waits that the cap keeps out). A `background` message (the
        background queue's) on a background worker takes only a background run: a caller's
        run has a message of its own on the runs queue, which that worker does not consume.
        On a worker of both queues it takes the best waiting run like any other: which of
        its messages comes first is the broker's round robin, not the runs' priority."""
        with self._lock:
            room = self.running < self._limit(self.running)
            if room:
                self.running += 1  # held while taking, so two slots cannot both pass the cap
        if background and not self.callers_here:
            taken = queue.pop(at_least=BACKGROUND[0]) if room else None
        else:
            taken = queue.pop() if room else queue.pop(below=BACKGROUND[0])
        if taken is None or taken.priority < BACKGROUND[0]:
            with self._lock:
                if room:
                    self.running -= 1
                if taken is None and not room and queue.depth() > 0:
                    self.owed += 1
        return taken

    def done(self, taken: Taken) -> int:
        """The run `taken` ended on this slot; how many owed messages to send now: one for
        the slot that freed, or as many as the cap now has room for (the yield ended)."""
        if taken.priority < BACKGROUND[0]:
            return 0
        with self._lock:
            self.running -= 1
            if not self.owed:
                return 0
            room = max(1, self._limit(self.running) - self.running)
            due = min(self.owed, room)
            self.owed -= due
            return due
