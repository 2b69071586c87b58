"""The worker's side of a run: claim it (L1, L3), record its rollback point (R5), finish it
under its epoch (L2) and hand the thread over to the next run.

The epoch is the fence: a claim bumps `owner_epoch`, and every later write of the attempt
matches its epoch while the run is running, so a worker that lost the run (requeued and
claimed again, or failed by the reaper: shared/runs/reaper_queries.py) writes nothing. Also
here: `run_events`, the lifecycle audit trail those writes leave.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import DictRow

from shared.db import pipelined_transaction
from shared.errors import LeaseLost
from shared.journal import Category, with_event
from shared.runs.model import Run
from shared.runs.queries import query
from shared.runs.run_reads import run_status_in
from shared.runs.store_base import StoreBase, json_param
from shared.runs.thread_queue import next_run_id, queue_settle
from shared.vocab import JSONObject, RunStatus, ThreadStatus

log = logging.getLogger(__name__)

LOCK_THREAD_BY_ID_SQL = query("lock_thread_by_id")
SET_PRE_RUN_CHECKPOINT_SQL = query("set_pre_run_checkpoint")
FINISH_SQL = query("finish")
SAVEPOINT_SQL = query("savepoint_isolated")
ROLLBACK_TO_SAVEPOINT_SQL = query("rollback_to_isolated")
LIST_RUN_EVENTS_SQL = query("list_run_events")
SHARE_THREAD_OF_RUN_SQL = query("share_thread_of_run")
SHARE_RUNNING_RUN_SQL = query("share_running_run")
# The claim and its `claimed` lifecycle event in one statement (one round trip with its
# commit, on every run's path to its first token). Composed here, not in queries.sql: the
# event's payload is an expression over the claimed row that `with_event` wraps around it.
CLAIM_LOGGED_SQL = with_event(
    query("claim"),
    "jsonb_build_object('owner', changed.owner, 'epoch', changed.owner_epoch,"
    " 'attempt', changed.attempt)",
)


class ClaimOutcome(enum.Enum):
    """Why a claim did or did not give us the run."""

    CLAIMED = "claimed"
    NOT_PENDING = "not_pending"  # duplicate delivery, already running or finished (L3)
    NOT_HEAD = "not_head"  # another run of the thread goes first; it will dispatch us


@dataclass(frozen=True, slots=True)
class Claim:
    """The result of a claim; `run` is the claimed run (with its owner's `user_id`)."""

    outcome: ClaimOutcome
    run: Run | None = None


@dataclass(frozen=True, slots=True)
class Finish:
    """The result of a fenced terminal write: refused (a newer epoch owns the run) or the
    next run of the thread to dispatch."""

    fenced: bool
    next_run_id: str | None = None


def _isolated(
    conn: psycopg.Connection[DictRow],
    pipeline: psycopg.Pipeline,
    write: Callable[[psycopg.Connection[DictRow]], None],
) -> None:
    """Queue `write` under a savepoint of the caller's pipelined transaction and send it
    (one round trip); if it fails, roll back to the savepoint and log: the transaction goes
    on without it."""
    conn.execute(SAVEPOINT_SQL, prepare=False)
    write(conn)
    try:
        pipeline.sync()
    except psycopg.Error:
        if conn.broken:
            raise  # the connection, not the write: the whole transaction is lost
        log.exception("an optional write of the transaction failed; rolled back alone")
        conn.execute(ROLLBACK_TO_SAVEPOINT_SQL, prepare=False)


class ClaimStore(StoreBase):
    """Claims and fenced finishes of runs."""

    @contextmanager
    def files_fence(self, run_id: str, epoch: int, *, idle_s: float = 5.0) -> Iterator[None]:
        """Hold the attempt's thread and run rows shared for the block (a file write of the
        run, L2): LeaseLost when the thread is gone or the attempt no longer owns the run.
        The thread row first, as its delete and an admission lock it before the run rows:
        a delete waits for the write, then removes the thread's files with it; a write
        after the delete finds nothing and writes nothing (a re-created thread of the same
        id has other runs, so the stale attempt's run is not among them)."""
        params = {"run_id": run_id, "epoch": epoch, "idle": f"{int(idle_s * 1000)}ms"}
        with self._pool.connection() as conn, conn.transaction():
            thread = conn.execute(SHARE_THREAD_OF_RUN_SQL, params).fetchone()
            if thread is None or conn.execute(SHARE_RUNNING_RUN_SQL, params).fetchone() is None:
                raise LeaseLost(
                    f"run {run_id}: its thread is gone or epoch {epoch} no longer owns it"
                )
            yield

    def claim(self, run_id: str, owner: str) -> Claim:
        """Make the run ours: status running, epoch + 1, attempt + 1 (L1, L3)."""
        params = {
            "run_id": run_id,
            "owner": owner,
            "category": Category.LIFECYCLE.value,
            "type": "claimed",
        }
        try:
            with self._pool.connection() as conn:
                row = conn.execute(CLAIM_LOGGED_SQL, params).fetchone()
        except psycopg.errors.UniqueViolation:
            # Another run of this thread became running concurrently (the partial unique
            # index, R3): that run goes first and dispatches us when it finishes.
            return Claim(ClaimOutcome.NOT_HEAD)
        if row is not None:
            return Claim(ClaimOutcome.CLAIMED, Run.from_row(row))
        with self._pool.connection() as conn:
            status = run_status_in(conn, run_id)
        if status is RunStatus.PENDING:
            return Claim(ClaimOutcome.NOT_HEAD)
        return Claim(ClaimOutcome.NOT_PENDING)

    def set_pre_run_checkpoint(
        self,
        run_id: str,
        epoch: int,
        checkpoint_id: str,
        writes: list[Any] | None = None,
    ) -> None:
        """Record the rollback point of the run (R5): the head checkpoint's id ('' for a
        thread with none) and a copy of its pending writes."""
        with self._pool.connection() as conn:
            conn.execute(
                SET_PRE_RUN_CHECKPOINT_SQL,
                {
                    "run_id": run_id,
                    "epoch": epoch,
                    "checkpoint_id": checkpoint_id,
                    "writes": json_param(writes or None),
                },
            )

    def finish(
        self,
        run_id: str,
        thread_id: str,
        epoch: int,
        *,
        status: RunStatus,
        error: JSONObject | None,
        thread_status: ThreadStatus,
        usage: JSONObject | None = None,
        also: Callable[[psycopg.Connection[DictRow]], None] | None = None,
    ) -> Finish:
        """Write the terminal status only while we own the run (L2), then settle the thread.

        `also` queues writes in the same transaction once the fenced write succeeded (the run
        row is ours and locked until commit), for writes that must be fenced like the status:
        the thread's head copy (`shared.state.head_copies`). They run under a savepoint: if
        they fail, they are rolled back alone and logged, and the run still ends (its
        terminal status never depends on them). `also` must not open a transaction itself
        (the connection is in a `pipelined_transaction`)."""
        # Two round trips (three with `also`, whose savepoint is sent on its own): BEGIN, the
        # lock and the fenced write, whose row decides the rest; then the lifecycle event,
        # the settle and COMMIT (docs/performance.md).
        with self._pool.connection() as conn:
            with pipelined_transaction(conn) as pipeline:
                conn.execute(LOCK_THREAD_BY_ID_SQL, {"thread_id": thread_id})
                row = conn.execute(
                    FINISH_SQL,
                    {
                        "run_id": run_id,
                        "epoch": epoch,
                        "status": status,
                        "error": json_param(error),
                        "usage": json_param(usage),
                    },
                ).fetchone()
                if row is None:
                    self._lifecycle(
                        conn, run_id, thread_id, "fenced", {"epoch": epoch, "status": status}
                    )
                    return Finish(fenced=True)
                if also is not None:  # first: a failure met at its sync is then its own
                    _isolated(conn, pipeline, also)
                self._lifecycle(conn, run_id, thread_id, status, {"epoch": epoch, "error": error})
                settled = queue_settle(conn, thread_id, thread_status)
            return Finish(fenced=False, next_run_id=next_run_id(settled.fetchone()))

    def run_events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's audit events in order."""
        with self._pool.connection() as conn:
            return conn.execute(LIST_RUN_EVENTS_SQL, {"run_id": run_id}).fetchall()
