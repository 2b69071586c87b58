"""Reads of runs, for the API, the workers and thread followers; and the delete of an ended run.

None of these takes the thread lock: a read answers what was committed, and the one write,
`delete_run`, matches only a run that has ended (its WHERE clause), so it needs none either.
Thread followers (GET /threads/{id}/stream,
shared/bridge/thread_follow.py) read a thread's runs in admission order (`seq`, taken under
the thread lock, so on one thread it is commit order).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import psycopg
from psycopg.rows import DictRow

from shared.errors import Conflict, RunNotFound
from shared.runs.model import Run
from shared.runs.queries import query
from shared.runs.store_base import StoreBase, is_uuid
from shared.runs.threads_store import get_thread_in
from shared.vocab import RunRef, RunStatus

GET_RUN_SQL = query("get_run")
GET_RUN_BY_ID_SQL = query("get_run_by_id")
RUN_STATUS_SQL = query("run_status")
UNSTARTED_END_SQL = query("unstarted_end")
RUN_OWNER_SQL = query("run_owner")
WAITING_OWNERS_SQL = query("waiting_owners")
OWNERS_OF_PENDING_SQL = query("owners_of_pending")
INFLIGHT_AMONG_SQL = query("inflight_among")
LIST_RUNS_SQL = query("list_runs")
DELETE_RUN_SQL = query("delete_run")
INFLIGHT_OF_OWNER_SQL = query("inflight_of_owner")
FOLLOW_START_SQL = query("follow_start")
RUNS_AFTER_SQL = query("runs_after")
RUN_REF_SQL = query("run_ref")


def run_status_in(conn: psycopg.Connection[DictRow], run_id: str) -> RunStatus | None:
    """The run's status on `conn` (None if the run is gone)."""
    row = conn.execute(RUN_STATUS_SQL, {"run_id": run_id}).fetchone()
    return RunStatus(row["status"]) if row else None


class RunReads(StoreBase):
    """Runs as their readers see them."""

    def get_run(self, thread_id: str, run_id: str, owner: str) -> Run:
        """The run, or RunNotFound (also for another user's run)."""
        with self._pool.connection() as conn:
            row = conn.execute(
                GET_RUN_SQL, {"thread_id": thread_id, "run_id": run_id, "owner": owner}
            ).fetchone()
        if row is None:
            raise RunNotFound(f"run {run_id} not found")
        return Run.from_row(row)

    def get_run_by_id(self, run_id: str) -> Run | None:
        """The run regardless of owner, with the owner as `user_id` (workers and ops only)."""
        with self._pool.connection() as conn:
            row = conn.execute(GET_RUN_BY_ID_SQL, {"run_id": run_id}).fetchone()
        return None if row is None else Run.from_row(row)

    def run_status(self, run_id: str) -> RunStatus | None:
        """Just the status (None if the run is gone)."""
        with self._pool.connection() as conn:
            return run_status_in(conn, run_id)

    def run_owner(self, run_id: str) -> str | None:
        """The user whose pending run this is (None when it is not pending)."""
        with self._pool.connection() as conn:
            row = conn.execute(RUN_OWNER_SQL, {"run_id": run_id}).fetchone()
        return str(row["owner"]) if row else None

    def waiting_owners(self, other_than: str, limit: int = 50) -> set[str]:
        """Users other than `other_than` with a run that could be claimed now (pending, due,
        the head of its thread): who waits for a worker slot."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                WAITING_OWNERS_SQL, {"owner": other_than, "limit": limit}
            ).fetchall()
        return {str(r["owner"]) for r in rows}

    def owners_of_pending(self, run_ids: Collection[str], other_than: str) -> set[str]:
        """The users other than `other_than` whose runs among `run_ids` are still pending
        (who waits among runs the run queue holds; ids that are not UUIDs are skipped)."""
        valid = [r for r in run_ids if is_uuid(r)]
        if not valid:
            return set()
        with self._pool.connection() as conn:
            rows = conn.execute(
                OWNERS_OF_PENDING_SQL, {"run_ids": valid, "owner": other_than}
            ).fetchall()
        return {str(r["owner"]) for r in rows}

    def unstarted_end(self, run_id: str) -> RunStatus | None:
        """The terminal status of a run that ended before any attempt started it (it has no
        stream), else None."""
        with self._pool.connection() as conn:
            row = conn.execute(UNSTARTED_END_SQL, {"run_id": run_id}).fetchone()
        return RunStatus(row["status"]) if row else None

    def ended_among(self, run_ids: Collection[str]) -> set[str]:
        """Those of `run_ids` that have ended or no longer exist, in one query (the
        active-run limit's prune; ids that are not UUIDs count as ended)."""
        valid = [r for r in run_ids if is_uuid(r)]
        with self._pool.connection() as conn:
            rows = conn.execute(INFLIGHT_AMONG_SQL, {"run_ids": valid}).fetchall()
        return set(run_ids) - {r["run_id"] for r in rows}

    def list_runs(
        self, thread_id: str, owner: str, *, limit: int, offset: int, status: RunStatus | None
    ) -> list[Run]:
        """Runs of a thread, newest first (ThreadNotFound for a thread the owner has not)."""
        with self._pool.connection() as conn:
            get_thread_in(conn, thread_id, owner)
            rows = conn.execute(
                LIST_RUNS_SQL,
                {
                    "thread_id": thread_id,
                    "owner": owner,
                    "limit": limit,
                    "offset": offset,
                    "status": status,
                },
            ).fetchall()
        return [Run.from_row(r) for r in rows]

    def delete_run(self, thread_id: str, run_id: str, owner: str) -> None:
        """Delete a finished run; an inflight one must be cancelled first (409)."""
        self.get_run(thread_id, run_id, owner)
        with self._pool.connection() as conn:
            if conn.execute(DELETE_RUN_SQL, {"run_id": run_id}).fetchone() is None:
                raise Conflict(f"run {run_id} is still inflight; cancel it first")

    def inflight_runs(
        self,
        owner: str,
        statuses: Collection[RunStatus],
        *,
        thread_id: str | None = None,
        run_ids: Sequence[str] | None = None,
    ) -> list[Run]:
        """The owner's runs in `statuses` (optionally on one thread, among `run_ids`), newest first."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                INFLIGHT_OF_OWNER_SQL,
                {
                    "owner": owner,
                    "statuses": [str(s) for s in statuses],
                    "thread_id": thread_id,
                    "run_ids": list(run_ids) if run_ids is not None else None,
                },
            ).fetchall()
        return [Run.from_row(r) for r in rows]

    # thread followers -------------------------------------------------------------------
    def follow_start(self, thread_id: str) -> tuple[int | None, int | None]:
        """(seq of the oldest pending or running run, seq of the newest run) of a thread."""
        with self._pool.connection() as conn:
            row = conn.execute(FOLLOW_START_SQL, {"thread_id": thread_id}).fetchone()
        assert row is not None  # an aggregate answers one row
        return row["inflight"], row["newest"]

    def runs_after(self, thread_id: str, seq: int, limit: int = 1) -> list[RunRef] | None:
        """The thread's runs admitted after `seq`, in admission order; None once the thread
        is gone (deleted while followed)."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                RUNS_AFTER_SQL, {"thread_id": thread_id, "seq": seq, "limit": limit}
            ).fetchall()
        if not rows:
            return None
        return [RunRef.from_row(r) for r in rows if r["run_id"] is not None]

    def run_ref(self, thread_id: str, run_id: str) -> RunRef | None:
        """One run of the thread as a follower sees it (None: not this thread's, or gone)."""
        with self._pool.connection() as conn:
            row = conn.execute(RUN_REF_SQL, {"thread_id": thread_id, "run_id": run_id}).fetchone()
        return RunRef.from_row(row) if row else None
