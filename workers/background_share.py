"""The slots a worker keeps for runs a caller asked for (shared/runs/priority.py)."""

from __future__ import annotations

import threading

from shared.runs.priority import BACKGROUND
from shared.runs.run_queue import RunQueue, Taken


class BackgroundShare:
    """Slots kept for runs a caller asked for: background runs (cron firings) hold at most
    `cap` of this worker's slots (shared/runs/priority.py).

    A slot that frees while background runs hold the cap takes only a foreground run or a
    re-dispatch. When none waits, the message that woke it is owed: it is sent again when
    one of the background runs ends (`done`), so a waiting firing never lacks a message
    while this worker has room for it. A worker that dies owes nothing anyone needs: its
    runs' leases expire and the reaper re-dispatches the pending ones (R4).

    Called from Celery's task threads, hence the lock.
    """

    def __init__(self, cap: int) -> None:
        self.cap = max(1, cap)
        self.running = 0
        self.owed = 0
        self._lock = threading.Lock()

    def take(self, queue: RunQueue) -> Taken | None:
        """The best waiting run this slot may start, or None (the message owed when a
        background run waits that the cap keeps out)."""
        with self._lock:
            room = self.running < self.cap
            if room:
                self.running += 1  # held while taking, so two slots cannot both pass the cap
        taken = queue.pop() if room else queue.pop(below=BACKGROUND[0])
        if taken is None or taken.priority < BACKGROUND[0]:
            with self._lock:
                if room:
                    self.running -= 1
                if taken is None and not room and queue.depth() > 0:
                    self.owed += 1
        return taken

    def done(self, taken: Taken) -> bool:
        """The run `taken` ended on this slot; True when a message is owed and should be
        sent now (a background slot freed)."""
        if taken.priority < BACKGROUND[0]:
            return False
        with self._lock:
            self.running -= 1
            if self.owed:
                self.owed -= 1
                return True
        return False
