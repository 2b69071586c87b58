"""Recovery that never waits for the broker (R4, L4): lost dispatches and expired leases.

Every runs worker runs this loop; a Redis leader lock (SET NX PX, renewed by the
holder) makes one of them active at a time, and any other takes over within one lock
TTL when the leader dies, so there is no single point whose death stops recovery.
"""

from __future__ import annotations

import asyncio
import logging

from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)


async def _lead(rt: WorkerRuntime, ttl_ms: int) -> bool:
    key = rt.keys.reaper_leader()
    if await rt.redis.set(key, rt.worker_id, nx=True, px=ttl_ms):
        return True
    holder = await rt.redis.get(key)
    if holder is not None and holder.decode() == rt.worker_id:
        await rt.redis.pexpire(key, ttl_ms)
        return True
    return False


async def reap_once(rt: WorkerRuntime) -> dict[str, int]:
    """One pass: re-dispatch lost pending heads, re-queue running runs with no live lease."""
    s = rt.settings
    counts = {"redispatched": 0, "requeued": 0, "failed": 0}
    for run_id in await asyncio.to_thread(rt.store.stale_pending_heads, s.dispatch_stale_s):
        await asyncio.to_thread(rt.dispatcher.dispatch_run, run_id)
        counts["redispatched"] += 1
    for run in await asyncio.to_thread(rt.store.running_runs, s.lease_ttl_s):
        if await rt.leases.is_held(run["run_id"]):
            continue
        outcome, to_dispatch = await asyncio.to_thread(
            rt.store.requeue_expired,
            run["run_id"],
            int(run["owner_epoch"]),
            int(run["attempt"]),
            s.max_attempts,
            f"owner lease expired after attempt {run['attempt']}",
        )
        if outcome == "requeued":
            counts["requeued"] += 1
        elif outcome == "failed":
            counts["failed"] += 1
        if to_dispatch:
            await asyncio.to_thread(rt.dispatcher.dispatch_run, to_dispatch)
    return counts


async def reaper_loop(rt: WorkerRuntime) -> None:
    """Forever: if leader, reap; sleep one interval."""
    interval = rt.settings.reaper_interval_s
    ttl_ms = int(interval * 3 * 1000)
    while True:
        try:
            if await _lead(rt, ttl_ms):
                counts = await reap_once(rt)
                if any(counts.values()):
                    log.info("reaper: %s", counts)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a failed pass is retried next interval
            log.exception("reaper pass failed")
        await asyncio.sleep(interval)
