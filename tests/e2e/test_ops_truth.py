"""H2 on the ops view: a killed worker's runs show as orphaned, and the health strip says so.

A private cluster with leases of 6 s (renewed every 1 s, so that an orphan stays on the page
long enough to be seen), a fast reaper, two runs workers, one web process and an ops key.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared.db import make_pool
from shared.runs.model import TERMINAL_STATUSES
from shared.runs.store import RunStore
from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ALICE, API_KEYS, FAST_LEASES, ClusterFactory
from tests.e2e.test_ops_page import OpsPage, browser

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
