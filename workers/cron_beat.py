"""The cron scheduler process: Celery beat with a scheduler of ours that fires due crons.

    celery -A workers.celery_app:celery beat -S workers.cron_beat:CronScheduler

Why this shape (the brief asks to say why):

- **Celery beat is the clock.** It is the process type operators already run, stop and
  watch; it needs no schedule file here (the base `celery.beat.Scheduler` keeps its
  entries in memory, so no shelve file is written and no volume is needed), and any
  ordinary `beat_schedule` entries still work (`super().tick()`).
- **The crons live in Postgres, not in beat.** Beat's own entries are per-process and
  unsynchronised; celery-redbeat keeps entries in Redis behind a lock so that only one
  beat sends. Neither gives exactly-once across a crash: a lock that expires while its
  holder is stuck lets a second sender in, and a send is not a run. Here the guarantee is a
  row: each tick of each cron inserts `cron_firings(cron_id, tick_at)` (primary key) in the
  same transaction as the run's admission and the cron's advance (shared/crons/store.py).
  So any number of schedulers may run (two for availability): they take different due
  crons (`FOR UPDATE SKIP LOCKED`), and a duplicate firing of one tick cannot commit.
- **The scheduler fires the runs itself, it does not send a tick task to the workers.**
  A tick task on the runs workers would wait behind runs: a worker's threads are held by
  runs for their whole length (prefetch 1), so under load the cron lag would be bounded by
  the length of runs, not by the tick. Firing is a few milliseconds of SQL per cron and
  the run itself still goes to the runs queue through the `Dispatcher`, as every
  admission does; a lost dispatch is the reaper's, as always (R4). And a SIGKILLed beat
  process leaves nothing behind (an embedded `worker -B` beat forks a child that outlives
  a killed parent).

The tick (`cron_tick_s`) bounds the lag; a tick fires batches (`cron_batch_size`) until
none is due, so 1,000 crons due at once fire in one tick (`python -m bench.crons`).
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from celery.beat import Scheduler

from shared import redis_clients
from shared.agent.graphs import GraphRegistry
from shared.assistants.manager import AssistantManager
from shared.assistants.store import AssistantStore
from shared.auth.keys import ApiKeyStore, CachedKeyResolver, OwnerCredentials, no_credentials
from shared.crons.manager import CronManager
from shared.crons.store import CronStore
from shared.db import make_pool
from shared.process_nice import lower_priority
from shared.project import activate
from shared.redis_keys import Keys
from shared.retention import policy as retention_policy
from shared.retention.removal import ThreadRemover
from shared.retention.sweeper import ThreadSweeper
from shared.runs.limits import RunLimits
from shared.runs.manager import RunManager, webhook_checks
from shared.runs.store import RunStore
from shared.runs.taskqueue import Dispatcher
from shared.settings import Settings

log = logging.getLogger(__name__)

HEARTBEAT = Path(tempfile.gettempdir()) / "threadrun-cron-scheduler.alive"
"""Touched at every tick; `python -m workers.cron_beat --check S` (the compose and k8s
probe) fails when it is older than S seconds: a wedged scheduler is restarted."""


def build_cron_manager(settings: Settings) -> CronManager:
    """The scheduler's CronManager: its own small pool (a firing transaction holds one
    connection, assistant lookups take another) and a RunManager like the web's."""
    project = activate(settings.config)  # the project's `env` before its graphs import
    pool = make_pool(settings, name="cron-scheduler", max_size=4)
    assistants = AssistantManager(AssistantStore(pool), GraphRegistry.from_config(settings.config))
    client = redis_clients.sync_client(settings)
    key_store = ApiKeyStore(pool)
    stored_keys = CachedKeyResolver(key_store, settings.api_key_cache_ttl_s)
    owners = OwnerCredentials(
        settings, key_store, settings.api_key_cache_ttl_s, project_auth=bool(project.auth.path)
    )
    runs = RunManager(
        RunStore(
            pool,
            default_ttl=retention_policy.default_ttl(settings),
            max_threads_per_user=settings.max_threads_per_user if project.owner_quotas else None,
        ),
        Dispatcher.of(settings, client),
        client,
        Keys(settings.redis_prefix),
        assistants=assistants,
        default_strategy=settings.default_multitask_strategy,
        max_after_s=settings.run_after_seconds_max,
        **webhook_checks(settings),  # as the web checks them: a firing is an admission
    )
    return CronManager(
        CronStore(pool),
        runs,
        max_per_user=settings.cron_max_per_user,
        min_interval_s=settings.cron_min_interval_s,
        batch_size=settings.cron_batch_size,
        limits=RunLimits(client, settings, runs.ended_among),
        owner_valid=owners.valid,
        position_step=settings.dispatch_position_step,
        # As on the API, the one user of local single-user mode (no credentials at all) is
        # not throttled unless `limit_local_user` asks.
        throttled=lambda subject: (
            settings.limit_local_user
            or subject != settings.local_user
            or not no_credentials(settings, stored_keys)
        ),
    )


def build_thread_sweeper(settings: Settings) -> ThreadSweeper:
    """The expiry sweep (P6, shared/retention/sweeper.py): a pool of its own, three at most
    (the sweep's advisory lock, one thread's transaction, a keep_latest prune)."""
    pool = make_pool(settings, name="thread-sweeper", max_size=3)
    remover = ThreadRemover(
        RunStore(pool),
        redis_clients.sync_client(settings),
        Keys(settings.redis_prefix),
        settings.workspace_dir,
    )
    return ThreadSweeper(remover, retention_policy.sweep_policy(settings))


class CronScheduler(Scheduler):  # type: ignore[misc]  # celery ships no annotations
    """Beat's in-memory scheduler that also fires the due crons every `cron_tick_s`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._settings = Settings()
        lower_priority(self._settings.process_nice)  # `make run` lowers it (its firings)
        self._crons: CronManager | None = None  # built at the first tick (beat may build
        self._next_at = 0.0  # schedulers lazily, for introspection only)
        self._sweeper: ThreadSweeper | None = None
        self._next_sweep_at = 0.0  # the first sweep at the first tick

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Send due beat entries, fire due crons; the seconds until the next call."""
        interval = float(super().tick(*args, **kwargs))
        now = time.monotonic()
        if now >= self._next_at:
            self._next_at = now + self._settings.cron_tick_s
            self.fire()
            HEARTBEAT.touch()
        if now >= self._next_sweep_at:
            self._next_sweep_at = now + self.sweep()
        next_at = min(self._next_at, self._next_sweep_at)
        return max(0.0, min(interval, next_at - time.monotonic()))

    def sweep(self) -> float:
        """One expiry sweep (P6), when no other scheduler is sweeping; the seconds until the
        next (`sweep_interval_minutes`). A failure is logged and retried then: a sweep
        leaves each thread whole or gone."""
        try:
            if self._sweeper is None:
                self._sweeper = build_thread_sweeper(self._settings)
            self._sweeper.sweep()
            return self._sweeper.policy.interval_s
        except Exception:  # the database is away: the next interval retries
            log.exception("thread sweep failed; retrying at the next interval")
            return self._settings.thread_sweep_interval_minutes * 60.0

    def fire(self) -> None:
        """One pass over the due crons; a failure is logged and retried at the next tick
        (nothing committed is lost, nothing uncommitted happened)."""
        s = self._settings
        try:
            if self._crons is None:
                self._crons = build_cron_manager(s)
            report = self._crons.tick(budget_s=max(s.cron_tick_s, 1.0))
            if report.fired or report.skipped:
                log.info(
                    "cron tick: %d admitted, %d rejected, %d over a run limit, %d disabled,"
                    " %d failed, %d already fired",
                    report.admitted,
                    report.rejected,
                    report.limited,
                    report.disabled,
                    report.failed,
                    report.skipped,
                )
            self._crons.store.prune_firings(s.cron_firing_retention_s)
        except Exception:  # the database or broker is away: the next tick retries
            log.exception("cron tick failed; retrying at the next tick")


def main(argv: list[str]) -> int:
    """`--check S`: 0 when the scheduler ticked within S seconds (a liveness probe)."""
    if len(argv) != 2 or argv[0] != "--check":
        print("usage: python -m workers.cron_beat --check SECONDS", file=sys.stderr)
        return 2
    try:
        age = time.time() - HEARTBEAT.stat().st_mtime
    except OSError:
        return 1
    return 0 if age <= float(argv[1]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
