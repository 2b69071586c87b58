"""The expiry sweep (P6): every `sweep_interval_minutes`, from the scheduler process.

One sweeper at a time across schedulers: a session-level PostgreSQL advisory lock
(`pg_try_advisory_lock`) held on one pool connection for the length of the sweep. Not a
Redis lock with a token: the lock lives where the data does, and it is released by the
server the moment its session ends, so a sweeper that is SIGKILLed, partitioned or
wedged in a GC pause never leaves a lock behind to time out, and no TTL has to be
guessed longer than a sweep (a Redis lock that expires under a slow sweeper lets a second
one in). A second scheduler's `try` fails at once and it sweeps nothing (`SweepReport.
skipped`). The lock only keeps sweepers from doing the same work twice: correctness does
not depend on it, since each thread is taken with `FOR UPDATE SKIP LOCKED` and its
expiry re-checked under the lock (shared/runs/threads_store.py). Session advisory locks
need a session-pooling connection path (not PgBouncer in transaction mode).

A sweep reads at most `sweep_limit` candidates (soonest expired first, no lock), then
takes each in a transaction of its own: the longest lock it holds is one thread's delete.
A sweeper killed mid-batch leaves every thread either whole or gone; the next sweep takes
the rest.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from shared.retention.policy import SweepPolicy
from shared.retention.removal import ThreadRemover
from shared.runs.store import Doomed, ExpiryOutcome

log = logging.getLogger(__name__)

SWEEP_LOCK_KEY = 0x7474_6C73  # "ttls": the advisory lock of the expiry sweep
"""Beside migrate.py's `0x7468_7264`; a key of its own so that a sweep never waits on a migrator."""

TRY_LOCK_SQL = "SELECT pg_try_advisory_lock(%(key)s) AS locked"
UNLOCK_SQL = "SELECT pg_advisory_unlock(%(key)s)"
PRUNE_AUDIT_SQL = """
DELETE FROM ops_audit WHERE audit_id IN (
    SELECT audit_id FROM ops_audit
    WHERE action LIKE 'thread.%%' AND at < now() - make_interval(secs => %(age_s)s)
    ORDER BY at LIMIT %(limit)s)
"""
"""Audit records of thread deletions and expiries past `audit_retention_days`, a batch at a time."""


@dataclass
class SweepReport:
    """What one sweep did."""

    skipped: bool = False  # another sweeper held the lock: this one did nothing
    outcomes: dict[ExpiryOutcome, int] = field(default_factory=dict)
    failed: int = 0  # an error (logged); the thread stays whole, the next sweep retries
    audit_pruned: int = 0
    seconds: float = 0.0

    def count(self, outcome: ExpiryOutcome) -> int:
        """How many threads ended the sweep with `outcome`."""
        return self.outcomes.get(outcome, 0)


class ThreadSweeper:
    """Sweeps expired threads: `delete`s them or prunes them to their newest checkpoint."""

    def __init__(self, remover: ThreadRemover, policy: SweepPolicy) -> None:
        self.remover = remover
        self.policy = policy

    def sweep(
        self,
        *,
        at: dt.datetime | None = None,
        before_delete: Callable[[Doomed], None] | None = None,
    ) -> SweepReport:
        """One sweep, if no other sweeper is at it. `at` is the clock the expiry is read
        against (tests move it forward; default: the database's now())."""
        start = time.monotonic()
        report = SweepReport()
        pool = self.remover.store.pool
        with pool.connection() as lock_conn:
            row = lock_conn.execute(TRY_LOCK_SQL, {"key": SWEEP_LOCK_KEY}).fetchone()
            if row is None or not row["locked"]:
                report.skipped = True
                return report
            try:
                self._sweep_batch(report, at, before_delete)
                report.audit_pruned = self._prune_audit(lock_conn)
            finally:
                lock_conn.execute(UNLOCK_SQL, {"key": SWEEP_LOCK_KEY})
        report.seconds = time.monotonic() - start
        if report.outcomes or report.failed or report.audit_pruned:
            log.info(
                "thread sweep: %s, %d failed, %d audit records pruned, %.2fs",
                {k.value: v for k, v in report.outcomes.items()},
                report.failed,
                report.audit_pruned,
                report.seconds,
            )
        return report

    def _sweep_batch(
        self,
        report: SweepReport,
        at: dt.datetime | None,
        before_delete: Callable[[Doomed], None] | None,
    ) -> None:
        store = self.remover.store
        for thread_id, _strategy in store.expired_threads(self.policy.limit, at):
            try:
                outcome = self.remover.expire(
                    thread_id,
                    at=at,
                    lock_timeout_s=self.policy.lock_timeout_s,
                    before_delete=before_delete,
                )
            except psycopg.errors.LockNotAvailable:
                outcome = ExpiryOutcome.SKIPPED  # its crons are held: the next sweep
            except (psycopg.Error, OSError, NotImplementedError):
                # One thread that cannot go now must not stop the others (NotImplementedError:
                # keep_latest refuses a thread written in `delta` mode).
                log.exception("expiring a thread failed", extra={"thread_id": thread_id})
                report.failed += 1
                continue
            report.outcomes[outcome] = report.outcomes.get(outcome, 0) + 1

    def _prune_audit(self, conn: psycopg.Connection[dict[str, object]]) -> int:
        age_s = self.policy.audit_retention_days * 86_400.0
        cur = conn.execute(PRUNE_AUDIT_SQL, {"age_s": age_s, "limit": self.policy.limit})
        return cur.rowcount
