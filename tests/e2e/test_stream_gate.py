"""B5 with L4/L5: a worker cut from Redis while its model streams never leaves a silent hole.

The owner's link to Redis (and only its link: PostgreSQL and the other processes stay
reachable) is cut a moment before its model's last token: the events it could not publish
are never in the stream, so its checkpoint writes must not commit past them (the stream
gate, shared/state/savers.py). The lease expires, the other worker's reaper re-claims the
run, and attempt 2 re-runs the model step from the previous checkpoint and streams the
whole answer. Without the gate attempt 1 committed the step, attempt 2 resumed after it and
streamed only `metadata` and `end`: the tail of the answer was on no stream, and no `gap`.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from shared.db import make_pool
from shared.redis_keys import Keys
from shared.runs.model import TERMINAL_STATUSES
from shared.runs.store import RunStore
from shared.tools.testing import Cluster, read_stream, wait_for
from shared.tools.testing.cluster import worker_argv
from tests.e2e.conftest import ALICE, FAST_LEASES, ClusterFactory
from tests.e2e.faults import CuttableProxy, redis_behind_proxy

pytestmark = pytest.mark.e2e

TOKENS = 120
DELAY_MS = 40
CUT_BEFORE_END = 12
"""The link is cut when this many tokens are left (~0.5 s): the model step ends during the
partition, well within the lease's TTL (3 s), so attempt 1 reaches its checkpoint write."""
PARTITION_S = 12.0
"""Longer than the publisher's retries (~8 s) and as long as the longer lease TTL."""


LEASES = {
    "lease-expires-first": FAST_LEASES,
    "publish-fails-first": {**FAST_LEASES, "THREADRUN_LEASE_TTL_S": "12"},
}
"""With a 3 s lease the keeper stops attempt 1 while the gate still waits for the publish;
with a 12 s one the publish gives up first (~8 s) and the gate stops the attempt."""


@pytest.fixture(scope="module", params=list(LEASES))
def gated(
    request: pytest.FixtureRequest, private_cluster: ClusterFactory
) -> Iterator[tuple[Cluster, CuttableProxy]]:
    """A web process, worker `w1`, whose Redis (runs, leases, broker) is behind a proxy, and
    worker `w2` on Redis directly."""
    with (
        private_cluster(f"stream-gate-{request.param}", LEASES[request.param]) as c,
        redis_behind_proxy(c) as (proxy, proxied_url),
    ):
        c.start_web()
        env = {"THREADRUN_WORKER_CONCURRENCY": "4", "THREADRUN_REDIS_URL": proxied_url}
        w1 = c.spawn("w1", worker_argv("w1", 4), env, role="worker")
        c.wait_log(w1, "ready.")
        c.start_worker("w2", 4)  # its reaper takes the run over after the cut
        yield c, proxy


def tokens_published(client: redis.Redis, key: str) -> int:
    """The `messages` events in the run's stream so far."""
    return sum(1 for _id, fields in client.xrange(key) if fields.get(b"e") == b"messages")


def test_b5_l5_worker_cut_from_redis_mid_stream_leaves_no_silent_hole(
    gated: tuple[Cluster, CuttableProxy],
) -> None:
    c, proxy = gated
    pool = make_pool(c.settings, name="test-stream-gate", max_size=2)
    store = RunStore(pool)
    direct = redis.Redis.from_url(c.settings.redis_url)
    api = httpx.Client(base_url=c.url, headers={"x-api-key": ALICE}, timeout=30)
    try:
        tid = api.post("/threads", json={}).json()["thread_id"]
        body = {
            "assistant_id": "lead_agent",
            "input": {"messages": [{"role": "user", "content": "cut me off"}]},
            "stream_mode": ["messages-tuple", "values"],
            "config": {"configurable": {"tokens": TOKENS, "token_delay_ms": DELAY_MS}},
        }
        w1, w2 = (next(p for p in c.procs if p.name == n) for n in ("w1", "w2"))
        os.kill(w2.pid, signal.SIGSTOP)  # so that w1 takes the run
        try:
            run_id = str(api.post(f"/threads/{tid}/runs", json=body).json()["run_id"])
            wait_for(lambda: store.run_status(run_id) == "running", 30, what="w1 to claim")
        finally:
            os.kill(w2.pid, signal.SIGCONT)
        run = store.get_run_by_id(run_id)
        assert run is not None and run.owner and int(run.owner.split(":")[1]) == w1.pid
        key = Keys(c.settings.redis_prefix).stream(run_id)
        wait_for(
            lambda: tokens_published(direct, key) >= TOKENS - CUT_BEFORE_END,
            60,
            what="attempt 1 to stream most of its answer",
        )
        proxy.cut()
        assert store.run_status(run_id) == "running", "the run ended before the cut"
        time.sleep(PARTITION_S)
        proxy.heal()
        wait_for(lambda: store.run_status(run_id) in TERMINAL_STATUSES, 60, what="the run to end")
        row = api.get(f"/threads/{tid}/runs/{run_id}").json()
        assert row["status"] == "success" and row["attempt"] >= 2, row
        state = api.get(f"/threads/{tid}/state").json()
        answer = state["values"]["messages"][-1]
        assert answer["type"] == "ai" and len(answer["content"].split()) == TOKENS, answer
        events = read_stream(api, tid, run_id)
        names = [e.event for e in events]
        if "gap" in names:  # an explicit gap, then the state holds the whole answer (B9)
            return
        last_meta = max(i for i, n in enumerate(names) if n == "metadata")
        streamed = "".join(
            json.loads(e.text)[0]["content"]
            for e in events[last_meta:]
            if e.event == "messages" and json.loads(e.text)[0].get("type") == "AIMessageChunk"
        )
        attempts = [json.loads(e.text)["attempt"] for e in events if e.event == "metadata"]
        assert streamed == answer["content"], (
            f"the last attempt's stream is not the whole answer (attempts {attempts}): "
            f"{len(streamed.split())} of {TOKENS} tokens, no gap"
        )
        assert names.count("end") == 1
    finally:
        api.close()
        direct.close()
        pool.close()
