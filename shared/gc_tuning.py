"""The garbage collector of a long-lived server process, once its start-up is done.

A run allocates hundreds of thousands of short-lived container objects (message chunks,
callback coroutines, events); CPython's default gen0 threshold (700) then runs a young
collection every few tokens and a full collection every ~490,000 allocations, and a full one
walks every object the process loaded at start-up (LangChain, LangGraph, pydantic models:
~180,000 in a runs worker). Measured on the comparison benchmark, that was ~6.7 ms of a
worker's CPU per run (~9 %).

`settle()` collects once, freezes what start-up left (the permanent generation: never walked
again, never freed, which start-up objects are not anyway) and raises the gen0 threshold, so
short-lived objects die by reference count before a collection sees them. Cycles are still
collected, just less often: at most `threshold0` tracked allocations later.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

GEN1_THRESHOLD = 10
GEN2_THRESHOLD = 10


def settle(threshold0: int) -> None:
    """Freeze the start-up heap and set the gen0 threshold (0: leave the collector alone)."""
    if threshold0 <= 0:
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(threshold0, GEN1_THRESHOLD, GEN2_THRESHOLD)
    log.debug(
        "gc: %d start-up objects frozen, gen0 threshold %d", gc.get_freeze_count(), threshold0
    )
