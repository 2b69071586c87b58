"""Per-user fairness on one worker: whether a run's user may take another of its slots.

A worker has `worker_concurrency` slots. Without a cap, one user who queued many runs
would take them all and every other user's run would wait behind them. So a run whose
user already holds `worker_user_share` of the slots is put back unclaimed while a user
below that share has a run waiting. The check runs before the claim: a run that is put
back was never claimed, so its epoch, its lease and its stream stay untouched.
"""

from __future__ import annotations

import asyncio
import logging

from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)


async def over_fair_share(rt: WorkerRuntime, run_id: str, priority: int | None = None) -> bool:
    """Whether to put the run back unclaimed: its user's runs hold `worker_user_share` of
    this worker's slots while another user, below that share here, has a run waiting. Cheap
    when the worker is not that full: no query.

    Only users below the share count as waiting: two users at their share each leave the
    other slots to either of them rather than putting each other back for ever.

    A run taken from the run queue at `priority` yields only to users with a run queued at
    that priority or better (shared/runs/priority.py): a chat run is not put back for cron
    firings, which wait behind it by design. It goes back into the queue behind the runs
    of its priority. A run whose message named it (no `priority`) yields to any user with
    a claimable run, and is offered again after `fair_share_retry_s` (a countdown, so the
    freed slot goes to the waiting user's run first).
    """
    s = rt.settings
    cap = fair_share_cap(rt)
    if len(rt.active) < cap:
        return False
    owner = await asyncio.to_thread(rt.store.run_owner, run_id)
    if owner is None:
        return False  # gone or not runnable: let claim say so
    held: dict[str | None, int] = {}
    for other in rt.active.values():
        held[other.run.user_id] = held.get(other.run.user_id, 0) + 1
    if held.get(owner, 0) < cap:
        return False
    if priority is None:
        waiting = await asyncio.to_thread(rt.store.waiting_owners, owner)
    else:
        waiting = await asyncio.to_thread(_queued_owners, rt, priority, owner)
    if not any(held.get(user, 0) < cap for user in waiting):
        return False
    log.info("run put back: its user holds their share", extra={"run_id": run_id})
    if priority is None:
        await asyncio.to_thread(rt.dispatcher.dispatch_later, run_id, s.fair_share_retry_s)
    else:
        await asyncio.to_thread(rt.dispatcher.dispatch_quietly, run_id, priority)
    return True


def _queued_owners(rt: WorkerRuntime, priority: int, owner: str) -> set[str]:
    """The users other than `owner` with a run queued at `priority` or better."""
    return rt.store.owners_of_pending(rt.dispatcher.queue.waiting(priority), owner)


def fair_share_cap(rt: WorkerRuntime) -> int:
    """How many of this worker's slots one user's runs may hold while others wait."""
    s = rt.settings
    return max(1, int(s.worker_user_share * s.worker_concurrency))
