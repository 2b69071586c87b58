"""Admission (R2, R3) and explicit cancel (R5): the writes that decide which runs of a thread
go on, each one transaction under the thread row lock.

The decision itself is pure (shared/runs/admission.py: `decide`, `cancel_outcome`); this
module reads what it needs under the lock, asks it, and writes exactly what it says, with
nothing but SQL in between. Cancel lives here too because both end or flag inflight runs
through the same `_cancel_victim`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg
from psycopg.rows import DictRow

from shared.db import pipeline_block, pipelined_transaction
from shared.errors import RunNotFound, ThreadBusy, ThreadNotFound
from shared.runs.admission import (
    AdmissionDecision,
    CancelOutcome,
    Inflight,
    cancel_outcome,
    decide,
    inflight_needed,
)
from shared.runs.model import Run, RunRequest
from shared.runs.queries import query
from shared.runs.store_base import StoreBase, json_param
from shared.runs.thread_queue import INFLIGHT_RUNS_SQL, as_inflight, inflight_in, settle_in
from shared.vocab import CancelAction, JSONObject, MultitaskStrategy, RunStatus, ThreadStatus
from shared.webhooks import store as webhooks

INSERT_THREAD_SQL = query("insert_thread")
LOCK_THREAD_SQL = query("lock_thread")
INSERT_RUN_SQL = query("insert_run")
MARK_THREAD_BUSY_SQL = query("mark_thread_busy")
INTERRUPT_PENDING_SQL = query("interrupt_pending")
REQUEST_CANCEL_RUNNING_SQL = query("request_cancel_running")
REQUEST_ROLLBACK_PENDING_SQL = query("request_rollback_pending")
LOCK_RUN_SQL = query("lock_run")


@dataclass(frozen=True, slots=True)
class AdmitItem:
    """One run to admit: the request, its new id, its graph and the strategy in force."""

    request: RunRequest
    run_id: str
    graph_id: str
    strategy: MultitaskStrategy


@dataclass(frozen=True, slots=True)
class Admission:
    """The admitted run (None when rejected) and what must happen after commit."""

    decision: AdmissionDecision
    run: Run | None
    dispatch: list[str]
    cancel_running: list[str]
    ended: tuple[str, ...] = ()  # pending runs it cancelled: their webhooks are due

    @property
    def cancel_action(self) -> CancelAction:
        """How the cancelled runs end."""
        return self.decision.action


def new_thread_metadata(items: Sequence[AdmitItem], thread_id: str) -> JSONObject:
    """The metadata of a thread a batch's run creates: its first run's metadata, as the
    LangGraph Agent Server starts a thread made by a run (a project's auth handler that
    stamps `metadata.owner` on the run so makes its owner see the thread)."""
    for item in items:
        if item.request.thread_id == thread_id:
            return dict(item.request.metadata)
    return {}


class AdmissionStore(StoreBase):
    """Admitting runs onto threads, and cancelling them."""

    def admit(
        self,
        request: RunRequest,
        *,
        run_id: str,
        owner: str,
        graph_id: str,
        strategy: MultitaskStrategy,
    ) -> Admission:
        """Write what `admission.decide` decides (R2): the thread row lock serialises admissions,
        and nothing but SQL happens between reading the inflight runs and the insert."""
        item = AdmitItem(request, run_id, graph_id, strategy)
        # Two round trips: BEGIN with the reads, then the writes with COMMIT; the run row
        # is read back once the block has ended (docs/performance.md).
        with self._pool.connection() as conn:
            with pipelined_transaction(conn):
                admission = self._queue_admission(conn, owner, item)
            return admission()

    def admit_many(self, owner: str, items: Sequence[AdmitItem]) -> list[Admission]:
        """Admit a batch all or nothing: one transaction; an item whose thread is missing
        (404) or busy under `reject` (409) rolls back every other and names its index.

        The threads are created and locked first, in id order, so two batches that share
        threads cannot deadlock; then the items are admitted in request order (FIFO).
        """
        with self._pool.connection() as conn, conn.transaction():
            for thread_id, create, public_id in sorted(
                {
                    (i.request.thread_id, i.request.create_thread, i.request.public_thread_id)
                    for i in items
                },
                key=lambda t: t[0],
            ):
                params = {"thread_id": thread_id, "owner": owner}
                if create:
                    self.check_thread_quota(conn, owner, thread_id, public_id)
                    conn.execute(
                        INSERT_THREAD_SQL,
                        {
                            **params,
                            "public_id": public_id,
                            "metadata": json_param(new_thread_metadata(items, thread_id)),
                            **self.ttl_params(),
                        },
                    )
                conn.execute(LOCK_THREAD_SQL, params)
            admissions = []
            for index, item in enumerate(items):
                try:
                    admission = self._admit_in(conn, owner, item)
                except ThreadNotFound as exc:
                    raise ThreadNotFound(f"item {index}: {exc}") from exc
                if not admission.decision.creates:
                    raise ThreadBusy(
                        f"item {index}: thread {item.request.thread_id} already has a run in"
                        " progress (multitask_strategy=reject)"
                    )
                admissions.append(admission)
        return admissions

    def admit_in(self, conn: psycopg.Connection[DictRow], owner: str, item: AdmitItem) -> Admission:
        """`admit` inside the caller's transaction: a cron firing commits the run with its
        firing record and its schedule's advance, all or nothing (shared/crons/store.py)."""
        return self._admit_in(conn, owner, item)

    def _admit_in(
        self, conn: psycopg.Connection[DictRow], owner: str, item: AdmitItem
    ) -> Admission:
        """The admission of one run inside the caller's transaction."""
        return self._queue_admission(conn, owner, item)()

    def _queue_admission(
        self, conn: psycopg.Connection[DictRow], owner: str, item: AdmitItem
    ) -> Callable[[], Admission]:
        """Admit one run inside the caller's transaction, up to its queued writes; the
        admission is what the returned function answers (it reads the new run row back).

        Pipeline mode (libpq): the reads go in one round trip with whatever the caller
        queued before them (BEGIN), and the writes are only queued, so that a caller in a
        `pipelined_transaction` sends them with its COMMIT. A run's first token waits on
        every round trip before it (docs/performance.md). Outside pipeline mode each block
        is a pipeline of its own.
        """
        request, run_id, strategy = item.request, item.run_id, item.strategy
        thread_id = request.thread_id
        params = {"thread_id": thread_id, "owner": owner}
        with pipeline_block(conn):
            if request.create_thread:
                self.check_thread_quota(conn, owner, thread_id, request.public_thread_id)
                conn.execute(
                    INSERT_THREAD_SQL,
                    {
                        **params,
                        "public_id": request.public_thread_id,
                        "metadata": json_param(request.metadata),
                        **self.ttl_params(),
                    },
                )
            locked = conn.execute(LOCK_THREAD_SQL, params)
            inflight_rows = conn.execute(
                INFLIGHT_RUNS_SQL, {"thread_id": thread_id, "limit": inflight_needed(strategy)}
            )
            if locked.fetchone() is None:
                raise ThreadNotFound(f"thread {thread_id} not found")
            inflight = as_inflight(inflight_rows)
        decision = decide(strategy, inflight, delayed=request.after_seconds > 0)
        if not decision.creates:
            return lambda: Admission(decision, None, [], [])
        cancel_running: list[str] = []
        ended: list[str] = []
        for victim in decision.cancel:
            outcome, running = self._cancel_victim(
                conn, victim, thread_id, decision.action, by=run_id
            )
            if outcome is CancelOutcome.REQUESTED and running:
                cancel_running.append(victim.run_id)  # its owner must hear of it
            elif outcome is CancelOutcome.CANCELLED:
                ended.append(victim.run_id)
        with pipeline_block(conn):
            inserted = conn.execute(
                INSERT_RUN_SQL,
                {
                    **params,
                    "run_id": run_id,
                    "assistant_id": request.assistant_id,
                    "graph_id": item.graph_id,
                    "input": json_param(request.input),
                    "command": json_param(request.command),
                    "config": json_param(request.config),
                    "context": json_param(request.context),
                    "metadata": json_param(request.metadata),
                    "kwargs": json_param(request.kwargs),
                    "multitask_strategy": strategy,
                    "on_disconnect": request.on_disconnect,
                    "on_completion": request.on_completion,
                    "webhook": request.webhook,
                    "dispatch": decision.dispatch_now,
                    "after_s": request.after_seconds,
                },
            )
            if request.webhook is not None:  # the outbox row commits with the run
                webhooks.insert_in(conn, run_id, thread_id, request.webhook)
            conn.execute(
                MARK_THREAD_BUSY_SQL,
                {**params, "graph_id": item.graph_id, "assistant_id": request.assistant_id},
            )
            self._lifecycle(conn, run_id, thread_id, "created", {"outcome": decision.outcome.value})
        dispatch = [run_id] if decision.dispatch_now else []

        def admission() -> Admission:
            row = inserted.fetchone()
            assert row is not None
            return Admission(decision, Run.from_row(row), dispatch, cancel_running, tuple(ended))

        return admission

    def _cancel_victim(
        self,
        conn: psycopg.Connection[DictRow],
        victim: Inflight,
        thread_id: str,
        action: CancelAction,
        *,
        by: str,
    ) -> tuple[CancelOutcome, bool]:
        """Write `admission.cancel_outcome` for one inflight run in the caller's transaction
        (thread row locked): end it now, or record the request for its owner (R5). Also
        whether the run is running (its owner must be told).

        A claim takes no thread lock, so a run read as pending may have been claimed since:
        then ending it matches no row, and the request goes to its new owner instead (before,
        the run was journaled `interrupted` and ran on to `success`: two outcomes, and the
        cancel lost). Each write is synced on its own (a nested pipeline block) because its
        row count decides what follows.
        """
        params = {"run_id": victim.run_id, "action": action}
        running = victim.status is RunStatus.RUNNING
        if cancel_outcome(victim, action) is CancelOutcome.CANCELLED:
            with conn.pipeline():
                ended = conn.execute(INTERRUPT_PENDING_SQL, params)
            if ended.rowcount == 1:
                self._lifecycle(conn, victim.run_id, thread_id, RunStatus.INTERRUPTED, {"by": by})
                return CancelOutcome.CANCELLED, False
            running = True  # claimed since the read; if it has ended, nothing matches below
        sql = REQUEST_CANCEL_RUNNING_SQL if running else REQUEST_ROLLBACK_PENDING_SQL
        with conn.pipeline():
            requested = conn.execute(sql, params)
        if requested.rowcount == 0:
            return CancelOutcome.ALREADY_REQUESTED, running
        self._lifecycle(
            conn, victim.run_id, thread_id, "cancel_requested", {"action": action, "by": by}
        )
        return CancelOutcome.REQUESTED, running

    def request_cancel(
        self, thread_id: str, run_id: str, owner: str, action: CancelAction
    ) -> tuple[CancelOutcome, str | None]:
        """Record a cancel request; returns the outcome and a run to dispatch next, if any."""
        with self._pool.connection() as conn, conn.transaction():
            thread = conn.execute(
                LOCK_THREAD_SQL, {"thread_id": thread_id, "owner": owner}
            ).fetchone()
            if thread is None:
                raise RunNotFound(f"run {run_id} not found")
            row = conn.execute(
                LOCK_RUN_SQL, {"thread_id": thread_id, "run_id": run_id, "owner": owner}
            ).fetchone()
            if row is None:
                raise RunNotFound(f"run {run_id} not found")
            run = Run.from_row(row)
            if run.terminal:
                return CancelOutcome.ALREADY_DONE, None
            head = inflight_in(conn, thread_id, limit=1)
            victim = Inflight(run.run_id, run.status, run.attempt)
            outcome, _running = self._cancel_victim(conn, victim, thread_id, action, by="cancel")
            # Only the head's successor needs a dispatch; behind others nothing changes.
            nxt = None
            if outcome is CancelOutcome.CANCELLED and head and head[0].run_id == run.run_id:
                nxt = settle_in(conn, thread_id, ThreadStatus.IDLE)
            return outcome, nxt
