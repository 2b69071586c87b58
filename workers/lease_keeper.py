"""The lease keeper: keeps the Redis owner leases of this worker's runs alive, one task per process.

A claimed run's lease (L1: `{epoch}|{owner}` with a TTL) lives only as long as it is
renewed; once it lapses the reaper re-queues the run for a newer epoch (L4). So every
attempt is held here from its claim until its finalization is over, and one task renews
all of them in one round trip per tick (compare-and-extend, shared/runs/leases.py) instead
of one timer per run. The same round trip brings back the cancel request stored beside
each lease (R5) and how far the run's stream has the attempt's events (B5). The keeper
reports a lost lease to its attempt (`StopReason.LEASE_LOST`), which stops at its next
safe point and finalizes nothing.

The worker runtime (workers/runtime.py) builds the keeper and starts it on the process's
loop, and stops it when it closes, which happens after the shutdown has waited for the
held attempts (workers/tasks.py). The executor holds and releases attempts
(workers/executor.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

from shared.runs.leases import LeaseManager, RenewOutcome
from shared.settings import Settings
from workers.attempts import RunAttempt, StopReason

log = logging.getLogger(__name__)


class LeaseKeeper:
    """The attempts whose lease this worker holds, and the task that renews them."""

    def __init__(self, leases: LeaseManager, settings: Settings) -> None:
        self._leases = leases
        self._settings = settings
        self._held: dict[str, RunAttempt] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def held(self) -> Mapping[str, RunAttempt]:
        """The attempts whose lease is kept, by run id: the runs active on this worker."""
        return self._held

    def hold(self, attempt: RunAttempt) -> None:
        """Keep `attempt`'s lease alive until `release` (call on the runtime's loop). A
        keeper that died is started again first, so no held lease is left to lapse."""
        self._held[attempt.run_id] = attempt
        self.start()

    def release(self, run_id: str) -> None:
        """Stop renewing the run's lease (its attempt is over on this worker)."""
        self._held.pop(run_id, None)

    def start(self) -> None:
        """Start renewing on the running loop, unless the keeper is already running."""
        task = self._task
        if task is not None and not task.done():
            return
        if task is not None and not task.cancelled() and task.exception() is not None:
            log.error("the lease keeper died; starting it again", exc_info=task.exception())
        self._task = asyncio.get_running_loop().create_task(self._keep())

    async def stop(self) -> None:
        """Stop renewing (the runtime's close). Any lease still held then expires by
        itself, and the reaper re-queues its run (L4)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _keep(self) -> None:
        """Renew every held lease (compare-and-extend, one round trip) and relay cancel requests.

        The tick is the shorter of the cancel poll and the renew interval, so a cancel
        reaches an idle run (one waiting on a slow tool) within `cancel_poll_s`, and the
        lease is extended long before its TTL runs out.
        """
        s = self._settings
        tick = min(s.cancel_poll_s, s.lease_renew_s)
        last_ok: dict[str, float] = {}
        while True:
            await asyncio.sleep(tick)
            attempts = list(self._held.values())
            # What each sink was answered for before the renewal is sent: the stream has at
            # least that much unless a failover lost it (then the sink repairs its tail, B5).
            acked = [a.sink.acked_seq if a.sink is not None else 0 for a in attempts]
            now = time.monotonic()
            try:
                results = await self._leases.renew_many(
                    [(a.run_id, a.lease) for a in attempts], stream_seq=True
                )
            except Exception as exc:  # noqa: BLE001 - Redis hiccup: keep trying until a TTL runs out
                for a in attempts:
                    if now - last_ok.get(a.run_id, a.started) > s.lease_ttl_s:
                        log.warning(
                            "lease renewal failing past its TTL: %s",
                            exc,
                            extra={"run_id": a.run_id},
                        )
                        a.stop(StopReason.LEASE_LOST)
                continue
            for a, was_acked, (outcome, cancel, stream_seq) in zip(
                attempts, acked, results, strict=True
            ):
                if outcome is RenewOutcome.LOST:
                    a.stop(StopReason.LEASE_LOST)
                    continue
                if a.sink is not None and stream_seq < was_acked:
                    a.sink.check_tail()
                last_ok[a.run_id] = now
                if cancel:
                    a.cancel(cancel)
            for run_id in set(last_ok) - {a.run_id for a in attempts}:
                del last_ok[run_id]
