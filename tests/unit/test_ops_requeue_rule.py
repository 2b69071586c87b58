"""The requeue rule the ops action applies and the ops page shows (shared/ops/actions.py).

R4: a pending run is stuck only when it is its thread's head, due, and was never
dispatched; L4: a running run only when its lease is gone and it has been idle a lease TTL.
A run waiting its turn behind another run of its thread (R3 enqueue) is never offered.
"""

from __future__ import annotations

import pytest

from shared.ops.actions import REQUEUE_WHY, RequeueOutcome, requeue_verdict

TTL = 15.0


def verdict(**kw: object) -> RequeueOutcome:
    state: dict[str, object] = {
        "status": "pending",
        "lease_held": False,
        "idle_s": 0.0,
        "dispatched": False,
        "behind": False,
        "due": True,
        "lease_ttl_s": TTL,
    }
    state.update(kw)
    return requeue_verdict(**state)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "outcome"),
    [
        ({}, RequeueOutcome.DISPATCHED),
        ({"behind": True}, RequeueOutcome.QUEUED_BEHIND),
        ({"behind": True, "dispatched": True}, RequeueOutcome.QUEUED_BEHIND),
        ({"due": False}, RequeueOutcome.NOT_DUE),
        ({"dispatched": True}, RequeueOutcome.ALREADY_DISPATCHED),
        ({"status": "running", "lease_held": True, "idle_s": 99.0}, RequeueOutcome.LEASE_HELD),
        ({"status": "running", "idle_s": TTL - 1}, RequeueOutcome.RECENTLY_ACTIVE),
        ({"status": "running", "idle_s": TTL}, RequeueOutcome.REQUEUED),
        ({"status": "success"}, RequeueOutcome.NOT_INFLIGHT),
        ({"status": "error", "lease_held": True}, RequeueOutcome.NOT_INFLIGHT),
    ],
)
def test_r4_l4_requeue_offered_only_to_stuck_runs(
    state: dict[str, object], outcome: RequeueOutcome
) -> None:
    """R4/L4: the verdict for each state; only an undispatched due head or an expired,
    idle running run would be acted on (`done`)."""
    got = verdict(**state)
    assert got is outcome
    assert got.done == (outcome in (RequeueOutcome.DISPATCHED, RequeueOutcome.REQUEUED))


def test_r3_every_refusal_the_page_can_show_has_a_sentence() -> None:
    """R3: the reasons the runs listing gives (e.g. a run queued behind another) are words,
    not codes, for every verdict the rule can return."""
    for outcome in RequeueOutcome:
        if outcome in (RequeueOutcome.RACED, RequeueOutcome.LOCKED):
            continue  # outcomes of the action only, never of the rule
        assert REQUEUE_WHY[outcome][0].islower() and " " in REQUEUE_WHY[outcome]
