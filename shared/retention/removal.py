"""Removing a thread with everything that is its own (P6, A1).

The one path of a user's `DELETE /threads/{id}` (and `/threads/prune`, `delete`), of the
expiry sweep, and of the temporary thread of a run without one (`delete_temporary`).
Everything happens in the delete's transaction, under the thread's cron rows and its row,
before the row goes: the checkpoints, writes and blobs (on the same connection), the Redis
keys of its ended runs and of the thread, its workspace files, and the audit record. The
row's delete cascades to its runs, their journal rows and seq allocators, its head copy and
its crons. A failure anywhere rolls all the rows back, so a thread is never half-deleted:
the Redis keys and files, gone already, are what a retry finds missing and skips.

What outlives a thread, on purpose: the audit records (`ops_audit`, pruned after
`audit_retention_days` by the sweep) and cron firings (`cron_firings`, pruned after
`cron_firing_retention_s`) name it but hold none of its content. A user's delete also keeps
the thread's webhook deliveries, so that a delivery whose body is frozen still goes out
(migration 0013); an expiry waits for pending deliveries and then deletes them with it.

Temporary threads (A1). `POST /runs`, `/runs/stream`, `/runs/wait`, thread-less
`/runs/batch` items and cron firings without a thread run on a thread created in the
run's admission transaction, owned by the caller. With `on_completion=delete` (the
default) it goes once every run on it has ended and no webhook delivery still reads its
values (`RunStore.delete_temporary_thread`, locks as above), through `delete_temporary`
from two callers: the worker, right after the run's terminal status, its `/wait` answer
and its `end` are out (workers/finalize_steps.py); and the recovery pass
(`purge_temporary`, workers/reaper.py) for threads whose runs ended more than
`temporary_thread_grace_s` ago, which is what makes the deletion durable: a worker that
died between the end and the delete, or a deletion that failed, leaves the row, and the
row is what the pass finds. The grace covers the runs that end without a worker
(cancelled while pending, failed by the reaper): their waiting clients read the final
values from the thread meanwhile.

What a temporary thread's deletion leaves in Redis, on purpose: its runs' streams, their
meta hashes and their `/wait` answers (`Keys.stream`, `stream_meta`, `result`). They were
given `stream_ttl_after_end_s` at the run's `end` and expire by themselves; the thread is
deleted a moment after that `end`, while its clients are still reading:

- `/runs/wait` answers from `Keys.result` once the thread (and the checkpoints the answer
  would be read from) is gone (RunManager.stored_result);
- `/runs/stream` reads the stream until its `end` at the reader's own pace (a batch per
  Redis read, written to a socket that a slow client drains slowly). A stream deleted
  under it would cut it short: a snapshot that finds the key missing after a cursor, or a
  follower whose stream vanished once the run is terminal, yields a gap in place of the
  remaining events (shared/bridge/subscriber.py), and the entries still to read need the
  meta hash's compression dictionaries to decode. Such a client cannot recover: the
  thread it would reload from is gone. So the stream stays for its TTL, as it does for a
  thread that is kept.

What goes: the thread's admission stream (`Keys.thread_runs`) and its runs' lease and
cancel keys (normally dropped by the worker already at the end; not when the run ended
without one). No audit record: a temporary thread's deletion is its run's own
`on_completion=delete`, asked for at admission and done for every run without a thread,
not a removal someone decided later (a user's delete, an expiry). A record per stateless
run would also outgrow the sweep's pruning of `ops_audit` (`sweep_limit` records a sweep).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
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
    """Removes threads with what is theirs: a user's delete, the sweep's expiry and the
    temporary thread of a run without one."""

    def __init__(self, store: RunStore, client: redis.Redis, keys: Keys, workspace_root: Path):
        self.store = store
        self._redis = client
        self._keys = keys
        self._root = workspace_root

    def thread_keys(self, doomed: Doomed, *, streams: bool = True) -> list[str]:
        """The Redis keys of the thread and of its runs that are not executing (a running
        run's lease and cancel keys are how it is told to stop; they expire with it).
        `streams=False` (a temporary thread): not its runs' streams, meta hashes and `/wait`
        answers, which their clients may still be reading (the module's doc)."""
        k = self._keys
        out = [k.thread_runs(doomed.thread_id)]
        for run_id in doomed.run_ids:
            if run_id not in doomed.running:
                if streams:
                    out += [k.stream(run_id), k.stream_meta(run_id), k.result(run_id)]
                out += [k.lease(run_id), k.cancel(run_id)]
        return out

    def _drop_keys(self, doomed: Doomed, *, streams: bool = True) -> None:
        # One key a command (valid on Redis Cluster, where a pipeline splits by slot), in
        # one round trip.
        pipe = self._redis.pipeline(transaction=False)
        for key in self.thread_keys(doomed, streams=streams):
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

    def delete_temporary(self, thread_id: str, *, lock_timeout_s: float | None = None) -> bool:
        """Delete a temporary thread if every run on it has ended (and no webhook delivery
        still reads it); whether it was deleted. Its checkpoints, its keys except its runs'
        streams and `/wait` answers (the module's doc), its workspace files. A workspace
        that cannot be removed, or Redis unreachable, fails the whole deletion (rolled
        back): the recovery pass finds the row and tries again."""
        thread_id = str(uuid.UUID(thread_id))  # no path tricks

        def purge(conn: psycopg.Connection[DictRow], doomed: Doomed) -> None:
            delete_checkpoints_in(conn, thread_id)
            self._drop_keys(doomed, streams=False)
            # Files last: if the commit then fails, the row stays and the next pass retries
            # (a missing folder is skipped); symlinks inside are unlinked, not followed.
            workspaces.remove_workspace(self._root, doomed.owner, thread_id)

        return self.store.delete_temporary_thread(thread_id, purge, lock_timeout_s=lock_timeout_s)

    def purge_temporary(
        self, *, grace_s: float, lock_timeout_s: float | None = None, limit: int = 100
    ) -> TemporaryPurge:
        """The recovery pass: delete the temporary threads whose runs all ended more than
        `grace_s` ago, each in a transaction of its own."""
        counts = TemporaryPurge()
        for thread_id in self.store.finished_temporary_threads(grace_s, limit):
            try:
                if self.delete_temporary(thread_id, lock_timeout_s=lock_timeout_s):
                    counts.deleted += 1
            except psycopg.errors.LockNotAvailable:
                counts.locked += 1
            except (psycopg.Error, redis.RedisError, OSError):
                # One thread that cannot be deleted now must not stop the others.
                log.exception("deleting a temporary thread failed", extra={"thread_id": thread_id})
                counts.failed += 1
        return counts


@dataclass
class TemporaryPurge:
    """What one recovery pass over temporary threads did."""

    deleted: int = 0
    locked: int = 0  # a cron, run or thread row held by another transaction: next pass
    failed: int = 0  # an error (logged); the row stays, the next pass tries again
