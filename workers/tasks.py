"""Thin task functions: parse ids, call the executor on the process's loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import uuid

from shared.runs.priority import BACKGROUND
from shared.runs.run_queue import NEXT, NEXT_BACKGROUND
from shared.runs.taskqueue import RUN_TASK
from workers.attempts import StopReason
from workers.celery_app import celery
from workers.executor import claim_at_once, execute_run
from workers.reaper import reaper_loop
from workers.runtime import WorkerRuntime, close_runtime, get_runtime

log = logging.getLogger(__name__)
_reaper: concurrent.futures.Future[None] | None = None


@celery.task(name=RUN_TASK, ignore_result=True)
def execute(run_id: str) -> str:
    """Execute one run (the whole attempt happens on the runtime's loop): the best waiting
    one of the run queue when the message names none, the best background one for a
    background queue's message (shared/runs/run_queue.py)."""
    rt = get_runtime()
    if run_id not in (NEXT, NEXT_BACKGROUND):  # naming its run: a delay's, a put-back's
        return _execute(rt, run_id)
    taken = rt.background.take(rt.dispatcher.queue, background=run_id == NEXT_BACKGROUND)
    if taken is None:
        return "nothing to take"  # taken by another message (a re-dispatch's), or owed
    caller = taken.priority < BACKGROUND[0]
    if caller:  # background runs yield while it runs (workers/background_share.py)
        rt.callers.begin()
    try:
        return _execute(rt, taken.run_id, taken.priority)
    finally:
        if caller:
            rt.callers.end()
        for _ in range(rt.background.done(taken)):
            rt.dispatcher.send_next()


def _execute(rt: WorkerRuntime, run_id: str, priority: int | None = None) -> str:
    try:
        uuid.UUID(run_id)
    except (ValueError, TypeError):
        log.error("ignoring run task with a malformed id: %r", run_id)
        return "malformed"
    claimed = claim_at_once(rt, run_id)
    result = rt.submit(execute_run(rt, run_id, claimed, priority)).result()
    log.info("run %s: %s", run_id, result)
    return str(result)


def start_runs_services() -> None:
    """Build the runtime and start the reaper loop (runs workers only)."""
    global _reaper
    rt = get_runtime()
    if _reaper is None:
        _reaper = rt.submit(reaper_loop(rt))


def shutdown_runs() -> None:
    """Signal every owned run to stop, wait a grace period, then hand them back (R7)."""
    from workers import runtime as runtime_mod

    rt = runtime_mod._runtime
    if rt is None:
        return
    if _reaper is not None:
        rt.loop.call_soon_threadsafe(_reaper.cancel)

    async def _stop_all() -> None:
        attempts = list(rt.active.values())
        # Give runs the grace period to reach their next checkpoint on their own terms.
        deadline = rt.loop.time() + rt.settings.shutdown_grace_s
        while rt.active and rt.loop.time() < deadline:
            await asyncio.sleep(0.1)
        for attempt in list(rt.active.values()):
            attempt.stop(StopReason.SHUTDOWN)
        while rt.active and rt.loop.time() < deadline + 5:
            await asyncio.sleep(0.05)
        log.info("shutdown: %d runs stopped", len(attempts))

    try:
        rt.submit(_stop_all()).result(timeout=rt.settings.shutdown_grace_s + 10)
    except Exception:
        log.exception("graceful stop failed")
    close_runtime()
