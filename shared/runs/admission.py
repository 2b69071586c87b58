"""The pure admission decision (R2, R3): given a strategy and the thread's inflight runs.

No IO here: `RunStore.admit` reads the inflight runs under the thread lock, asks `decide`,
and writes exactly what the decision says. The same `cancel_outcome` rule decides what an
explicit cancel (R5) does to one run.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from shared.runs.model import CancelAction, MultitaskStrategy, RunStatus


class AdmissionOutcome(enum.Enum):
    """What admitting a new run does; maps one-to-one to an HTTP status and a log line."""

    DISPATCH = "dispatch"  # no inflight run: create and dispatch now
    QUEUED = "queued"  # enqueue: create pending behind the inflight runs (FIFO)
    REJECTED = "rejected"  # reject: nothing created (409)
    INTERRUPT = "interrupt"  # cancel the inflight runs (keep progress), then run
    ROLLBACK = "rollback"  # cancel the inflight runs, restore the pre-run state, then run


class CancelOutcome(enum.Enum):
    """What a cancel request did."""

    CANCELLED = "cancelled"  # was pending: now interrupted, no executor involved
    REQUESTED = "requested"  # running: the owner stops at its next safe point
    ALREADY_REQUESTED = "already_requested"
    ALREADY_DONE = "already_done"  # terminal: nothing to do


@dataclass(frozen=True, slots=True)
class Inflight:
    """A pending or running run of the thread, in FIFO order."""

    run_id: str
    status: RunStatus
    attempt: int = 0  # > 0 for a pending run that already ran (requeued after a failure)

    @property
    def has_progress(self) -> bool:
        """Whether the run may have written checkpoints (running, or ran before)."""
        return self.status == RunStatus.RUNNING or self.attempt > 0


def cancel_outcome(victim: Inflight, action: CancelAction) -> CancelOutcome:
    """What cancelling `victim` does (R5): end it now, or record a request for its owner.

    A pending run with no progress ends `interrupted` at once. A running run (and, for
    rollback, a pending run that already ran and may have checkpointed) gets the request
    recorded; its executor stops at the next safe point and, for rollback, restores the
    pre-run state first.
    """
    if victim.status == RunStatus.PENDING and not (
        action == CancelAction.ROLLBACK and victim.has_progress
    ):
        return CancelOutcome.CANCELLED
    return CancelOutcome.REQUESTED


def inflight_needed(strategy: MultitaskStrategy) -> int | None:
    """How many inflight runs `decide` needs to see (None: all of them).

    reject/enqueue only need to know whether anything is inflight; interrupt and rollback
    cancel every inflight run (a long queue must not slow every admission).
    """
    if strategy in (MultitaskStrategy.INTERRUPT, MultitaskStrategy.ROLLBACK):
        return None
    return 1


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """The whole decision: the outcome, the cancel action and the runs it cancels (FIFO)."""

    outcome: AdmissionOutcome
    action: CancelAction = CancelAction.INTERRUPT
    cancel: list[Inflight] = field(default_factory=list)
    delayed: bool = False  # `after_seconds`: the reaper dispatches the run once it is due

    @property
    def creates(self) -> bool:
        """Whether a run row is created."""
        return self.outcome is not AdmissionOutcome.REJECTED

    @property
    def requests(self) -> list[Inflight]:
        """The cancelled runs that are asked to stop rather than ended at once (R5)."""
        return [v for v in self.cancel if cancel_outcome(v, self.action) is CancelOutcome.REQUESTED]

    @property
    def dispatch_now(self) -> bool:
        """Whether the new run is the head of its thread's queue right away.

        So it is when nothing was inflight, or when every cancelled run was ended at once; a
        run asked to stop dispatches the new one when it ends. A delayed run never is: it
        waits for its due time whatever else the thread holds.
        """
        if self.delayed or not self.creates:
            return False
        if self.outcome is AdmissionOutcome.DISPATCH:
            return True
        cancels = self.outcome in (AdmissionOutcome.INTERRUPT, AdmissionOutcome.ROLLBACK)
        return cancels and not self.requests


def decide(
    strategy: MultitaskStrategy, inflight: list[Inflight], *, delayed: bool = False
) -> AdmissionDecision:
    """Decide admission (R3): what happens to the new run and to the inflight ones."""
    if not inflight:
        return AdmissionDecision(AdmissionOutcome.DISPATCH, delayed=delayed)
    strategy = MultitaskStrategy(strategy)  # ValueError for a strategy the schema let through
    if strategy is MultitaskStrategy.REJECT:
        return AdmissionDecision(AdmissionOutcome.REJECTED)
    if strategy is MultitaskStrategy.ENQUEUE:
        return AdmissionDecision(AdmissionOutcome.QUEUED, delayed=delayed)
    outcome, action = (
        (AdmissionOutcome.ROLLBACK, CancelAction.ROLLBACK)
        if strategy is MultitaskStrategy.ROLLBACK
        else (AdmissionOutcome.INTERRUPT, CancelAction.INTERRUPT)
    )
    return AdmissionDecision(outcome, action, list(inflight), delayed=delayed)
