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


@dataclass(frozen=True, slots=True)
class Inflight:
    """A pending or running run of the thread, in FIFO order."""

    run_id: str
    status: str


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
    """Decide admission. `rollback` is refused before this point (not yet supported)."""
    if not inflight:
        return AdmissionDecision(AdmissionOutcome.DISPATCH)
    if strategy == "reject":
        return AdmissionDecision(AdmissionOutcome.REJECTED)
    if strategy == "enqueue":
        return AdmissionDecision(AdmissionOutcome.QUEUED)
    if strategy == "interrupt":
        return AdmissionDecision(AdmissionOutcome.INTERRUPT, cancel=list(inflight))
    raise ValueError(f"unknown multitask_strategy {strategy!r}")
