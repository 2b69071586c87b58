"""The SQL of temporary threads (A1): find the finished ones and delete one under its lock.

When and why a temporary thread goes is shared/runs/temporary.py's; this is only the part
that speaks SQL. It stays apart from that module so that the store does not import what the
deletion purges beside the row (checkpoints, workspace files): `delete_temporary_thread`
takes that as a callback, run in its transaction.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from psycopg.rows import DictRow

from shared.runs.queries import query
from shared.runs.store_base import StoreBase, lock_timeout

LOCK_THREAD_BY_ID_SQL = query("lock_thread_by_id")
TEMPORARY_THREAD_FINISHED_SQL = query("temporary_thread_finished")
DELETE_THREAD_BY_ID_SQL = query("delete_thread_by_id")
FINISHED_TEMPORARY_THREADS_SQL = query("finished_temporary_threads")


class TemporaryThreadStore(StoreBase):
    """Temporary threads of runs without a thread."""

    def delete_temporary_thread(
        self,
        thread_id: str,
        purge: Callable[[psycopg.Connection[DictRow], str], None],
        *,
        lock_timeout_s: float | None = None,
    ) -> bool:
        """Delete a temporary thread whose runs have all ended (`on_completion=delete`).

        `purge(conn, owner)` runs in this transaction, under the thread row lock, before the
        row goes: it removes what lives beside the row (checkpoints, on this connection; the
        owner's workspace files). A failure anywhere rolls back and leaves the row, which is what the recovery
        pass looks for, so the thread is never left behind for good. Returns whether the
        thread was deleted (False: gone already, not temporary, or a run is inflight).
        """
        params = {"thread_id": thread_id}
        with self._pool.connection() as conn, conn.transaction():
            lock_timeout(conn, lock_timeout_s)
            locked = conn.execute(LOCK_THREAD_BY_ID_SQL, params).fetchone()
            if locked is None:
                return False
            row = conn.execute(TEMPORARY_THREAD_FINISHED_SQL, params).fetchone()
            if row is None or not row["finished"]:
                return False
            purge(conn, str(locked["owner"]))
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
