"""A4: the active-run limit with a high limit, against real processes.

A run leaves its user's active set when it ends (the worker's finalize, a cancel of a
pending run, the reaper), so the set holds only pending and running runs; when a full set
holds ended runs anyway (a slot bound after its fast run ended, a failed release), one
query prunes all of them. Before the fix the set kept every ended run until it was full,
and each admission at the limit read a thousand run statuses one by one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from shared.redis_keys import LimitKeys
from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ClusterFactory, human

pytestmark = pytest.mark.e2e

USERS = ("ends", "cancel", "full", "load")
KEYS = {u: f"key-{u}" for u in USERS}
HIGH = {
    "THREADRUN_API_KEYS": ",".join(f"{k}:{u}" for u, k in KEYS.items()),
    "THREADRUN_MAX_ACTIVE_RUNS": "1000",
    "THREADRUN_RUNS_PER_MINUTE": "10000",
    "THREADRUN_MAX_CONNECTIONS_PER_USER": "200",
}
QUICK = {"configurable": {"tokens": 2}}
SLOW = {"configurable": {"tokens": 400, "token_delay_ms": 100}}  # ~40 s unless cancelled


@pytest.fixture(scope="module")
def high(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    with private_cluster("active", HIGH) as c:
        yield c.start(concurrency=8)


@pytest.fixture
def rds(high: Cluster) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(high.settings.redis_url)
    yield client
    client.close()


def active(rds: redis.Redis, c: Cluster, user: str) -> set[str]:
    key = LimitKeys(c.settings.redis_prefix).active(user)
    return {m.decode() for m in rds.zrange(key, 0, -1)}


def post(c: Cluster, user: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{c.url}{path}", json=body, headers={"x-api-key": KEYS[user]}, timeout=60)


def thread(c: Cluster, user: str) -> str:
    r = post(c, user, "/threads", {})
    assert r.status_code == 200, r.text
    return str(r.json()["thread_id"])


def run(c: Cluster, user: str, tid: str, config: dict[str, Any], path: str = "runs") -> str:
    body = {"assistant_id": "lead_agent", "input": human("hi"), "config": config}
    r = post(c, user, f"/threads/{tid}/{path}", body)
    assert r.status_code == 200, r.text
    return str(r.json()["run_id"]) if path == "runs" else ""


def test_a4_a_run_leaves_the_active_set_when_it_ends(high: Cluster, rds: redis.Redis) -> None:
    """Three finished runs leave nothing behind in the user's active set."""
    tid = thread(high, "ends")
    for _ in range(3):
        run(high, "ends", tid, QUICK, path="runs/wait")
    wait_for(lambda: not active(rds, high, "ends"), timeout=10)


def test_a4_cancel_takes_pending_and_running_runs_out(high: Cluster, rds: redis.Redis) -> None:
    """A pending run cancelled by the web and a running run stopped by its worker both
    leave the set."""
    tid = thread(high, "cancel")
    slow = run(high, "cancel", tid, SLOW)
    queued = run(high, "cancel", tid, QUICK)
    assert active(rds, high, "cancel") == {slow, queued}
    for rid in (queued, slow):
        r = post(high, "cancel", f"/threads/{tid}/runs/{rid}/cancel?wait=1", {})
        assert r.status_code in (200, 202, 204), r.text
    wait_for(lambda: not active(rds, high, "cancel"), timeout=30)


def test_a4_a_full_set_of_ended_runs_is_pruned_in_one_pass(high: Cluster, rds: redis.Redis) -> None:
    """1,000 members whose runs are gone: the next admission prunes them and is admitted."""
    key = LimitKeys(high.settings.redis_prefix).active("full")
    rds.zadd(key, {str(uuid.uuid4()): i for i in range(1000)})
    tid = thread(high, "full")
    run(high, "full", tid, QUICK, path="runs/wait")
    wait_for(lambda: not active(rds, high, "full"), timeout=10)


def test_a4_no_false_limit_under_load(high: Cluster, rds: redis.Redis) -> None:
    """40 concurrent sessions of 3 runs each under a limit of 1,000: never a 429, and the
    set is empty once they are done."""

    def session(_: int) -> list[int]:
        tid = thread(high, "load")
        body = {"assistant_id": "lead_agent", "input": human("hi"), "config": QUICK}
        return [post(high, "load", f"/threads/{tid}/runs/wait", body).status_code for _ in "abc"]

    with ThreadPoolExecutor(40) as pool:
        codes = [code for codes in pool.map(session, range(40)) for code in codes]
    assert codes == [200] * 120
    wait_for(lambda: not active(rds, high, "load"), timeout=10)
