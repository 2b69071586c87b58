"""A4: heavy reads cannot stall other users. A history page is capped in bytes as well as
in count (the next page starts `before` the last state sent, named in a header), and state
and history reads are limited per user in rate and in concurrency, like runs.

Before: `GET …/history?limit=1000` returned 116 MB after 16 large state updates, and 40
concurrent history reads raised another user's `GET /state` from 4 ms to 8 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from shared.redis_keys import LimitKeys
from shared.tools.testing import Cluster
from tests.e2e.conftest import ClusterFactory, human

pytestmark = pytest.mark.e2e

USERS = ("pager", "crowd", "rate")
KEYS = {u: f"key-{u}" for u in USERS}
HEAVY = {
    "THREADRUN_API_KEYS": ",".join(f"{k}:{u}" for u, k in KEYS.items()),
    "THREADRUN_HISTORY_MAX_BYTES": "8192",
    "THREADRUN_MAX_HEAVY_READS_PER_USER": "2",
    "THREADRUN_HEAVY_READS_PER_MINUTE": "30",
}


@pytest.fixture(scope="module")
def heavy(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    with private_cluster("heavy", HEAVY) as c:
        yield c.start(concurrency=2)


def client(c: Cluster, user: str) -> httpx.Client:
    return httpx.Client(base_url=c.url, headers={"x-api-key": KEYS[user]}, timeout=60)


def test_a4_history_pages_are_capped_in_bytes_and_resume_before(heavy: Cluster) -> None:
    """Six state updates of ~3 KB messages each (a state holds every message so far) and a
    cap of 8 KB: each page fits the cap or is one state, and names where the next starts;
    walking the pages gives every state once."""
    with client(heavy, "pager") as c:
        tid = c.post("/threads", json={}).json()["thread_id"]
        body = {
            "assistant_id": "lead_agent",
            "input": human("hi"),
            "config": {"configurable": {"tokens": 2}},
        }
        assert c.post(f"/threads/{tid}/runs/wait", json=body).status_code == 200
        for i in range(6):
            update = {"values": {"messages": [{"role": "user", "content": f"{i}" * 3000}]}}
            assert c.post(f"/threads/{tid}/state", json=update).status_code == 200, i
        everything = c.post(f"/threads/{tid}/history", json={"limit": 100})
        assert everything.status_code == 200
        seen: list[str] = []
        page = everything
        while True:
            states = page.json()
            assert len(states) == 1 or len(page.content) <= 8192  # one state may be larger
            seen += [s["checkpoint"]["checkpoint_id"] for s in states]
            nxt = page.headers.get("X-Threadrun-Next-Before")
            if nxt is None:
                break
            assert nxt == seen[-1]
            page = c.post(f"/threads/{tid}/history", json={"limit": 100, "before": nxt})
        assert len(seen) == len(set(seen)) >= 8  # the run's checkpoints and the six updates
        assert len(everything.json()) < len(seen)


def test_a4_heavy_reads_in_flight_are_limited_per_user(heavy: Cluster) -> None:
    """With both of a user's heavy-read slots taken, a state read is 429 naming the limit;
    another user is not affected; once a slot frees the read is served."""
    rds = redis.Redis.from_url(heavy.settings.redis_url)
    key = LimitKeys(heavy.settings.redis_prefix).heavy_reads("crowd")
    with client(heavy, "crowd") as c, client(heavy, "pager") as other:
        tid = c.post("/threads", json={}).json()["thread_id"]
        mine = other.post("/threads", json={}).json()["thread_id"]
        until_ms = int(time.time() * 1000) + 60_000  # a member's score is its expiry
        rds.zadd(key, {"held-1": until_ms, "held-2": until_ms})
        try:
            r = c.get(f"/threads/{tid}/state")
            assert r.status_code == 429 and r.json()["limit"] == "max_heavy_reads_per_user", r.text
            assert other.get(f"/threads/{mine}/state").status_code == 200
            rds.zrem(key, "held-1")
            assert c.get(f"/threads/{tid}/state").status_code == 200
        finally:
            rds.delete(key)
            rds.close()


def test_a4_heavy_reads_are_rate_limited_per_user(heavy: Cluster) -> None:
    """30 reads a minute: the 31st at once is 429 with Retry-After."""
    with client(heavy, "rate") as c:
        tid = c.post("/threads", json={}).json()["thread_id"]
        codes = [c.get(f"/threads/{tid}/state").status_code for _ in range(31)]
        assert codes[:30] == [200] * 30 and codes[30] == 429, codes
        r = c.post(f"/threads/{tid}/history", json={})
        assert r.status_code == 429 and r.json()["limit"] == "heavy_reads_per_minute"
        assert int(r.headers["Retry-After"]) >= 1
