"""Removing a thread with everything that is its own (P6, A1).

The one path of a user's `DELETE /threads/{id}` (and `/threads/prune`, `delete`) and of the
expiry sweep. Everything happens in the delete's transaction, under the thread's cron rows
and its row, before the row goes: the checkpoints, writes and blobs (on the same
connection), the Redis keys of its ended runs and of the thread, its workspace files, and
the audit record. The row's delete cascades to its runs, their journal rows and seq
allocators, its head copy and its crons. A failure anywhere rolls all the rows back, so a
thread is never half-deleted: the Redis keys and files, gone already, are what a retry
finds missing and skips.

What outlives a thread, on purpose: the audit records (`ops_audit`, pruned after
`audit_retention_days` by the sweep) and cron firings (`cron_firings`, pruned after
`cron_firing_retention_s`) name it but hold none of its content. A user's delete also keeps
the thread's webhook deliveries, so that a delivery whose body is frozen still goes out
(migration 0013); an expiry waits for pending deliveries and then deletes them with it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import redis
from psycopg.rows import DictRow

from shared import workspaces
from shared.ops.store import INSERT_AUDIT_SQL
from shared.redis_keys import Keys
from shared.runs.manager import RunManager
from shared.runs.store import Doomed, ExpiryOutcome, RunStore
from shared.runs.store_base import json_param
from shared.state.accessor import delete_checkpoints_in, keep_latest_on

log = logging.getLogger(__name__)

RETENTION_ACTOR = "retention"
"""The actor of the audit records the sweep writes."""


def audit_in(
    conn: psycopg.Connection[DictRow],
    *,
    actor: str,
    action: str,
    params: dict[str, Any],
    result: str,
    detail: dict[str, Any],
) -> None:
    """Append an audit record in the caller's transaction (it commits with the delete)."""
    conn.execute(
        INSERT_AUDIT_SQL,
        {
            "actor": actor,
            "action": action,
            "run_id": None,
            "params": json_param(params),
            "result": result,
            "detail": json_param(detail),
        },
    )


class ThreadRemover:
    """Removes threads with what is theirs: a user's delete and the sweep's expiry."""

    def __init__(self, store: RunStore, client: redis.Redis, keys: Keys, workspace_root: Path):
        self.store = store
        self._redis = client
        self._keys = keys
        self._root = workspace_root

    def thread_keys(self, doomed: Doomed) -> list[str]:
        """The Redis keys of the thread and of its runs that are not executing (a running
        run's lease and cancel keys are how it is told to stop; they expire with it)."""
        k = self._keys
        out = [k.thread_runs(doomed.thread_id)]
        for run_id in doomed.run_ids:
            if run_id not in doomed.running:
                out += [k.stream(run_id), k.stream_meta(run_id), k.result(run_id)]
                out += [k.lease(run_id), k.cancel(run_id)]
        return out

    def _drop_keys(self, doomed: Doomed) -> None:
        # One key a command (valid on Redis Cluster, where a pipeline splits by slot), in
        # one round trip.
        pipe = self._redis.pipeline(transaction=False)
        for key in self.thread_keys(doomed):
            pipe.delete(key)
        pipe.execute()

    def delete_owned(self, runs: RunManager, owner: str, thread_id: str) -> None:
        """Delete the owner's thread (ThreadNotFound otherwise): its runs, with running ones
        told to stop, its checkpoints, keys and workspace files; the audit record says what
        became of the files (a file that cannot be removed stays, the thread goes)."""

        def purge(conn: psycopg.Connection[DictRow], doomed: Doomed) -> None:
            delete_checkpoints_in(conn, thread_id)
            self._drop_keys(doomed)
            detail: dict[str, Any]
            try:
                files = workspaces.remove_workspace(self._root, owner, thread_id)
                detail, result = {"workspace_files_removed": files}, "deleted"
            except OSError as exc:  # the thread goes; its files stay under its owner's folder
                log.exception(
                    "removing a deleted thread's workspace failed", extra={"thread_id": thread_id}
                )
                detail = {"workspace_error": f"{type(exc).__name__}: {exc}"}
                result = "deleted_files_left"
            audit_in(
                conn,
                actor=owner,
                action="thread.delete",
                params={"thread_id": thread_id},
                result=result,
                detail=detail,
            )

        runs.delete_thread(owner=owner, thread_id=thread_id, purge=purge)

    def expire(
        self,
        thread_id: str,
        *,
        at: Any = None,
        lock_timeout_s: float | None = None,
        before_delete: Callable[[Doomed], None] | None = None,
    ) -> ExpiryOutcome:
        """Apply an expired thread's strategy (`RunStore.expire_thread`). A workspace that
        cannot be removed fails the whole expiry (rolled back, retried at the next sweep):
        an expired thread goes entirely or not at all. `before_delete` is a test's hook
        between the purge and the row's delete."""
        thread_id = str(uuid.UUID(thread_id))  # no path tricks

        def purge(conn: psycopg.Connection[DictRow], doomed: Doomed) -> None:
            delete_checkpoints_in(conn, thread_id)
            self._drop_keys(doomed)
            files = workspaces.remove_workspace(self._root, doomed.owner, thread_id)
            audit_in(
                conn,
                actor=RETENTION_ACTOR,
                action="thread.expire",
                params={"thread_id": thread_id, "owner": doomed.owner},
                result="deleted",
                detail={"workspace_files_removed": files, "runs": len(doomed.run_ids)},
            )
            if before_delete is not None:
                before_delete(doomed)

        def prune(tid: str) -> None:
            with self.store.pool.connection() as conn:
                keep_latest_on(conn, tid)

        return self.store.expire_thread(
            thread_id, purge, prune, at=at, lock_timeout_s=lock_timeout_s
        )
