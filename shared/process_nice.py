"""A process that does only background work (a background worker, the cron scheduler) lowers
its own OS priority, so cron firings get the CPU callers' runs leave (`process_nice`)."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def lower_priority(nice: int) -> None:
    """Raise the calling thread's nice value to `nice` (never lower it: that needs
    privileges). Call it before the process starts its threads: Linux keeps a nice value
    per thread, and a new thread inherits its creator's."""
    now = os.nice(0)
    if nice > now:
        os.nice(nice - now)
        log.info("process priority lowered: nice %d", nice)
