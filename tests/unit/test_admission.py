"""R2/R3: the pure admission decision."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.runs.admission import AdmissionOutcome, Inflight, decide

STRATEGIES = ["reject", "interrupt", "rollback", "enqueue"]
inflight_lists = st.lists(
    st.builds(
        Inflight,
        run_id=st.uuids().map(str),
        status=st.sampled_from(["pending", "running"]),
        attempt=st.integers(0, 3),
    ),
    max_size=5,
)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_r3_no_inflight_dispatches_now(strategy: str) -> None:
    """R3: with nothing inflight every strategy creates and dispatches at once."""
    decision = decide(strategy, [])
    assert decision.outcome is AdmissionOutcome.DISPATCH
    assert decision.creates and decision.dispatch_now and decision.cancel == []


def test_r3_reject_creates_nothing() -> None:
    """R3: reject on a busy thread creates nothing."""
    decision = decide("reject", [Inflight("a", "running")])
    assert decision.outcome is AdmissionOutcome.REJECTED
    assert not decision.creates


def test_r3_enqueue_queues_behind() -> None:
    """R3: enqueue creates a pending run that waits (FIFO), cancelling nothing."""
    decision = decide("enqueue", [Inflight("a", "running"), Inflight("b", "pending")])
    assert decision.outcome is AdmissionOutcome.QUEUED
    assert decision.creates and not decision.dispatch_now and decision.cancel == []


def test_r3_interrupt_cancels_every_inflight_run() -> None:
    """R3: interrupt cancels every inflight run, in order."""
    inflight = [Inflight("a", "running"), Inflight("b", "pending")]
    decision = decide("interrupt", inflight)
    assert decision.outcome is AdmissionOutcome.INTERRUPT
    assert decision.cancel == inflight


def test_r3_rollback_cancels_every_inflight_run() -> None:
    """R3: rollback cancels every inflight run; a run has progress to undo when it is
    running or when it already ran (a pending run requeued after a failure)."""
    inflight = [Inflight("a", "running", 1), Inflight("b", "pending"), Inflight("c", "pending", 2)]
    decision = decide("rollback", inflight)
    assert decision.outcome is AdmissionOutcome.ROLLBACK
    assert decision.cancel == inflight
    assert [v.has_progress for v in inflight] == [True, False, True]


def test_unknown_strategy_raises() -> None:
    """A strategy the schema should have refused is a programming error."""
    with pytest.raises(ValueError):
        decide("sometimes", [Inflight("a", "running")])


@given(strategy=st.sampled_from(STRATEGIES), inflight=inflight_lists)
def test_r2_decision_invariants(strategy: str, inflight: list[Inflight]) -> None:
    """R2/R3 invariants: only an empty thread dispatches at once; reject never creates on a busy one."""
    decision = decide(strategy, inflight)
    assert decision.dispatch_now == (not inflight)
    if inflight and strategy == "reject":
        assert not decision.creates
    if strategy in ("interrupt", "rollback"):
        assert decision.cancel == inflight
    else:
        assert decision.cancel == []
