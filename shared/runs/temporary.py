"""Temporary threads: the thread a run without a thread executes on (A1).

`POST /runs`, `/runs/stream`, `/runs/wait` and thread-less `/runs/batch` items create the
thread in the run's admission transaction, owned by the caller. With `on_completion=delete`
(the default) the thread goes once every run on it has ended: its runs and their audit
events (cascade), its checkpoints and its workspace files, in one transaction under the
thread row lock (`RunStore.delete_temporary_thread`), so a failure leaves all of it.

Two paths call `delete_if_finished`: the worker, right after the run's terminal status,
its `/wait` result (`Keys.result`) and its `end` are out; and the recovery pass
(`purge_finished`) for threads whose runs ended more than `temporary_thread_grace_s` ago,
which is what makes the deletion durable: a worker that died between the end and the
delete, or a deletion that failed, leaves the row, and the row is what the pass finds.
The grace covers the runs that end without a worker (cancelled while pending, failed by
the reaper): their waiting clients read the final values from the thread meanwhile.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg.rows import DictRow

from shared import workspaces
from shared.runs.store import RunStore
from shared.state.accessor import delete_checkpoints_in

log = logging.getLogger(__name__)


def delete_if_finished(
    store: RunStore, thread_id: str, workspace_root: Path, *, lock_timeout_s: float | None = None
) -> bool:
    """Delete the temporary thread if every run on it has ended; whether it was deleted."""
    thread_id = str(uuid.UUID(thread_id))  # no path tricks

    def purge(conn: psycopg.Connection[DictRow], owner: str) -> None:
        delete_checkpoints_in(conn, thread_id)
        # Files last: if the commit then fails, the row stays and the next pass retries
        # (a missing folder is skipped); symlinks inside are unlinked, not followed.
        workspaces.remove_workspace(workspace_root, owner, thread_id)

    return store.delete_temporary_thread(thread_id, purge, lock_timeout_s=lock_timeout_s)


@dataclass
class PurgeCounts:
    """What one recovery pass over temporary threads did."""

    deleted: int = 0
    locked: int = 0  # a run row or thread row held by another transaction: next pass
    failed: int = 0  # an error (logged); the row stays, the next pass tries again


def purge_finished(
    store: RunStore,
    workspace_root: Path,
    *,
    grace_s: float,
    lock_timeout_s: float | None = None,
    limit: int = 100,
) -> PurgeCounts:
    """Delete the temporary threads whose runs all ended more than `grace_s` ago."""
    counts = PurgeCounts()
    for thread_id in store.finished_temporary_threads(grace_s, limit):
        try:
            if delete_if_finished(store, thread_id, workspace_root, lock_timeout_s=lock_timeout_s):
                counts.deleted += 1
        except psycopg.errors.LockNotAvailable:
            counts.locked += 1
        except (psycopg.Error, OSError):
            # One thread that cannot be deleted now must not stop the others.
            log.exception("deleting a temporary thread failed", extra={"thread_id": thread_id})
            counts.failed += 1
    return counts
