"""H2 on the ops view: a killed worker's runs show as orphaned, and the health strip says so;
the worker's loss is kept as an event naming the runs it held; workers show their finished runs.

A private cluster with leases of 6 s (renewed every 1 s, so that an orphan stays on the page
long enough to be seen), a fast reaper, two runs workers (each test that kills one starts
another), one web process (the loss test adds a second) and an ops key.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared.db import make_pool
from shared.runs.model import TERMINAL_STATUSES
from shared.runs.store import RunStore
from shared.tools.testing import Cluster, read_stream, wait_for
from tests.e2e.conftest import ALICE, API_KEYS, FAST_LEASES, ClusterFactory
from tests.e2e.test_ops_page import OpsPage, browser
from workers.attempts import attempt_cause

__all__ = ["browser"]  # the module-scoped fixture of test_ops_page.py

pytestmark = pytest.mark.e2e

OPS = "key-ops"


@pytest.fixture(scope="module")
def truth(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """Web + two runs workers with short leases and an ops key."""
    env = {
        **FAST_LEASES,
        "THREADRUN_LEASE_TTL_S": "6",
        "THREADRUN_API_KEYS": f"{API_KEYS},{OPS}:ops-user:ops",
    }
    with private_cluster("opstruth", env) as c:
        c.side_by_side(c.start_web, lambda: c.start_worker("w1"), lambda: c.start_worker("w2"))
        yield c


@pytest.fixture(scope="module")
def store(truth: Cluster) -> Iterator[RunStore]:
    pool = make_pool(truth.settings, name="test-ops-truth", max_size=2)
    yield RunStore(pool)
    pool.close()


def slow_run(client: httpx.Client, tid: str) -> str:
    body = {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": "orphan me"}]},
        "config": {"configurable": {"tokens": 400, "token_delay_ms": 25}},
    }
    return str(client.post(f"/threads/{tid}/runs", json=body).json()["run_id"])


def kill_owner(truth: Cluster, store: RunStore, run_id: str) -> str:
    """kill -9 the run's owner once it runs; its `owner`."""
    wait_for(lambda: store.run_status(run_id) == "running", 15, what="the run to start")
    run = store.get_run_by_id(run_id)
    assert run is not None and run.owner
    pid = int(run.owner.split(":")[1])
    victim = truth.process(pid)
    os.kill(pid, signal.SIGKILL)
    victim.popen.wait(timeout=10)
    return run.owner


def test_h2_killed_owner_runs_show_orphaned_with_recovery_time(
    truth: Cluster, store: RunStore
) -> None:
    """H2: kill -9 the owner of a running run: within 2 s /ops/api/runs marks it orphaned
    with `recovers_in_s`, the health strip is not all clear, and once the reaper has moved
    it to the other worker it is orphaned no more."""
    user = httpx.Client(base_url=truth.url, headers={"x-api-key": ALICE}, timeout=30)
    ops = httpx.Client(base_url=truth.url, headers={"x-api-key": OPS}, timeout=30)
    with user, ops:
        tid = user.post("/threads", json={}).json()["thread_id"]
        run_id = slow_run(user, tid)
        owner = kill_owner(truth, store, run_id)

        def orphan() -> dict[str, Any] | None:
            rows = ops.get("/ops/api/runs").json()["runs"]
            return next((r for r in rows if r["run_id"] == run_id and r["orphaned"]), None)

        seen = wait_for(orphan, 2 + truth.settings.ops_inspect_cache_s, what="orphaned in ops")
        assert seen["owner"] == owner and seen["recovers_in_s"] is not None
        assert 0 < seen["recovers_in_s"] <= truth.settings.lease_ttl_s + 1
        health = ops.get("/ops/api/health").json()
        tile = next(t for t in health["tiles"] if t["key"] == "orphaned")
        assert not health["ok"] and tile["state"] == "bad" and owner in tile["reason"]

        def moved() -> bool:
            rows = ops.get("/ops/api/runs").json()["runs"]
            row = next((r for r in rows if r["run_id"] == run_id), None)
            return row is None or not row["orphaned"]

        wait_for(moved, 30, what="the reaper to hand the run to the live worker")
        wait_for(lambda: store.run_status(run_id) in TERMINAL_STATUSES, 60, what="the run end")
    truth.start_worker("w3")


def test_h2_ops_page_shows_the_orphan_and_the_red_tile(
    truth: Cluster, store: RunStore, browser: Any
) -> None:
    """H2 on the page: the orphaned run's lease cell says "orphaned … recovers in", the
    orphaned tile is red (screenshots at 1280x860 and 390x844)."""
    page = OpsPage(browser, truth)
    user = httpx.Client(base_url=truth.url, headers={"x-api-key": ALICE}, timeout=30)
    try:
        with user:
            tid = user.post("/threads", json={}).json()["thread_id"]
            run_id = slow_run(user, tid)
            kill_owner(truth, store, run_id)
            tile = page.wait_tile("orphaned", "bad", timeout_s=10)
            assert "no live worker" in tile.inner_text()
            row = page.row("runs", run_id)
            row.locator("td", has_text="orphaned").wait_for(timeout=5000)
            assert "recovers in" in row.inner_text()
            page.shot("orphaned")
            page.page.set_viewport_size({"width": 390, "height": 844})
            page.shot("orphaned-phone")
            assert not page.errors, page.errors
            wait_for(lambda: store.run_status(run_id) in TERMINAL_STATUSES, 60, what="run end")
    finally:
        page.close()
    truth.start_worker("w4")


@pytest.fixture
def replaced(truth: Cluster) -> Iterator[None]:
    """A new runs worker after the test (it kills one), whether it passed or not."""
    yield
    truth.start_worker(f"w-{uuid.uuid4().hex[:6]}")


def held_runs(store: RunStore, owner: str, run_ids: list[str]) -> list[str]:
    """Those of `run_ids` that `owner` holds (running, owned by it)."""
    out = []
    for rid in run_ids:
        run = store.get_run_by_id(rid)
        if run is not None and run.owner == owner and run.status == "running":
            out.append(rid)
    return out


def test_h2_a_killed_worker_is_kept_as_one_loss_event_naming_the_runs_it_held(
    truth: Cluster, store: RunStore, replaced: None
) -> None:
    """H2: kill -9 a worker holding runs: /ops/api/worker-losses keeps one event for it
    (time, worker, the runs it held), the same through a second web process however often
    both are asked and after the reaper also saw the loss; once the runs recovered the event
    remains, its runs' status is their end, and the survivors' finished counts include them."""
    web2 = truth.start_web()
    user = httpx.Client(base_url=truth.url, headers={"x-api-key": ALICE}, timeout=30)
    ops = httpx.Client(base_url=truth.url, headers={"x-api-key": OPS}, timeout=30)
    ops2 = httpx.Client(base_url=web2, headers={"x-api-key": OPS}, timeout=30)
    with user, ops, ops2:
        runs = [
            slow_run(user, user.post("/threads", json={}).json()["thread_id"]) for _ in range(4)
        ]
        for rid in runs:
            wait_for(lambda rid=rid: store.run_status(rid) == "running", 15, what="runs to start")
        assert ops.get("/ops/api/workers").status_code == 200  # the page was open: names known
        before = time.time()
        owner = kill_owner(truth, store, runs[0])
        held = held_runs(store, owner, runs)
        assert runs[0] in held

        def loss(client: httpx.Client) -> dict[str, Any] | None:
            got = client.get("/ops/api/worker-losses").json()["losses"]
            mine = [e for e in got if e["worker"] == owner]
            assert len(mine) <= 1, mine  # one event per lost worker, never two
            return mine[0] if mine else None

        event = wait_for(lambda: loss(ops), 2 + truth.settings.ops_inspect_cache_s, what="loss")
        assert event["at"] >= before and event["how"] == "not answering"
        host, pid, _ = owner.split(":")
        assert (event["host"], event["pid"]) == (host, pid)
        assert event["name"] and event["name"].endswith(f"@{host}")
        assert set(held) <= {r["run_id"] for r in event["runs"]}
        overview = ops.get("/ops/api/overview").json()
        assert owner in [e["worker"] for e in overview["worker_losses"]]

        for rid in runs:
            wait_for(lambda rid=rid: store.run_status(rid) in TERMINAL_STATUSES, 60, what="end")
        for client in (ops, ops2):  # the reaper saw the loss too: still one event
            after = loss(client)
            assert after is not None and after["at"] == event["at"]
            statuses = {r["run_id"]: r["status"] for r in after["runs"]}
            assert all(statuses[rid] == "success" for rid in held), statuses

        workers = ops.get("/ops/api/workers").json()["workers"]
        finished = {(w["host"], str(w["pid"])): w["finished"] for w in workers}
        for rid in held:  # each recovered run counts on the worker that finished it
            run = store.get_run_by_id(rid)
            assert run is not None and run.owner
            h, p, _ = run.owner.split(":")
            assert finished[(h, p)]["success"] >= 1, (run.owner, finished)


def test_h2_ops_page_lists_the_lost_worker_and_the_finished_counts(
    truth: Cluster, store: RunStore, browser: Any, replaced: None
) -> None:
    """H2 on the page: the Worker losses table has a row for the killed worker naming its
    run, which stays after the run recovered; the Workers table shows finished counts
    (screenshots at 1280x860 and 390x844)."""
    page = OpsPage(browser, truth)
    user = httpx.Client(base_url=truth.url, headers={"x-api-key": ALICE}, timeout=30)
    try:
        with user:
            tid = user.post("/threads", json={}).json()["thread_id"]
            run_id = slow_run(user, tid)
            owner = kill_owner(truth, store, run_id)
            row = page.page.locator(f'#losses tbody tr[data-key="{owner}"]')
            row.wait_for(timeout=10_000)
            assert run_id in row.locator("code.id").all_inner_texts()
            assert "not answering" in row.inner_text()
            wait_for(lambda: store.run_status(run_id) in TERMINAL_STATUSES, 60, what="run end")
            page.refreshed()
            row.locator(".pill.success").wait_for(timeout=10_000)  # its run, recovered
            cells = page.page.locator("#workers tbody tr td:nth-child(5)").all_inner_texts()
            counts = [c.replace("\xa0", " ") for c in cells]
            assert any(c.endswith("interrupted") and not c.startswith("0 success") for c in counts)
            page.shot("worker-loss", full=True)
            page.page.set_viewport_size({"width": 390, "height": 844})
            page.page.locator("#losses").scroll_into_view_if_needed()
            page.shot("worker-loss-phone")
            assert not page.errors, page.errors
    finally:
        page.close()


def test_h2_the_reaper_ends_a_run_with_its_attempts_permanent_cause_at_once(
    truth: Cluster, store: RunStore, replaced: None
) -> None:
    """H2, L5: an attempt that recorded a cause no retry gets past (as one whose graph
    vanished records `GraphNotFound` when it cannot end the run itself) and whose worker
    then dies is ended by the reaper with that cause, at once: never a second attempt."""
    user = httpx.Client(base_url=truth.url, headers={"x-api-key": ALICE}, timeout=30)
    with user:
        tid = user.post("/threads", json={}).json()["thread_id"]
        run_id = slow_run(user, tid)
        wait_for(lambda: store.run_status(run_id) == "running", 15, what="the run to start")
        run = store.get_run_by_id(run_id)
        assert run is not None
        cause = attempt_cause(
            {
                "error": "GraphNotFound",
                "message": "no graph or assistant 'lead_agent' is registered",
            },
            permanent=True,
        )
        store.record_attempt_failure(run_id, tid, run.attempt, run.owner_epoch, cause)
        kill_owner(truth, store, run_id)
        wait_for(lambda: store.run_status(run_id) in TERMINAL_STATUSES, 60, what="the run end")
        ended = user.get(f"/threads/{tid}/runs/{run_id}").json()
        assert ended["status"] == "error" and ended["attempt"] == 1, ended
        assert ended["error"]["error"] == "GraphNotFound", ended
        events = read_stream(user, tid, run_id, within=30)
        assert [e.data["error"] for e in events if e.event == "error"] == ["GraphNotFound"]
        assert events[-1].event == "end" and events[-1].data["status"] == "error"
