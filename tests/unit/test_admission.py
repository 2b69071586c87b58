"""R2/R3: the pure admission decision."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.runs.admission import AdmissionOutcome, Inflight, decide
from shared.runs.model import CancelAction, MultitaskStrategy, RunStatus

PENDING, RUNNING = RunStatus.PENDING, RunStatus.RUNNING
STRATEGIES = list(MultitaskStrategy)
inflight_lists = st.lists(
    st.builds(
        Inflight,
        run_id=st.uuids().map(str),
        status=st.sampled_from([PENDING, RUNNING]),
        attempt=st.integers(0, 3),
    ),
    max_size=5,
)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_r3_no_inflight_dispatches_now(strategy: MultitaskStrategy) -> None:
    """R3: with nothing inflight every strategy creates and dispatches at once."""
    decision = decide(strategy, [])
    assert decision.outcome is AdmissionOutcome.DISPATCH
    assert decision.creates and decision.dispatch_now and decision.cancel == []


def test_r3_strategy_strings_are_accepted() -> None:
    """The decision takes the plain strings stored in SQL as well as the enum."""
    decision = decide("enqueue", [Inflight("a", RUNNING)])  # type: ignore[arg-type]
    assert decision.outcome is AdmissionOutcome.QUEUED


def test_r3_reject_creates_nothing() -> None:
    """R3: reject on a busy thread creates nothing."""
    decision = decide(MultitaskStrategy.REJECT, [Inflight("a", RUNNING)])
    assert decision.outcome is AdmissionOutcome.REJECTED
    assert not decision.creates


def test_r3_enqueue_queues_behind() -> None:
    """R3: enqueue creates a pending run that waits (FIFO), cancelling nothing."""
    decision = decide(MultitaskStrategy.ENQUEUE, [Inflight("a", RUNNING), Inflight("b", PENDING)])
    assert decision.outcome is AdmissionOutcome.QUEUED
    assert decision.creates and not decision.dispatch_now and decision.cancel == []


def test_r3_interrupt_cancels_every_inflight_run() -> None:
    """R3: interrupt cancels every inflight run, in order."""
    inflight = [Inflight("a", RUNNING), Inflight("b", PENDING)]
    decision = decide(MultitaskStrategy.INTERRUPT, inflight)
    assert decision.outcome is AdmissionOutcome.INTERRUPT
    assert decision.action is CancelAction.INTERRUPT
    assert decision.cancel == inflight


def test_r3_rollback_cancels_every_inflight_run() -> None:
    """R3: rollback cancels every inflight run; a run has progress to undo when it is
    running or when it already ran (a pending run requeued after a failure)."""
    inflight = [Inflight("a", RUNNING, 1), Inflight("b", PENDING), Inflight("c", PENDING, 2)]
    decision = decide(MultitaskStrategy.ROLLBACK, inflight)
    assert decision.outcome is AdmissionOutcome.ROLLBACK
    assert decision.action is CancelAction.ROLLBACK
    assert decision.cancel == inflight
    assert [v.has_progress for v in inflight] == [True, False, True]


def test_r3_interrupt_of_pending_only_dispatches_now() -> None:
    """R3, R5: when every cancelled run is pending, interrupt ends them all at once and the new
    run dispatches now; a running victim (or, for rollback, a pending one that already ran)
    is asked to stop instead, and the new run waits for it."""
    pending = [Inflight("a", PENDING), Inflight("b", PENDING, 2)]
    decision = decide(MultitaskStrategy.INTERRUPT, pending)
    assert decision.outcome is AdmissionOutcome.INTERRUPT and decision.cancel == pending
    assert decision.requests == [] and decision.dispatch_now
    # Rollback of a pending run that already ran must undo its progress first.
    decision = decide(MultitaskStrategy.ROLLBACK, pending)
    assert decision.requests == [pending[1]] and not decision.dispatch_now
    decision = decide(MultitaskStrategy.ROLLBACK, [Inflight("a", PENDING), Inflight("b", PENDING)])
    assert decision.requests == [] and decision.dispatch_now
    # A running victim stops at its next safe point; the new run waits for it.
    running = [Inflight("a", RUNNING), Inflight("b", PENDING)]
    for strategy in (MultitaskStrategy.INTERRUPT, MultitaskStrategy.ROLLBACK):
        decision = decide(strategy, running)
        assert decision.requests == [running[0]] and not decision.dispatch_now


def test_unknown_strategy_raises() -> None:
    """A strategy the schema should have refused is a programming error."""
    with pytest.raises(ValueError):
        decide("sometimes", [Inflight("a", RUNNING)])  # type: ignore[arg-type]


def _needs_stop_request(strategy: MultitaskStrategy, victim: Inflight) -> bool:
    """R5, written out: only a pending run without progress (any pending run, for interrupt)
    can be ended at once; every other cancelled run must be asked to stop."""
    if strategy is MultitaskStrategy.ROLLBACK:
        return not (victim.status == "pending" and victim.attempt == 0)
    return victim.status != "pending"


@given(strategy=st.sampled_from(STRATEGIES), inflight=inflight_lists)
def test_r2_decision_invariants(strategy: MultitaskStrategy, inflight: list[Inflight]) -> None:
    """R2/R3 invariants: the new run dispatches at once only on an empty thread, or when
    interrupt/rollback ended every inflight run at once; reject never creates on a busy one."""
    decision = decide(strategy, inflight)
    cancels = strategy in (MultitaskStrategy.INTERRUPT, MultitaskStrategy.ROLLBACK)
    ended_at_once = not any(_needs_stop_request(strategy, v) for v in inflight)
    assert decision.dispatch_now == ((not inflight) or (cancels and ended_at_once))
    if inflight and strategy == "reject":
        assert not decision.creates
    if cancels:
        assert decision.cancel == inflight
        assert decision.requests == [v for v in inflight if _needs_stop_request(strategy, v)]
    else:
        assert decision.cancel == []


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_r3_a_delayed_run_is_never_dispatched_at_admission(strategy: str) -> None:
    """R3, R4: a delayed run (`after_seconds`) waits for the reaper whatever the thread
    holds; the inflight runs are still treated as the strategy says."""
    assert not decide(strategy, [], delayed=True).dispatch_now
    pending = [Inflight("a", RunStatus.PENDING)]
    decision = decide(strategy, pending, delayed=True)
    assert not decision.dispatch_now
    if strategy in ("interrupt", "rollback"):
        assert decision.cancel == pending
