"""H2: a worker too busy to answer the ops broadcast in time is not shown gone.

A private cluster whose web waits 1 ms for the Celery `inspect` answers, so no worker ever
answers in time (as a worker whose threads hold the GIL, on a loaded host, answers after
the 0.5 s default): the runs worker is online by its presence record alone
(shared/ops/presence.py), its queue has a worker and its running run is not orphaned.
kill -9 takes it out 3 presence periods after its last write; a stop in order at once.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ALICE, API_KEYS, FAST_LEASES, ClusterFactory

pytestmark = pytest.mark.e2e

OPS = "key-ops"


@pytest.fixture(scope="module")
def deaf(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    env = {
        **FAST_LEASES,
        "THREADRUN_API_KEYS": f"{API_KEYS},{OPS}:ops-user:ops",
        "THREADRUN_OPS_INSPECT_TIMEOUT_S": "0.001",
        "THREADRUN_OPS_INSPECT_CACHE_S": "0",
    }
    with private_cluster("opspresence", env) as c:
        c.side_by_side(c.start_web, lambda: c.start_worker("p1"))
        yield c


def tile(ops: httpx.Client, key: str) -> dict[str, Any]:
    return next(t for t in ops.get("/ops/api/health").json()["tiles"] if t["key"] == key)


def test_h2_a_worker_that_answers_too_late_is_online_by_its_record(deaf: Cluster) -> None:
    """The broadcast gets no answer in time, yet the runs tile counts the worker every time,
    the workers list shows it (its pid, `answered` false), a running run of it is not orphaned and ends;
    after kill -9 the tile turns red within the presence's stale time."""
    worker = next(p for p in deaf.procs if p.name == "p1")
    ops = httpx.Client(base_url=deaf.url, headers={"x-api-key": OPS}, timeout=30)
    user = httpx.Client(base_url=deaf.url, headers={"x-api-key": ALICE}, timeout=60)
    with ops, user:
        # Ten looks: each counts the worker (an answer may still arrive within 1 ms now
        # and then: `answered` is false in most of them, true at most in a few).
        for _ in range(10):
            runs = tile(ops, "workers.runs")
            assert runs["state"] == "ok" and runs["value"] == 1, runs
        looks = [ops.get("/ops/api/workers").json()["workers"] for _ in range(10)]
        assert all(
            [(w["pid"], "runs" in w["queues"]) for w in ws] == [(worker.pid, True)] for ws in looks
        )
        assert any(not ws[0]["answered"] for ws in looks)
        tid = user.post("/threads", json={}).json()["thread_id"]
        body = {
            "assistant_id": "lead_agent",
            "input": {"messages": [{"role": "user", "content": "busy"}]},
            "config": {"configurable": {"tokens": 40, "token_delay_ms": 25}},
        }
        run_id = user.post(f"/threads/{tid}/runs", json=body).json()["run_id"]

        def running_row() -> dict[str, Any] | None:
            rows = ops.get("/ops/api/runs").json()["runs"]
            return next((r for r in rows if r["run_id"] == run_id and r["owner"]), None)

        row = wait_for(running_row, 15, what="the run to be claimed")
        assert not row["orphaned"], row
        assert user.get(f"/threads/{tid}/runs/{run_id}/join").status_code == 200

        os.kill(worker.pid, signal.SIGKILL)
        worker.popen.wait(timeout=10)
        stale_s = deaf.settings.ops_presence_s * 3
        wait_for(lambda: tile(ops, "workers.runs")["state"] == "bad", stale_s + 3, what="red")
        assert ops.get("/ops/api/workers").json()["workers"] == []


def test_h2_a_worker_stopped_in_order_is_gone_at_once(deaf: Cluster) -> None:
    """SIGTERM: the worker removes its record as it exits; the next look no longer counts it
    (whatever else the cluster runs: this test does not rely on the one before)."""
    ops = httpx.Client(base_url=deaf.url, headers={"x-api-key": OPS}, timeout=30)
    with ops:
        before = tile(ops, "workers.runs")["value"]
        worker = deaf.start_worker("p2")
        assert tile(ops, "workers.runs")["value"] == before + 1
        deaf.stop([worker])
        assert tile(ops, "workers.runs")["value"] == before
