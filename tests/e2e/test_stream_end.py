"""B7 with B5 and L2: a worker cut from Redis after its run's last checkpoint still ends the
run's stream, once Redis is back.

The stream gate holds every fenced checkpoint write until the events emitted before it are
in Redis, but the run's `end` is published after its terminal status is committed (A1: no
stream closes before its status is durable). Here the owner's link to Redis (only its
link: PostgreSQL and the web process stay reachable) is cut while its terminal write is
held on a row lock the test takes: every event but `end` is in the stream, the status
commits during the partition, and the `end` cannot be published. The partition outlasts
the publisher's retries (~8 s) and the lease's TTL (3 s).

Before the fix the worker gave up: the run was `success` in PostgreSQL and its stream had
no `end`, for good: a reader waited two idle heartbeats and got a `gap` instead of its end,
and every later reader too. Now the worker publishes `end` once Redis takes it (taking the
lapsed lease back for the same epoch: the run is terminal under it, so no newer owner can
exist), exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
import redis

from shared.bridge.base import LOST_EVENT
from shared.redis_keys import Keys
from shared.tools.testing import Cluster, SseEvent, read_stream, wait_for
from shared.tools.testing.cluster import worker_argv
from tests.e2e.conftest import ALICE, FAST_LEASES, ClusterFactory
from tests.e2e.faults import CuttableProxy, redis_behind_proxy

pytestmark = pytest.mark.e2e

TOKENS = 20
PARTITION_S = 12.0
"""Longer than the publisher's retries (~8 s) and the lease's TTL (3 s)."""
ENV = {
    **FAST_LEASES,
    # No journal: the terminal write is then the run's first write that a FOR SHARE lock
    # on its row holds up (journal appends lock the row FOR UPDATE), so when the worker
    # waits on the test's lock every event but `end` is in the stream.
    "THREADRUN_JOURNAL_ENABLED": "false",
}


@pytest.fixture(scope="module")
def cut_worker(private_cluster: ClusterFactory) -> Iterator[tuple[Cluster, CuttableProxy]]:
    """A web process, and worker `w1` whose Redis (runs, leases, broker) is behind a proxy."""
    with private_cluster("stream-end", ENV) as c, redis_behind_proxy(c) as (proxy, proxied_url):
        c.start_web()
        env = {"THREADRUN_WORKER_CONCURRENCY": "2", "THREADRUN_REDIS_URL": proxied_url}
        w1 = c.spawn("w1", worker_argv("w1", 2), env, role="worker")
        c.wait_log(w1, "ready.")
        yield c, proxy


def event_names(client: redis.Redis, key: str) -> list[bytes]:
    """The names of the events in the run's stream so far."""
    return [fields.get(b"e", b"") for _id, fields in client.xrange(key)]


def terminal_write_waits(dsn: str, run_id: str) -> bool:
    """Whether a backend waits on a lock with an UPDATE of the run (its terminal write)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query ILIKE %s",
            ("%update runs%",),
        ).fetchone()
    return bool(row and row[0])


@pytest.mark.timeout(240)
def test_b7_b5_worker_cut_from_redis_after_its_last_checkpoint_still_ends_the_stream(
    cut_worker: tuple[Cluster, CuttableProxy],
) -> None:
    c, proxy = cut_worker
    dsn = c.settings.dsn
    direct = redis.Redis.from_url(c.settings.redis_url)
    api = httpx.Client(base_url=c.url, headers={"x-api-key": ALICE}, timeout=30)
    follower: list[SseEvent] = []
    failures: list[BaseException] = []
    try:
        tid = api.post("/threads", json={}).json()["thread_id"]
        body: dict[str, Any] = {
            "assistant_id": "lead_agent",
            "input": {"messages": [{"role": "user", "content": "end me"}]},
            "stream_mode": ["messages-tuple", "values"],
            "config": {"configurable": {"tokens": TOKENS, "token_delay_ms": 50}},
        }
        run_id = str(api.post(f"/threads/{tid}/runs", json=body).json()["run_id"])
        key = Keys(c.settings.redis_prefix).stream(run_id)

        def follow() -> None:  # a client following the run live through the partition
            try:
                with httpx.Client(base_url=c.url, headers={"x-api-key": ALICE}) as fc:
                    follower.extend(read_stream(fc, tid, run_id, within=120, timeout=60))
            except BaseException as exc:  # noqa: BLE001 - judged below
                failures.append(exc)

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        with psycopg.connect(dsn) as lock:
            wait_for(lambda: b"messages" in event_names(direct, key), 60, what="a token")
            lock.execute("SELECT 1 FROM runs WHERE run_id = %s FOR SHARE", (run_id,))
            wait_for(lambda: terminal_write_waits(dsn, run_id), 60, what="the terminal write")
            assert b"end" not in event_names(direct, key)
            proxy.cut()
            lock.commit()  # the terminal write goes through; `end` cannot be published
        wait_for(
            lambda: api.get(f"/threads/{tid}/runs/{run_id}").json()["status"] == "success",
            30,
            what="the run to commit success",
        )
        time.sleep(PARTITION_S)
        assert b"end" not in event_names(direct, key)
        proxy.heal()
        wait_for(
            lambda: event_names(direct, key)[-1:] == [b"end"],
            60,
            what="the worker to publish the run's end once Redis is back",
        )
        names = event_names(direct, key)
        assert names.count(b"end") == 1 and LOST_EVENT.encode() not in names, names
        # A reader from the start: every event, then the one `end`, with the run's status.
        events = read_stream(api, tid, run_id)
        kinds = [e.event for e in events]
        assert kinds.count("end") == 1 and kinds[-1] == "end" and "gap" not in kinds, kinds
        assert events[-1].data["status"] == "success", events[-1].data
        reader.join(timeout=130)
        assert not failures, failures
        # The live follower: one outcome, never a silent one: the `end`, or (after two idle
        # heartbeats of a terminal run during the partition) an explicit gap.
        tail = [e.event for e in follower][-1:]
        assert tail in (["end"], ["gap"]), [e.event for e in follower]
        assert [e.event for e in follower].count("end") <= 1
    finally:
        api.close()
        direct.close()
