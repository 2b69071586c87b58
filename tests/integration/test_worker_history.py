"""H2: worker losses kept once per worker, bounded; finished-run counts per worker process
(shared/ops/worker_history.py and its Lua steps, on the real Redis)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from shared import redis_clients
from shared.ops.worker_history import (
    LEASES_EXPIRED,
    NOT_ANSWERING,
    AsyncWorkerHistory,
    WorkerHistory,
)
from shared.runs.model import RunStatus
from shared.runs.store import RunStore
from shared.settings import Settings
from tests.integration.test_runs_store import OWNER, admitted, claimed, new_thread
from workers.attempts import attempt_cause, reaped_error


@pytest.fixture
def history(settings: Settings, rclient: redis.Redis) -> Iterator[WorkerHistory]:
    own = settings.model_copy(
        update={"redis_prefix": f"{settings.redis_prefix}{uuid.uuid4().hex[:8]}:"}
    )
    yield WorkerHistory(own, rclient)
    for key in rclient.scan_iter(f"{own.redis_prefix}*"):
        rclient.delete(key)


def test_h2_a_lost_worker_is_recorded_once_by_many_concurrent_recorders(
    history: WorkerHistory,
) -> None:
    """H2: 16 threads (web processes, reapers) record the same loss at once, each with the
    runs it saw: exactly one is the first, one event holds the union of their runs."""
    start = threading.Barrier(16)
    firsts: list[bool] = []

    def record(i: int) -> None:
        start.wait()
        how = NOT_ANSWERING if i % 2 else LEASES_EXPIRED
        firsts.append(history.record_loss("h1:42:abc123", [f"r{i % 5}", "r-all"], how))

    threads = [threading.Thread(target=record, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(firsts) == [False] * 15 + [True]
    [event] = history.losses()
    assert event["worker"] == "h1:42:abc123" and (event["host"], event["pid"]) == ("h1", "42")
    assert sorted(event["runs"]) == ["r-all", "r0", "r1", "r2", "r3", "r4"]
    assert event["how"] in (NOT_ANSWERING, LEASES_EXPIRED)


def test_h2_losses_are_bounded_by_count_and_listed_latest_first(
    history: WorkerHistory,
) -> None:
    """H2: beyond `ops_worker_losses_max` the oldest events go; the list is latest first."""
    small = WorkerHistory(
        history.settings.model_copy(update={"ops_worker_losses_max": 3}), history.redis
    )
    for i in range(5):
        assert small.record_loss(f"h:{i}:n", [f"run{i}"], NOT_ANSWERING, name=f"w{i}@h")
        time.sleep(0.01)  # distinct scores
    assert [e["name"] for e in small.losses()] == ["w4@h", "w3@h", "w2@h"]
    assert len(small.redis.hkeys(small.keys.ops_worker_loss_events())) == 3


def test_h2_losses_older_than_the_retention_are_dropped(history: WorkerHistory) -> None:
    """H2: an event older than `ops_worker_history_s` is neither listed nor kept."""
    brief = WorkerHistory(
        history.settings.model_copy(update={"ops_worker_history_s": 0.2}), history.redis
    )
    brief.record_loss("h:1:old", ["a"], NOT_ANSWERING)
    time.sleep(0.3)
    assert brief.losses() == []
    brief.record_loss("h:2:new", ["b"], NOT_ANSWERING)  # the next record trims the old one
    assert [e["worker"] for e in brief.losses()] == ["h:2:new"]
    assert brief.redis.hkeys(brief.keys.ops_worker_loss_events()) == [b"h:2:new"]


def test_h2_finished_runs_are_counted_per_worker_process_and_restart_with_a_new_one(
    history: WorkerHistory, settings: Settings
) -> None:
    """H2: counts per terminal status of one worker process (host, pid); a new process that
    reuses the pid starts from zero."""
    s = history.settings

    async def count(pairs: list[tuple[str, str]]) -> None:
        client = redis_clients.async_client(s)
        try:
            workers = AsyncWorkerHistory(s, client)
            for worker, status in pairs:
                await workers.count_finished(worker, status)
        finally:
            await client.aclose()

    asyncio.run(
        count(
            [("h:7:one", "success")] * 3
            + [("h:7:one", "error"), ("h:7:one", "interrupted"), ("h:8:two", "timeout")]
            + [("h:8:two", "pending"), ("not-a-worker", "success")]  # neither is counted
        )
    )
    one, two, none = history.finished([("h", "7"), ("h", "8"), ("h", "9")])
    assert one == {"success": 3, "error": 1, "timeout": 0, "interrupted": 1}
    assert two == {"success": 0, "error": 0, "timeout": 1, "interrupted": 0}
    assert none == {"success": 0, "error": 0, "timeout": 0, "interrupted": 0}
    asyncio.run(count([("h:7:again", "success")]))  # pid 7 reused by a new process
    assert history.finished([("h", "7")]) == [
        {"success": 1, "error": 0, "timeout": 0, "interrupted": 0}
    ]


def test_h2_an_attempts_recorded_cause_is_what_the_reaper_ends_the_run_with(
    store: RunStore,
) -> None:
    """H2, L5: the cause attempt 1 recorded is found for attempt 1 only (not for a later
    attempt), and the reaper's fenced end of the run carries it as the run's error."""
    tid = new_thread(store)
    run_id = admitted(store, tid)
    run = claimed(store, run_id, "h:1:dead")
    cause = attempt_cause(
        {"error": "GraphNotFound", "message": "no graph or assistant 'g' is registered"},
        permanent=True,
    )
    store.record_attempt_failure(run_id, tid, run.attempt, run.owner_epoch, cause)
    assert store.attempt_cause(run_id, 2) is None
    found = store.attempt_cause(run_id, 1)
    assert found is not None and found["error"] == "GraphNotFound" and found["permanent"]
    error = reaped_error(attempt=1, max_attempts=3, owner="h:1:dead", cause=found)
    [reaped] = [r for r in store.running_runs(0) if r.run_id == run_id]
    assert reaped.owner == "h:1:dead"
    expired = store.fail_expired(run_id, run.owner_epoch, "reaper", "lease expired", error=error)
    assert expired is not None and expired.error == error
    ended = store.get_run(tid, run_id, OWNER)
    assert ended.status is RunStatus.ERROR and ended.error == error
    assert ended.error["error"] == "GraphNotFound"
