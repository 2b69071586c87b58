"""The reaper's queries (R4, L5; workers/reaper.py): find pending runs whose dispatch was
lost and running runs whose lease may have lapsed, then requeue or fail those.

An attempt that fails without ending its run (an error escaping the attempt's phases)
records its cause as an `attempt_failed` lifecycle event (`record_attempt_failure`), so the
reaper that later takes the run over ends it with that cause (`attempt_cause`), not with a
bare lease expiry.

The reaper decides from Redis leases, which this module does not read; it only offers the
candidates and the fenced writes (matching the epoch the reaper saw), so a worker that is
alive after all and finishes first wins, and the reaper's write matches nothing.
`lock_timeout_s` lets it skip a run row that a frozen owner's transaction holds instead of
waiting behind it.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.authz.users import run_subject
from shared.runs.queries import query
from shared.runs.store_base import StoreBase, json_param, lock_timeout
from shared.runs.thread_queue import settle_in
from shared.vocab import CancelAction, JSONObject, RunStatus, ThreadStatus

STALE_PENDING_HEADS_SQL = query("stale_pending_heads")
RUNNING_RUNS_SQL = query("running_runs")
FAIL_EXPIRED_SQL = query("fail_expired")
REQUEUE_EXPIRED_SQL = query("requeue_expired")
ATTEMPT_CAUSE_SQL = query("attempt_cause")
COMPACT_RUN_COUNTS_SQL = """
WITH gone AS (
    DELETE FROM run_status_counts
    WHERE (SELECT count(*) FROM run_status_counts) > %(rows)s
    RETURNING status, n
)
INSERT INTO run_status_counts (status, n)
SELECT status, sum(n) FROM gone GROUP BY status HAVING sum(n) <> 0
"""
"""Fold `run_status_counts`' deltas into one row per status once there are more than
`rows` (migration 0018). Rows that transactions in flight insert meanwhile are not seen, so
they stay, and every status's sum is the same before and after; two folds at once delete
disjoint rows."""
COMPACT_RUN_COUNTS_ROWS = 64
"""A fold is due past this many delta rows (a few runs' worth; the reads stay a few rows)."""
ATTEMPT_FAILED = "attempt_failed"
"""The lifecycle event of an attempt that failed without ending its run."""


@dataclass(frozen=True, slots=True)
class Expired:
    """A run the reaper ended: its new epoch (now the reaper's), the error, the next run,
    and the user whose active runs it counted against (`run_subject`)."""

    epoch: int
    error: JSONObject
    next_run_id: str | None
    user_id: str | None = None


@dataclass(frozen=True, slots=True)
class RunningRun:
    """A running run as the reaper sees it: enough to check its lease and fence a requeue."""

    run_id: str
    thread_id: str
    owner_epoch: int
    attempt: int
    cancel_action: CancelAction | None
    owner: str | None = None  # the worker id of its (maybe dead) owner


class ReaperQueries(StoreBase):
    """Lost dispatches and lapsed owners."""

    def compact_run_counts(self, rows: int = COMPACT_RUN_COUNTS_ROWS) -> int:
        """Fold the runs' status count deltas if more than `rows` (returns the rows written)."""
        with self._pool.connection() as conn:
            return conn.execute(COMPACT_RUN_COUNTS_SQL, {"rows": rows}).rowcount

    def stale_pending_heads(self, stale_s: float) -> list[str]:
        """Pending runs at the head of their thread whose dispatch looks lost (R4)."""
        with self._pool.connection() as conn:
            return [
                r["run_id"] for r in conn.execute(STALE_PENDING_HEADS_SQL, {"stale_s": stale_s})
            ]

    def running_runs(self, min_age_s: float) -> list[RunningRun]:
        """Running runs not updated for `min_age_s` (lease candidates for the reaper)."""
        with self._pool.connection() as conn:
            rows = conn.execute(RUNNING_RUNS_SQL, {"min_age_s": min_age_s}).fetchall()
        return [
            RunningRun(
                run_id=r["run_id"],
                thread_id=r["thread_id"],
                owner_epoch=int(r["owner_epoch"]),
                attempt=int(r["attempt"]),
                cancel_action=CancelAction(r["cancel_action"]) if r["cancel_action"] else None,
                owner=r["owner"],
            )
            for r in rows
        ]

    def record_attempt_failure(
        self, run_id: str, thread_id: str, attempt: int, epoch: int, cause: JSONObject
    ) -> None:
        """Record what attempt `attempt` (epoch `epoch`) of the run failed with, when it
        could not end the run itself (`cause`: the error record, with `permanent` when no
        other attempt can succeed)."""
        payload = {"attempt": attempt, "epoch": epoch, **cause}
        with self._pool.connection() as conn, conn.transaction():
            self._lifecycle(conn, run_id, thread_id, ATTEMPT_FAILED, payload)

    def attempt_cause(self, run_id: str, attempt: int) -> JSONObject | None:
        """What attempt `attempt` of the run recorded it failed with, or None."""
        with self._pool.connection() as conn:
            row = conn.execute(ATTEMPT_CAUSE_SQL, {"run_id": run_id, "attempt": attempt}).fetchone()
        return dict(row["payload"]) if row is not None else None

    def requeue(
        self, run_id: str, epoch: int, reason: str, *, lock_timeout_s: float | None = None
    ) -> bool:
        """Give a running run back as pending for another attempt (R7 hand-back); fenced.

        `lock_timeout_s`: give up (psycopg.errors.LockNotAvailable) rather than wait longer
        for a run row another transaction holds (the reaper: a frozen owner's write)."""
        with self._pool.connection() as conn, conn.transaction():
            lock_timeout(conn, lock_timeout_s)
            row = conn.execute(REQUEUE_EXPIRED_SQL, {"run_id": run_id, "epoch": epoch}).fetchone()
            if row is None:
                return False
            self._lifecycle(
                conn, run_id, str(row["thread_id"]), "requeued", {"reason": reason, "epoch": epoch}
            )
            return True

    def fail_expired(
        self,
        run_id: str,
        epoch: int,
        owner: str,
        reason: str,
        *,
        lock_timeout_s: float | None = None,
        error: JSONObject | None = None,
    ) -> Expired | None:
        """End a run whose owners kept dying, or whose last attempt failed for good, as
        `error` (L5), taking ownership (epoch + 1) so the caller may publish the run's
        `error` and `end` under a lease of its own. `error`: the run's error record (by
        default `MaxAttemptsExceeded` with `reason`)."""
        if error is None:
            error = {"error": "MaxAttemptsExceeded", "message": reason}
        with self._pool.connection() as conn, conn.transaction():
            lock_timeout(conn, lock_timeout_s)
            row = conn.execute(
                FAIL_EXPIRED_SQL,
                {"run_id": run_id, "epoch": epoch, "owner": owner, "error": json_param(error)},
            ).fetchone()
            if row is None:
                return None
            thread_id = str(row["thread_id"])
            self._lifecycle(
                conn, run_id, thread_id, RunStatus.ERROR, {"reason": reason, "epoch": epoch}
            )
            nxt = settle_in(conn, thread_id, ThreadStatus.ERROR)
        # Whom the run counted against (A4): the project's user under a tenant, else the owner.
        subject = run_subject(row["user_id"], row["config"])
        return Expired(int(row["owner_epoch"]), error, nxt, subject)
