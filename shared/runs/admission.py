"""The pure admission decision (R2, R3): given a strategy and the thread's inflight runs."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class AdmissionOutcome(enum.Enum):
    """What admitting a new run does; maps one-to-one to an HTTP status and a log line."""

    DISPATCH = "dispatch"  # no inflight run: create and dispatch now
    QUEUED = "queued"  # enqueue: create pending behind the inflight runs (FIFO)
    REJECTED = "rejected"  # reject: nothing created (409)
    INTERRUPT = "interrupt"  # cancel the inflight runs (keep progress), then run
    ROLLBACK = "rollback"  # cancel the inflight runs, restore the pre-run state, then run


@dataclass(frozen=True, slots=True)
class Inflight:
    """A pending or running run of the thread, in FIFO order."""

    run_id: str
    status: str
    attempt: int = 0  # > 0 for a pending run that already ran (requeued after a failure)

    @property
    def has_progress(self) -> bool:
        """Whether the run may have written checkpoints (running, or ran before)."""
        return self.status == "running" or self.attempt > 0


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """The outcome and the runs it cancels."""

    outcome: AdmissionOutcome
    cancel: list[Inflight] = field(default_factory=list)

    @property
    def creates(self) -> bool:
        """Whether a run row is created."""
        return self.outcome is not AdmissionOutcome.REJECTED

    @property
    def dispatch_now(self) -> bool:
        """Whether the new run is the head of its thread's queue right away."""
        return self.outcome is AdmissionOutcome.DISPATCH


def decide(strategy: str, inflight: list[Inflight]) -> AdmissionDecision:
    """Decide admission (R3): what happens to the new run and to the inflight ones."""
    if not inflight:
        return AdmissionDecision(AdmissionOutcome.DISPATCH)
    if strategy == "reject":
        return AdmissionDecision(AdmissionOutcome.REJECTED)
    if strategy == "enqueue":
        return AdmissionDecision(AdmissionOutcome.QUEUED)
    if strategy == "interrupt":
        return AdmissionDecision(AdmissionOutcome.INTERRUPT, cancel=list(inflight))
    if strategy == "rollback":
        return AdmissionDecision(AdmissionOutcome.ROLLBACK, cancel=list(inflight))
    raise ValueError(f"unknown multitask_strategy {strategy!r}")
