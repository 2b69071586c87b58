"""The SQL of temporary threads (A1): find the finished ones and delete one under its lock.

When and why a temporary thread goes, and what goes with it, is shared/retention/removal.py's
(`ThreadRemover.delete_temporary`, the one home of removing a thread with what is its own);
this is only the part that speaks SQL. The store does not import what the deletion purges
beside the row (checkpoints, Redis keys, workspace files): `delete_temporary_thread` takes
that as a `Purge` callback, run in its transaction, as a user's delete and an expiry do.
"""

from __future__ import annotations

import psycopg
from psycopg.rows import DictRow

from shared.runs.queries import query
from shared.runs.store_base import StoreBase, lock_timeout
from shared.runs.threads_store import Doomed, Purge

LOCK_THREAD_CRONS_BY_ID_SQL = query("lock_thread_crons_by_id")
LOCK_THREAD_BY_ID_SQL = query("lock_thread_by_id")
TEMPORARY_THREAD_FINISHED_SQL = query("temporary_thread_finished")
THREAD_RUN_IDS_SQL = query("thread_run_ids")
DELETE_THREAD_BY_ID_SQL = query("delete_thread_by_id")
FINISHED_TEMPORARY_THREADS_SQL = query("finished_temporary_threads")


class TemporaryThreadStore(StoreBase):
    """Temporary threads of runs without a thread."""

    def delete_temporary_thread(
        self, thread_id: str, purge: Purge, *, lock_timeout_s: float | None = None
    ) -> bool:
        """Delete a temporary thread whose runs have all ended (`on_completion=delete`).

        Lock order, the same as a cron firing's and an expiry's: the thread's crons (a user
        may have put one on it while it lived), then the thread row. `purge(conn, doomed)`
        runs in this transaction, under those locks, before the row goes: it removes what
        lives beside the row (checkpoints, on this connection; Redis keys; the owner's
        workspace files). A failure anywhere rolls back and leaves the row, which is what
        the recovery pass looks for, so the thread is never left behind for good. Returns
        whether the thread was deleted (False: gone already, not temporary, a run is
        inflight, or a webhook delivery still reads it).
        """
        params = {"thread_id": thread_id}
        with self._pool.connection() as conn, conn.transaction():
            lock_timeout(conn, lock_timeout_s)
            conn.execute(LOCK_THREAD_CRONS_BY_ID_SQL, params)
            locked = conn.execute(LOCK_THREAD_BY_ID_SQL, params).fetchone()
            if locked is None:
                return False
            row = conn.execute(TEMPORARY_THREAD_FINISHED_SQL, params).fetchone()
            if row is None or not row["finished"]:
                return False
            purge(conn, Doomed(thread_id, str(locked["owner"]), _run_ids(conn, thread_id), []))
            conn.execute(DELETE_THREAD_BY_ID_SQL, params)
        return True

    def finished_temporary_threads(self, grace_s: float, limit: int = 100) -> list[str]:
        """Temporary threads whose runs all ended more than `grace_s` ago (the recovery
        pass deletes them: their worker died or failed to)."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                FINISHED_TEMPORARY_THREADS_SQL, {"grace_s": grace_s, "limit": limit}
            ).fetchall()
        return [str(r["thread_id"]) for r in rows]


def _run_ids(conn: psycopg.Connection[DictRow], thread_id: str) -> list[str]:
    """Every run of the thread, oldest first (none is inflight: the caller checked)."""
    rows = conn.execute(THREAD_RUN_IDS_SQL, {"thread_id": thread_id}).fetchall()
    return [str(r["run_id"]) for r in rows]
