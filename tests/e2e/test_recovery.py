"""Recovery without the broker (R4, L2-L5): lost dispatches, a killed owner, a frozen owner.

A private cluster with short leases (TTL 3 s, renewed every 1 s), a fast reaper and a 1 s
shutdown grace (R7), two runs workers, and one web process.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

from shared.db import make_pool
from shared.redis_keys import Keys
from shared.runs.model import TERMINAL_STATUSES, MultitaskStrategy, RunRequest
from shared.runs.store import RunStore
from shared.tools.testing import Cluster, read_stream, wait_for
from tests.e2e.conftest import ALICE, FAST_LEASES, ClusterFactory

pytestmark = pytest.mark.e2e

FAST = {**FAST_LEASES, "THREADRUN_SHUTDOWN_GRACE_S": "1"}


@pytest.fixture(scope="module")
def fast(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """Web + two workers with short leases on their own database and Redis prefix."""
    with private_cluster("recovery", FAST) as c:
        c.side_by_side(c.start_web, lambda: c.start_worker("w1"), lambda: c.start_worker("w2"))
        yield c


@pytest.fixture(scope="module")
def store(fast: Cluster) -> Iterator[RunStore]:
    pool = make_pool(fast.settings, name="test-recovery", max_size=2)
    yield RunStore(pool)
    pool.close()


def api(c: Cluster) -> httpx.Client:
    return httpx.Client(base_url=c.url, headers={"x-api-key": ALICE}, timeout=30)


def slow_run(client: httpx.Client, tid: str, tokens: int = 120, delay_ms: int = 25) -> str:
    body = {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": "recover me"}]},
        "stream_mode": ["messages-tuple", "values"],
        "config": {"configurable": {"tokens": tokens, "token_delay_ms": delay_ms}},
    }
    return str(client.post(f"/threads/{tid}/runs", json=body).json()["run_id"])


def wait_published(c: Cluster, run_id: str, n: int = 3) -> None:
    """Wait until the first attempt has published `n` events (its metadata among them)."""
    client = redis.Redis.from_url(c.settings.redis_url)
    try:
        key = Keys(c.settings.redis_prefix).stream(run_id)
        wait_for(lambda: client.xlen(key) >= n, 20, what="the first events")
    finally:
        client.close()


def owner_pid(store: RunStore, run_id: str) -> int:
    run = store.get_run_by_id(run_id)
    assert run is not None and run.owner
    return int(run.owner.split(":")[1])


def test_r4_lost_dispatch_is_redispatched_by_the_reaper(fast: Cluster, store: RunStore) -> None:
    """R4: a committed pending run whose message never reached the broker still runs."""
    with api(fast) as client:
        tid = client.post("/threads", json={}).json()["thread_id"]
    run_id = str(uuid.uuid4())
    request = RunRequest(
        thread_id=tid,
        assistant_id="lead_agent",
        input={"messages": [{"role": "user", "content": "no message was sent"}]},
        config={"configurable": {"tokens": 5}},
    )
    adm = store.admit(
        request,
        run_id=run_id,
        owner="alice",
        graph_id="lead_agent",
        strategy=MultitaskStrategy.ENQUEUE,
    )
    assert adm.dispatch == [run_id]  # we deliberately do not send it
    status = wait_for(
        lambda: (store.run_status(run_id) in TERMINAL_STATUSES) and store.run_status(run_id),
        20,
        what="the reaper to dispatch the run",
    )
    assert status == "success"


def test_l4_l5_killed_owner_run_resumes_on_another_worker(fast: Cluster, store: RunStore) -> None:
    """L4/L5: kill -9 the owner mid-run: the run finishes elsewhere with attempt 2, one terminal status."""
    with api(fast) as client:
        tid = client.post("/threads", json={}).json()["thread_id"]
        run_id = slow_run(client, tid)
        wait_for(lambda: store.run_status(run_id) == "running", 15, what="the run to start")
        wait_published(fast, run_id)
        pid = owner_pid(store, run_id)
        victim = fast.process(pid)
        t_kill = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        victim.popen.wait(timeout=10)
        wait_for(
            lambda: store.run_status(run_id) in TERMINAL_STATUSES,
            60,
            what="the run to finish on the other worker",
        )
        recovered_s = time.monotonic() - t_kill
        row = client.get(f"/threads/{tid}/runs/{run_id}").json()
        assert row["status"] == "success" and row["attempt"] == 2, row
        events = read_stream(client, tid, run_id)
        metas = [e for e in events if e.event == "metadata"]
        assert [m.text.count('"attempt":') for m in metas] == [1, 1]
        assert '"attempt":1' in metas[0].text and '"attempt":2' in metas[1].text
        ids = [tuple(map(int, e.id.split("-"))) for e in events]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)  # B2 across attempts
        assert [e.event for e in events].count("end") == 1
        state = client.get(f"/threads/{tid}/state").json()
        assert [m["type"] for m in state["values"]["messages"]] == ["human", "ai"]
        kinds = [e["type"] for e in store.run_events(run_id) if e["category"] == "lifecycle"]
        assert (
            kinds.count("claimed") == 2 and kinds.count("requeued") == 1 and kinds[-1] == "success"
        )
        # J2: a later attempt's run record sums the usage of every attempt's model calls
        ends = [e for e in store.run_events(run_id) if e["type"] == "model.end"]
        assert ends and row["usage"]["total"]["total_tokens"] == sum(
            e["payload"]["usage"]["total_tokens"] for e in ends
        )
        assert recovered_s < 30
    fast.start_worker("w3")  # keep two workers for the next test


def test_l2_frozen_owner_is_fenced_when_it_wakes(fast: Cluster, store: RunStore) -> None:
    """L2: SIGSTOP the owner past its lease; another worker takes over; on SIGCONT the stale
    worker's events and terminal write are rejected: one outcome, one `end`."""
    with api(fast) as client:
        tid = client.post("/threads", json={}).json()["thread_id"]
        run_id = slow_run(client, tid, tokens=200, delay_ms=20)
        wait_for(lambda: store.run_status(run_id) == "running", 15, what="the run to start")
        wait_published(fast, run_id)
        pid = owner_pid(store, run_id)
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(
                lambda: getattr(store.get_run_by_id(run_id), "attempt", None) == 2,
                30,
                what="a second attempt",
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(
            lambda: store.run_status(run_id) in TERMINAL_STATUSES, 60, what="the run to finish"
        )
        time.sleep(1.5)  # give the stale worker time to try its writes
        row = client.get(f"/threads/{tid}/runs/{run_id}").json()
        assert row["status"] == "success" and row["attempt"] == 2
        events = read_stream(client, tid, run_id)
        assert [e.event for e in events].count("end") == 1
        # Nothing from epoch 1 after epoch 2's metadata: the stale publisher was fenced.
        metas = [i for i, e in enumerate(events) if e.event == "metadata"]
        assert len(metas) == 2
        kinds = [e["type"] for e in store.run_events(run_id) if e["category"] == "lifecycle"]
        assert kinds.count("success") == 1
        assert owner_pid(store, run_id) != pid


def test_l2_lease_forgotten_by_redis_while_the_owner_lives_has_one_outcome(
    fast: Cluster, store: RunStore
) -> None:
    """L2, L4: Redis forgets a live owner's lease (a failover promoted a replica that never
    saw it); the reaper lets another attempt claim with a higher epoch while the first owner
    still runs. The Postgres epoch fences the first owner's checkpoints, receipt and status:
    one terminal status, one receipt (the new attempt's), one `end`."""
    rclient = redis.Redis.from_url(fast.settings.redis_url)
    with api(fast) as client:
        tid = client.post("/threads", json={}).json()["thread_id"]
        run_id = slow_run(client, tid, tokens=200, delay_ms=20)
        wait_for(lambda: store.run_status(run_id) == "running", 15, what="the run to start")
        wait_published(fast, run_id)
        pid = owner_pid(store, run_id)
        assert rclient.delete(Keys(fast.settings.redis_prefix).lease(run_id)) == 1
        wait_for(
            lambda: getattr(store.get_run_by_id(run_id), "attempt", None) == 2,
            30,
            what="a second attempt",
        )
        wait_for(
            lambda: store.run_status(run_id) in TERMINAL_STATUSES, 60, what="the run to finish"
        )
        time.sleep(1.5)  # give the first owner time to try its writes
        assert os.path.exists(f"/proc/{pid}")  # the first owner lived through it
        row = client.get(f"/threads/{tid}/runs/{run_id}").json()
        assert row["status"] == "success" and row["attempt"] == 2
        journal = store.run_events(run_id)
        kinds = [e["type"] for e in journal if e["category"] == "lifecycle"]
        assert sum(k in {"success", "error", "timeout", "interrupted"} for k in kinds) == 1
        receipts = [e for e in journal if e["category"] == "delivery"]
        assert [r["payload"]["attempt"] for r in receipts] == [2]
        events = read_stream(client, tid, run_id)
        assert [e.event for e in events].count("end") == 1
        metas = [i for i, e in enumerate(events) if e.event == "metadata"]
        assert len(metas) == 2
    rclient.close()


def test_l3_duplicate_delivery_runs_once(fast: Cluster, store: RunStore) -> None:
    """L3: the same run task delivered twice more (to any worker) starts one executor."""
    from shared.runs.taskqueue import Dispatcher

    dispatcher = Dispatcher.of(fast.settings)
    with api(fast) as client:
        tid = client.post("/threads", json={}).json()["thread_id"]
        run_id = slow_run(client, tid, tokens=30, delay_ms=10)
        dispatcher.dispatch_run(run_id)  # queued again: a slot takes it from the run queue
        dispatcher.dispatch_later(run_id, 0)  # a message naming it
        wait_for(
            lambda: store.run_status(run_id) in TERMINAL_STATUSES, 30, what="the run to finish"
        )
        time.sleep(0.5)
        kinds = [e["type"] for e in store.run_events(run_id) if e["category"] == "lifecycle"]
        assert kinds == ["created", "claimed", "success"]
        row = client.get(f"/threads/{tid}/runs/{run_id}").json()
        assert row["attempt"] == 1 and row["status"] == "success"
        assert [e.event for e in read_stream(client, tid, run_id)].count("metadata") == 1


def test_r7_sigterm_hands_the_run_over(fast: Cluster, store: RunStore) -> None:
    """R7: a worker told to stop mid-run gives the run back; another worker resumes and finishes it."""
    with api(fast) as client:
        tid = client.post("/threads", json={}).json()["thread_id"]
        run_id = slow_run(client, tid, tokens=200, delay_ms=25)  # ~5 s: longer than the 1 s grace
        wait_for(lambda: store.run_status(run_id) == "running", 15, what="the run to start")
        time.sleep(0.5)
        pid = owner_pid(store, run_id)
        victim = fast.process(pid)
        os.kill(pid, signal.SIGTERM)
        victim.popen.wait(timeout=30)
        wait_for(
            lambda: store.run_status(run_id) in TERMINAL_STATUSES,
            60,
            what="the run to finish elsewhere",
        )
        row = client.get(f"/threads/{tid}/runs/{run_id}").json()
        assert row["status"] == "success" and row["attempt"] == 2
        events = [e for e in store.run_events(run_id) if e["category"] == "lifecycle"]
        requeued = [e for e in events if e["type"] == "requeued"]
        assert len(requeued) == 1 and requeued[0]["payload"]["reason"] == "worker shutdown"
        assert owner_pid(store, run_id) != pid
    fast.start_worker("w4")
