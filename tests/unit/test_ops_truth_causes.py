"""H2: a run ends with its last attempt's cause; worker losses name the runs they held."""

from __future__ import annotations

from shared.agent.graphs import GraphConfigError, GraphNotFound
from shared.ops.collector import lost_owners, renewal_missed
from shared.ops.worker_history import (
    NOT_ANSWERING,
    loss_event,
    parse_finished,
    parse_losses,
    process_of,
)
from workers.attempts import PERMANENT_ERRORS, attempt_cause, reaped_error

GONE = {"error": "GraphNotFound", "message": "no graph or assistant 'g' is registered"}


def test_h2_an_unserved_or_unloadable_graph_is_a_permanent_failure() -> None:
    """H2: no other attempt gets past a graph that is not served or cannot be loaded."""
    assert issubclass(GraphNotFound, PERMANENT_ERRORS)
    assert issubclass(GraphConfigError, PERMANENT_ERRORS)
    assert not issubclass(KeyError, PERMANENT_ERRORS)


def test_h2_a_permanent_cause_ends_the_run_with_that_error_as_it_is() -> None:
    """H2: the reaper's error of a run whose attempt recorded a permanent cause is that
    cause (type and message), whatever the attempt count."""
    cause = attempt_cause(GONE, permanent=True)
    assert cause == {**GONE, "permanent": True}
    for attempt in (1, 3):
        got = reaped_error(attempt=attempt, max_attempts=3, owner="h:1:x", cause=cause)
        assert got == GONE


def test_h2_exhausted_attempts_name_the_last_attempts_cause() -> None:
    """H2: after the last attempt, MaxAttemptsExceeded carries the cause the attempt
    recorded (a model error's class and message) instead of a bare lease expiry."""
    model = {"error": "ModelCallError", "message": "the model answered HTTP 500"}
    got = reaped_error(
        attempt=3, max_attempts=3, owner="h:1:x", cause=attempt_cause(model, permanent=False)
    )
    assert got["error"] == "MaxAttemptsExceeded"
    assert (
        "attempt 3 of 3 failed with ModelCallError: the model answered HTTP 500" in (got["message"])
    )
    assert got["cause"]["error"] == "ModelCallError"


def test_h2_exhausted_attempts_without_a_cause_name_the_lost_worker() -> None:
    """H2, L5: a killed owner records nothing; the error names the worker that held the
    last attempt."""
    got = reaped_error(attempt=2, max_attempts=2, owner="h:9:abc", cause=None)
    assert got["error"] == "MaxAttemptsExceeded"
    assert "owner lease expired after attempt 2 of 2" in got["message"]
    assert "worker h:9:abc" in got["message"]


def test_h2_lost_owners_group_the_orphaned_runs_by_owner() -> None:
    """H2: only orphaned rows with an owner that also stopped renewing their leases make a
    loss (a worker too busy to answer the broadcast still renews); each owner lists its
    runs."""
    missed = {"orphaned": True, "renewal_missed": True}
    rows = [
        {"run_id": "a", "owner": "h:1:x", **missed},
        {"run_id": "b", "owner": "h:1:x", **missed},
        {"run_id": "c", "owner": "h:2:y", "orphaned": False, "renewal_missed": False},
        {"run_id": "d", "owner": None, **missed},
        {"run_id": "e", "owner": "h:3:z", **missed},
        {"run_id": "f", "owner": "h:4:busy", "orphaned": True, "renewal_missed": False},
    ]
    assert lost_owners(rows) == {"h:1:x": ["a", "b"], "h:3:z": ["e"]}


def test_h2_a_renewal_is_missed_once_a_period_and_the_slack_passed() -> None:
    """H2: TTL 15 s renewed every 5 s: 9.5 s left was renewed 5.5 s ago (in time); 8.5 s
    left, 6.5 s ago (missed); no lease at all is missed."""
    assert not renewal_missed(9.5, 15.0, 5.0)
    assert renewal_missed(8.5, 15.0, 5.0)
    assert renewal_missed(None, 15.0, 5.0)


def test_h2_a_loss_event_names_its_worker_and_runs() -> None:
    """H2: host and pid come from the worker id; runs are unique and sorted."""
    event = loss_event("h:7:abc", ["r2", "r1", "r2"], NOT_ANSWERING, name="w@h", at=5.0)
    assert event == {
        "at": 5.0,
        "worker": "h:7:abc",
        "host": "h",
        "pid": "7",
        "name": "w@h",
        "how": NOT_ANSWERING,
        "runs": ["r1", "r2"],
    }
    assert process_of("h:7:abc") == ("h", "7") and process_of("nohost") is None


def test_h2_stored_events_and_counts_parse_whatever_lua_made_of_them() -> None:
    """H2: a vanished event is skipped, an empty Lua table (`{}`) is no runs, absent
    statuses count zero."""
    raw = [None, b'{"worker": "h:1:x", "runs": {}}', b"not json", b'{"runs": ["a"]}']
    assert [e["runs"] for e in parse_losses(raw)] == [[], ["a"]]
    assert parse_finished({b"worker": b"h:1:x", b"success": b"4"}) == {
        "success": 4,
        "error": 0,
        "timeout": 0,
        "interrupted": 0,
    }
