"""Ops actions on runs: cancel and requeue, each audited in `ops_audit` (who, what, when, result);
and on crons: list and delete any user's (a revoked user's crons, which no user can delete).

Both go through the run store / manager, so the same fencing holds as for users and the
reaper: a cancel is `RunManager.cancel`; a requeue of a running run is `RunStore.requeue`
(fenced on the epoch the caller saw, status `running`), allowed only when the run's lease
is gone and the run has not been touched for a lease TTL (the reaper's own rule), and a
requeue of a pending run is a re-dispatch, allowed only when the run was never dispatched
although it is its thread's head and due (the reaper's R4 rule): a run waiting its turn
behind another run of its thread, or a delayed run before its time, is not stuck.
A duplicate dispatch is harmless: the claim lets one executor in (L3).

`requeue_verdict` is that rule as a pure function: the action applies it, and the ops
runs listing shows it (`requeue.eligible`), so the page offers requeue exactly where the
server would accept it.

The caller gives a manager whose store's connections carry a `lock_timeout`
(`ops_lock_timeout_s`): an owner frozen inside a transaction (e.g. mid checkpoint write,
holding its run row) makes the action answer `locked` instead of hanging the request.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
from dataclasses import dataclass
from typing import Any

import psycopg
import redis

from shared.crons.model import CronNotFound
from shared.crons.store import CronStore
from shared.errors import RunNotFound
from shared.ops.store import OpsStore
from shared.redis_keys import Keys
from shared.runs.admission import CancelOutcome
from shared.runs.manager import RunManager
from shared.runs.model import Run
from shared.runs.taskqueue import Dispatcher
from shared.settings import Settings
from shared.vocab import CancelAction, RunStatus

log = logging.getLogger(__name__)


class RequeueOutcome(enum.Enum):
    """What a requeue did or why it refused."""

    REQUEUED = "requeued"  # running with an expired lease: now pending again, dispatched
    DISPATCHED = "dispatched"  # pending and never dispatched: dispatched now
    LEASE_HELD = "lease_held"  # an owner still holds the lease
    RECENTLY_ACTIVE = "recently_active"  # no lease, but updated within a lease TTL
    ALREADY_DISPATCHED = "already_dispatched"  # pending and in the queue already
    QUEUED_BEHIND = "queued_behind"  # pending behind another run of its thread: its turn comes
    NOT_DUE = "not_due"  # a delayed run before its start time
    NOT_INFLIGHT = "not_inflight"  # terminal
    RACED = "raced"  # the run changed between our read and the fenced write
    LOCKED = "locked"  # the run row stayed locked past `ops_lock_timeout_s`

    @property
    def done(self) -> bool:
        """Whether the run was handed to the queue."""
        return self in (RequeueOutcome.REQUEUED, RequeueOutcome.DISPATCHED)


REQUEUE_WHY = {
    RequeueOutcome.REQUEUED: "running, but its lease expired: requeue to resume it",
    RequeueOutcome.DISPATCHED: "pending and never dispatched: requeue to dispatch it",
    RequeueOutcome.LEASE_HELD: "a worker holds its lease",
    RequeueOutcome.RECENTLY_ACTIVE: "no lease, but active within a lease TTL",
    RequeueOutcome.ALREADY_DISPATCHED: "in the queue, waiting for a worker",
    RequeueOutcome.QUEUED_BEHIND: "waiting its turn behind another run of its thread",
    RequeueOutcome.NOT_DUE: "delayed: not due yet",
    RequeueOutcome.NOT_INFLIGHT: "it has ended",
}
"""Why a run may or may not be requeued, as the ops page and CLI say it."""


def requeue_verdict(
    *,
    status: str,
    lease_held: bool,
    idle_s: float,
    dispatched: bool,
    behind: bool,
    due: bool,
    lease_ttl_s: float,
) -> RequeueOutcome:
    """What a requeue would do to a run in this state (REQUEUED/DISPATCHED: it would act)."""
    if status not in (RunStatus.PENDING, RunStatus.RUNNING):
        return RequeueOutcome.NOT_INFLIGHT
    if status == RunStatus.PENDING:
        if behind:
            return RequeueOutcome.QUEUED_BEHIND
        if not due:
            return RequeueOutcome.NOT_DUE
        if dispatched:
            return RequeueOutcome.ALREADY_DISPATCHED
        return RequeueOutcome.DISPATCHED
    if lease_held:
        return RequeueOutcome.LEASE_HELD
    if idle_s < lease_ttl_s:
        return RequeueOutcome.RECENTLY_ACTIVE
    return RequeueOutcome.REQUEUED


@dataclass(frozen=True, slots=True)
class ActionResult:
    """An action's outcome and its audit record."""

    outcome: str
    ok: bool
    audit: dict[str, Any]


class OpsActions:
    """Cancel and requeue on behalf of an ops user."""

    def __init__(
        self,
        settings: Settings,
        manager: RunManager,
        store: OpsStore,
        dispatcher: Dispatcher,
        client: redis.Redis,
        crons: CronStore,
    ) -> None:
        self._settings = settings
        self._crons = crons
        self._manager = manager
        self._store = store
        self._dispatcher = dispatcher
        self._redis = client
        self._keys = Keys(settings.redis_prefix)

    def cancel(self, actor: str, run_id: str, action: CancelAction) -> ActionResult:
        """Cancel any user's run (R5 semantics: pending stops now, running at a safe point)."""
        run = self._manager.store.get_run_by_id(run_id)
        if run is None or run.user_id is None:
            self._audit(actor, "cancel", run_id, {"action": action}, "not_found", {})
            raise RunNotFound(f"run {run_id} not found")
        detail = {"status_before": run.status, "epoch": run.owner_epoch}
        try:
            outcome = self._manager.cancel(
                owner=run.user_id, thread_id=run.thread_id, run_id=run_id, action=action
            )
        except psycopg.errors.LockNotAvailable:
            locked = RequeueOutcome.LOCKED.value
            audit = self._audit(actor, "cancel", run_id, {"action": action}, locked, detail)
            return ActionResult(locked, False, audit)
        ok = outcome in (CancelOutcome.CANCELLED, CancelOutcome.REQUESTED)
        audit = self._audit(actor, "cancel", run_id, {"action": action}, outcome.value, detail)
        return ActionResult(outcome.value, ok, audit)

    def requeue(self, actor: str, run_id: str, reason: str) -> ActionResult:
        """Hand a stuck run back to the queue (see the module docstring for when)."""
        run = self._manager.store.get_run_by_id(run_id)
        params = {"reason": reason}
        if run is None:
            self._audit(actor, "requeue", run_id, params, "not_found", {})
            raise RunNotFound(f"run {run_id} not found")
        try:
            outcome = self._requeue(run, f"ops requeue by {actor}: {reason}")
        except psycopg.errors.LockNotAvailable:
            outcome = RequeueOutcome.LOCKED
        detail = {
            "status_before": run.status,
            "epoch": run.owner_epoch,
            "attempt": run.attempt,
            "owner": run.owner,
        }
        audit = self._audit(actor, "requeue", run_id, params, outcome.value, detail)
        return ActionResult(outcome.value, outcome.done, audit)

    def _requeue(self, run: Run, reason: str) -> RequeueOutcome:
        run_id = run.run_id
        row = self._store.get_run(run_id) if not run.terminal else None
        verdict = requeue_verdict(
            status=run.status,
            lease_held=bool(self._redis.exists(self._keys.lease(run_id))),
            idle_s=(dt.datetime.now(dt.UTC) - run.updated_at).total_seconds(),
            dispatched=run.dispatched_at is not None,
            behind=bool(row and row["behind"]),
            due=bool(row["due"]) if row else True,
            lease_ttl_s=self._settings.lease_ttl_s,
        )
        if verdict is RequeueOutcome.DISPATCHED:
            self._dispatcher.dispatch_run(run_id)
        elif verdict is RequeueOutcome.REQUEUED:
            if not self._manager.store.requeue(run_id, run.owner_epoch, reason):
                return RequeueOutcome.RACED
            self._dispatcher.dispatch_run(run_id)
        return verdict

    def crons(
        self, *, user_id: str | None, enabled: bool | None, limit: int
    ) -> list[dict[str, Any]]:
        """Any user's crons with their last firing, newest first."""
        return self._crons.list_any(user_id=user_id, enabled=enabled, limit=limit)

    def delete_cron(self, actor: str, cron_id: str) -> ActionResult:
        """Delete any user's cron (CronNotFound when there is none); audited either way."""
        row = self._crons.delete_any(cron_id)
        params = {"cron_id": cron_id}
        if row is None:
            self._audit(actor, "cron.delete", None, params, "not_found", {})
            raise CronNotFound(f"cron {cron_id} not found")
        detail = {
            "user_id": row["user_id"],
            "assistant_id": row["assistant_id"],
            "thread_id": str(row["thread_id"]) if row["thread_id"] else None,
            "schedule": row["schedule"],
            "enabled": row["enabled"],
        }
        audit = self._audit(actor, "cron.delete", None, params, "deleted", detail)
        return ActionResult("deleted", True, audit)

    def _audit(
        self,
        actor: str,
        action: str,
        run_id: str | None,
        params: dict[str, Any],
        result: str,
        detail: dict[str, Any],
    ) -> dict[str, Any]:
        log.info("ops %s: %s", action, result, extra={"run_id": run_id, "actor": actor, **params})
        return self._store.audit(
            actor=actor,
            action=action,
            run_id=run_id,
            params=params,
            result=result,
            detail=detail,
        )

    def list_audit(self, *, run_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Audit records, newest first."""
        return self._store.list_audit(run_id=run_id, limit=limit)
