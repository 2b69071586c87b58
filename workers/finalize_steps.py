"""The steps of a run's finalization (J5), each made to hold through what can fail there.

`executor.finalize` is the order: flush the journal -> delivery receipt -> terminal
status -> `end`. What each step has to survive is here, so that order stays readable:
the journal flush fails open and the receipt is written with bounded retries; the
terminal write is retried through a PostgreSQL restart and never lands twice; the `end`
is retried through a Redis outage, never twice and never past a newer epoch. The side
effects of an ended run are best effort: the user's active-run slot (A4, also given
back by the reaper for the runs it ends), the head copy written with the status, the
worker's finished-run count of the ops view, and for a thread deleted with its run the
kept `/wait` answer and the deletion. An attempt that fails without ending its run
records why (`record_failure`), for the reaper that ends it later.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from shared import serde, workspaces
from shared.bridge.publisher import EventSink
from shared.errors import LeaseLost
from shared.journal import settle_delivery, write_delivery_receipt
from shared.redis_keys import ENDED_RUN_TTL_MS, LimitKeys
from shared.runs.model import JSONObject, RunStatus, ThreadStatus
from shared.runs.result import final_result
from shared.runs.store import Finish
from shared.state import head_copies
from workers.attempts import TRANSIENT_ERRORS, GraphOutcome, RunAttempt, attempt_cause
from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)


async def settle_journal(
    rt: WorkerRuntime, attempt: RunAttempt, outcome: GraphOutcome
) -> tuple[GraphOutcome, JSONObject | None]:
    """J5 (1) flush the journal, failing open; (2) write the delivery receipt.

    Returns the outcome to commit and the run's usage: a success that produced output
    becomes `error` (and its thread `error`) when its receipt cannot be written after
    bounded retries.
    """
    ids = {"run_id": attempt.run_id, "thread_id": attempt.thread_id}
    journal = attempt.journal
    if journal is None:
        return outcome, None
    flushed = True
    try:
        await journal.flush()
    except Exception:  # G3: the journal fails open, finalization goes on
        flushed = False
        log.exception("journal flush failed; finalizing anyway", extra=ids)
    receipt = await asyncio.to_thread(
        write_delivery_receipt,
        rt.events,
        attempt.run_id,
        attempt.thread_id,
        attempt.run.attempt,
        journal.produced_output,
        journal.artifact_paths(),
        workspaces.owner_root(rt.settings.workspace_dir, attempt.run.user_id),
        attempts=rt.settings.delivery_receipt_attempts,
        backoff_s=rt.settings.delivery_receipt_backoff_s,
        epoch=attempt.epoch,  # L2: only the current owner writes the receipt
    )
    status, error = settle_delivery(outcome.status, outcome.error, journal.produced_output, receipt)
    settled = outcome
    if status != outcome.status:
        settled = GraphOutcome(RunStatus(status), error, ThreadStatus.ERROR)
    usage = journal.usage()
    if flushed and attempt.run.attempt > 1:  # a first attempt's journal holds all of it
        try:  # every attempt's usage, not just this one's
            usage = await asyncio.to_thread(rt.events.run_usage, attempt.run_id)
        except Exception:  # the attempt's own figures stand in
            log.exception("run usage query failed", extra=ids)
    return settled, usage


async def head_copy_writer(
    rt: WorkerRuntime, attempt: RunAttempt, outcome: GraphOutcome
) -> functools.partial[None] | None:
    """The write of the thread's head copy (the `values` and `interrupts` of thread objects,
    `shared.state.head_copies`) for the terminal transaction, where the epoch fences it.

    The head is final here: the graph has stopped, a rollback is done, and no other run
    of the thread or state update can start while this one is `running`. None when it
    cannot be read (reads then compute it from the checkpoint) or the thread is deleted
    with its run.
    """
    if attempt.run.deletes_thread:
        return None
    head = outcome.head
    if head is None:
        try:
            head = await rt.state.ahead(attempt.thread_id, attempt.run.graph_id)
        except Exception:  # a cache: the run finalizes without it
            log.exception("could not read the final head", extra={"run_id": attempt.run_id})
            return None
    if head is None or head.checkpoint_id is None:
        return None
    return functools.partial(
        head_copies.write_fenced,
        heads=[(attempt.thread_id, head)],
        max_bytes=rt.settings.thread_values_max_bytes,
    )


async def finish_once(
    rt: WorkerRuntime, attempt: RunAttempt, finish: Callable[[], Finish]
) -> Finish:
    """The fenced terminal write, through a PostgreSQL restart: a connection lost at the
    commit leaves it unknown whether the status was written. Retried while our lease
    lives (the write is fenced on our epoch and `running`, so a retry never writes twice);
    before each retry the row says whether the lost commit landed, in which case the run
    is ours to end (its `end` must still be published, or its streams end with a gap)."""
    deadline = time.monotonic() + rt.settings.lease_ttl_s
    delay = 0.2
    while True:
        try:
            return await asyncio.to_thread(finish)
        except TRANSIENT_ERRORS as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning(
                "terminal write failed, retrying: %s", exc, extra={"run_id": attempt.run_id}
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
        try:
            run = await asyncio.to_thread(rt.store.get_run_by_id, attempt.run_id)
        except TRANSIENT_ERRORS:
            continue
        if run is not None and run.terminal and run.owner_epoch == attempt.epoch:
            return Finish(fenced=False)  # it landed; a next run waits for the reaper (R4)


async def release_active(rt: WorkerRuntime, user_id: str | None, run_id: str) -> None:
    """The run ended: it no longer counts against its user's `max_active_runs` (A4).
    Best effort; the limiter prunes ended members when a set is full."""
    if user_id is None:
        return
    keys = LimitKeys(rt.keys.prefix)
    try:
        await rt.release_run(
            keys=[keys.active(user_id), keys.ended(user_id)], args=[ENDED_RUN_TTL_MS, run_id]
        )
    except redis.RedisError:
        log.warning("could not release the active-run slot", extra={"run_id": run_id})


async def count_finished(rt: WorkerRuntime, worker_id: str, status: str) -> None:
    """One more run of `worker_id` ended `status` (the ops view's per-worker counts; the
    reaper counts a run it ends on the lost owner's). Best effort."""
    try:
        await rt.history.count_finished(worker_id, status)
    except redis.RedisError:
        log.warning("could not count the finished run of worker %s", worker_id)


async def record_failure(
    rt: WorkerRuntime, attempt: RunAttempt, error: JSONObject, *, permanent: bool
) -> None:
    """Record what the attempt failed with when it cannot end the run itself: its lease
    expires and the reaper ends the run with this cause (`permanent`: at once) or, after
    the last attempt, names it. Best effort: without it the reaper says the lease expired."""
    cause = attempt_cause(error, permanent=permanent)
    try:
        await asyncio.to_thread(
            rt.store.record_attempt_failure,
            attempt.run_id,
            attempt.thread_id,
            attempt.run.attempt,
            attempt.epoch,
            cause,
        )
    except Exception:
        log.exception("could not record the attempt's failure", extra={"run_id": attempt.run_id})


async def keep_result(rt: WorkerRuntime, attempt: RunAttempt, settled: GraphOutcome) -> None:
    """Store what `/wait` answers beside the stream, before `end`: the thread (and the
    checkpoints the answer is read from) is deleted right after the end."""
    try:
        values: Any = None
        interrupts: list[Any] = []
        if settled.status is not RunStatus.ERROR:
            snap = await rt.state.aget_snapshot(attempt.thread_id, attempt.run.graph_id)
            values = serde.to_jsonable(snap.values)
            interrupts = [serde.to_jsonable(i) for i in snap.interrupts]
        result = final_result(settled.status, settled.error, values, interrupts)
        ttl = rt.settings.stream_ttl_after_end_s
        await rt.redis.set(rt.keys.result(attempt.run_id), serde.dumps(result), ex=ttl)
    except Exception:  # the waiting client reads the thread instead, within the grace
        log.exception("storing the run's result failed", extra={"run_id": attempt.run_id})


END_RETRY_MAX_DELAY_S = 5.0
"""Longest wait between two tries of a run's `end` while Redis is unreachable."""


async def publish_end(rt: WorkerRuntime, attempt: RunAttempt, sink: EventSink, data: bytes) -> bool:
    """Publish the run's `end` once Redis takes it (B7); False if it never did.

    The terminal status is committed: a stream without its `end` would leave its readers
    waiting until they give up with a gap, and every later reader too. So a publish that
    failed (Redis unreachable past the publisher's retries) is tried again until
    `stream_ttl_after_end_s` has passed; one that was fenced means the lease lapsed while
    Redis was unreachable. It is taken back for the same epoch, which is safe: the run is
    terminal under that epoch, so no newer owner can exist (a claim needs a run that is not
    terminal, L2). Never two `end`s: a retry numbers `end` as the first try did, and the
    publish script skips what it already added (shared/lua/publish.lua).
    """
    ids = {"run_id": attempt.run_id}
    deadline = time.monotonic() + rt.settings.stream_ttl_after_end_s
    delay = 0.5
    while True:
        fenced = False
        try:
            await sink.publish_end(data)
            return True
        except LeaseLost:
            fenced = True
        except Exception as exc:  # noqa: BLE001 - Redis unreachable: tried again below
            log.warning("publishing end failed: %s; retrying", exc, extra=ids)
        if time.monotonic() + delay > deadline:
            log.error("the run's end could not be published; readers get a gap", extra=ids)
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, END_RETRY_MAX_DELAY_S)
        if fenced:
            try:
                retaken = await rt.leases.acquire(attempt.run_id, attempt.epoch, rt.worker_id)
            except redis.RedisError:
                continue  # the next try fails again and comes back here
            if not retaken:  # a higher epoch: never publish past it
                log.error("a newer lease holds the ended run; no end published", extra=ids)
                return False
            log.warning("lease taken back to publish the end of the ended run", extra=ids)
        sink.rearm()


async def delete_temporary_thread(rt: WorkerRuntime, attempt: RunAttempt) -> None:
    """on_completion=delete: the thread goes now that its run ended (if no other run is
    inflight on it); if this fails or the worker dies first, the recovery pass does it."""
    try:
        deleted = await asyncio.to_thread(rt.remover.delete_temporary, attempt.thread_id)
    except Exception:  # the row stays: the recovery pass deletes it after the grace
        log.exception("deleting the temporary thread failed", extra={"run_id": attempt.run_id})
        return
    if deleted:
        log.info("temporary thread deleted", extra={"run_id": attempt.run_id})
