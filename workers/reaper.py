"""Recovery that never waits for the broker (R4, L4): lost dispatches and expired leases.

Every runs worker runs this loop; a Redis leader lock (SET NX PX, renewed by the
holder) makes one of them active at a time, and any other takes over within one lock
TTL when the leader dies, so there is no single point whose death stops recovery.

A run whose lease expired ends with the cause its last attempt recorded, at once when that
cause is one no retry gets past (the graph is not served or cannot be loaded), and its
owner's loss is kept for the ops view (shared/ops/worker_history.py), once per worker.

The leader also keeps the tables' planner statistics where autovacuum did not
(`StatisticsUpkeep`, shared/db/statistics.py): once per `analyze_interval_s`, in a task of
its own, so a long ANALYZE never delays recovery.
"""

from __future__ import annotations

import asyncio
import functools
import logging

import psycopg

from shared import lua, metrics, serde
from shared.bridge.base import END_EVENT
from shared.bridge.publisher import PublishCall
from shared.db.statistics import AnalyzeOutcome, TableStatistics, stale_tables
from shared.ops.worker_history import LEASES_EXPIRED
from shared.redis_keys import REAPER_LEAD_TTL_INTERVALS
from shared.runs.leases import lease_value
from shared.runs.model import CancelAction, RunStatus
from shared.vocab import JSONObject
from workers.attempts import reaped_error
from workers.finalize_steps import count_finished, release_active
from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)


async def _lead(rt: WorkerRuntime, ttl_ms: int) -> bool:
    """Take the leader lock if free or renew it if ours, in one step (reaper_lead.lua)."""
    lead = lua.register(rt.redis, "reaper_lead")
    return bool(await lead(keys=[rt.keys.reaper_leader()], args=[rt.worker_id, ttl_ms]))


async def reap_once(rt: WorkerRuntime) -> dict[str, int]:
    """One pass: re-dispatch lost pending heads, re-queue running runs with no live lease,
    delete the temporary threads whose runs ended and that are still there, fold the runs'
    status counts."""
    s = rt.settings
    counts = {"redispatched": 0, "requeued": 0, "failed": 0, "locked": 0}
    purged = await asyncio.to_thread(
        rt.remover.purge_temporary,
        grace_s=s.temporary_thread_grace_s,
        lock_timeout_s=s.reaper_lock_timeout_s,
    )
    counts["temporary_deleted"] = purged.deleted
    counts["locked"] += purged.locked
    # The ops view's run counts stay a few rows to read (migration 0018).
    await asyncio.to_thread(rt.store.compact_run_counts)
    for run_id in await asyncio.to_thread(rt.store.stale_pending_heads, s.dispatch_stale_s):
        if await asyncio.to_thread(rt.dispatcher.dispatch_quietly, run_id):
            counts["redispatched"] += 1
    # Webhooks of ended runs whose dispatch was lost (shared/webhooks/store.py).
    for run_id in await asyncio.to_thread(rt.webhooks.sweep, s.webhook_stale_s):
        if await asyncio.to_thread(rt.dispatcher.dispatch_webhook, run_id):
            counts["webhooks_redispatched"] = counts.get("webhooks_redispatched", 0) + 1
    lost: dict[str, list[str]] = {}  # owner -> its runs whose lease expired
    for run in await asyncio.to_thread(rt.store.running_runs, s.lease_ttl_s):
        run_id, epoch, attempt = run.run_id, run.owner_epoch, run.attempt
        if await rt.leases.is_held(run_id):
            continue
        reason = f"owner lease expired after attempt {attempt}"
        # What the attempt recorded it failed with, if it could (workers/executor.py); an
        # owner that recorded why its attempt failed was not lost.
        cause = await asyncio.to_thread(rt.store.attempt_cause, run_id, attempt)
        if run.owner and cause is None:
            lost.setdefault(run.owner, []).append(run_id)
        permanent = bool(cause and cause.get("permanent"))
        # A rollback requested of a run whose owner then died still gets done: one more
        # attempt, which restores the pre-run state instead of running the graph (R5).
        rollback_due = run.cancel_action is CancelAction.ROLLBACK and attempt == s.max_attempts
        try:
            if not permanent and (attempt < s.max_attempts or rollback_due):
                requeued = await asyncio.to_thread(
                    rt.store.requeue, run_id, epoch, reason, lock_timeout_s=s.reaper_lock_timeout_s
                )
                if requeued:
                    counts["requeued"] += 1
                    await asyncio.to_thread(rt.dispatcher.dispatch_quietly, run_id)
                continue
            error = reaped_error(
                attempt=attempt, max_attempts=s.max_attempts, owner=run.owner, cause=cause
            )
            if await fail_run(rt, run_id, epoch, reason, error):
                counts["failed"] += 1
                metrics.run_finished(RunStatus.ERROR, None)  # L5: its owners kept dying
                if run.owner:
                    await count_finished(rt, run.owner, RunStatus.ERROR)
        except psycopg.errors.LockNotAvailable:
            # A frozen owner is inside a fenced write; PostgreSQL ends its session after
            # fence_idle_timeout_s, and the next pass gets the row. Never hang the pass.
            counts["locked"] += 1
    await _record_losses(rt, lost)
    return counts


async def _record_losses(rt: WorkerRuntime, lost: dict[str, list[str]]) -> None:
    """Keep the loss of each owner whose runs' leases expired (once per worker, whoever
    records it first). Best effort: recovery does not depend on it."""
    for owner, run_ids in lost.items():
        try:
            await rt.history.record_loss(owner, run_ids, LEASES_EXPIRED)
        except Exception:
            log.warning("could not record the loss of worker %s", owner, exc_info=True)


async def fail_run(
    rt: WorkerRuntime, run_id: str, epoch: int, reason: str, error: JSONObject | None = None
) -> bool:
    """L5: end the run `error` (with `error`, by default MaxAttemptsExceeded with `reason`),
    then, as its new owner, publish `error` and `end` (A1, G4) so that every stream, join
    and wait on it finishes."""
    expired = await asyncio.to_thread(
        functools.partial(
            rt.store.fail_expired,
            run_id,
            epoch,
            rt.worker_id,
            reason,
            lock_timeout_s=rt.settings.reaper_lock_timeout_s,
            error=error,
        )
    )
    if expired is None:
        return False
    await release_active(rt, expired.user_id, run_id)
    if expired.next_run_id:
        await asyncio.to_thread(rt.dispatcher.dispatch_quietly, expired.next_run_id)
    # Its webhook, if it has one (a run without one: the task finds no delivery).
    await asyncio.to_thread(rt.dispatcher.dispatch_webhook, run_id)
    value = lease_value(expired.epoch, rt.worker_id)
    if await rt.leases.acquire(run_id, expired.epoch, rt.worker_id):
        try:
            await rt.publisher.publish(
                PublishCall(
                    run_id,
                    value,
                    1,
                    [
                        ("error", serde.dumps(expired.error)),
                        (END_EVENT, serde.dumps({"run_id": run_id, "status": RunStatus.ERROR})),
                    ],
                    end=True,
                )
            )
        except Exception:  # subscribers still see the terminal status
            log.exception("publishing the reaped run's end failed", extra={"run_id": run_id})
        finally:
            await rt.leases.release(run_id, value)
    return True


async def analyze_stale(rt: WorkerRuntime, stats: TableStatistics) -> dict[str, int]:
    """One statistics pass: ANALYZE each table that lacks planner statistics (never
    analyzed, or changed by more than `analyze_threshold` since); counts by outcome."""
    s = rt.settings
    tables = stale_tables(await asyncio.to_thread(stats.read), s.analyze_threshold)
    counts = {outcome.value: 0 for outcome in AnalyzeOutcome}
    for table in tables:
        outcome = await asyncio.to_thread(
            functools.partial(stats.analyze, table, lock_timeout_s=s.reaper_lock_timeout_s)
        )
        counts[outcome.value] += 1
    if tables:
        log.info("reaper: planner statistics of %s: %s", ", ".join(tables), counts)
    return counts


def upkeep_due(now: float, next_at: float, interval: float, running: bool) -> bool:
    """Whether a statistics pass starts now: enabled, none running, its time come."""
    return interval > 0 and not running and now >= next_at


class StatisticsUpkeep:
    """Starts `analyze_stale` on the leader at most once per `analyze_interval_s`, as a task
    of its own (an ANALYZE of a large table takes seconds; the recovery pass must not wait).

    The leader lock makes the leader the one process of the deployment that does it; after
    a handover the new leader checks at once, and finds nothing to do when its predecessor
    just did it (an analyzed table no longer `needs_analyze`)."""

    def __init__(self, rt: WorkerRuntime) -> None:
        self.rt = rt
        self.interval = rt.settings.analyze_interval_s
        self.stats = TableStatistics(rt.store.pool)
        self.next_at = 0.0
        self.task: asyncio.Task[None] | None = None

    def poke(self) -> None:
        """Start a pass if one is due (called by the leader on every reaper pass)."""
        now = asyncio.get_running_loop().time()
        running = self.task is not None and not self.task.done()
        if not upkeep_due(now, self.next_at, self.interval, running):
            return
        self.next_at = now + self.interval
        self.task = asyncio.create_task(self._pass(), name="threadrun-statistics")

    async def _pass(self) -> None:
        try:
            await analyze_stale(self.rt, self.stats)
        except Exception:  # retried next interval; recovery does not depend on it
            log.exception("reaper: the planner statistics pass failed")


async def reaper_loop(rt: WorkerRuntime) -> None:
    """Forever: if leader, reap (and keep the planner statistics); sleep one interval."""
    interval = rt.settings.reaper_interval_s
    ttl_ms = int(interval * REAPER_LEAD_TTL_INTERVALS * 1000)
    upkeep = StatisticsUpkeep(rt)
    while True:
        try:
            if await _lead(rt, ttl_ms):
                upkeep.poke()
                counts = await reap_once(rt)
                if any(counts.values()):
                    log.info("reaper: %s", counts)
        except asyncio.CancelledError:
            raise
        except Exception:  # a failed pass is retried next interval
            log.exception("reaper pass failed")
        await asyncio.sleep(interval)
