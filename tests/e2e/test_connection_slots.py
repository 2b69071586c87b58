"""A4: a closed stream frees its connection slot at once.

Before, a server noticed a closed SSE stream only at its next write (a heartbeat, up to
5 s later), so a user at `max_connections_per_user` who reconnected at once got 429.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from shared.testing import Cluster
from tests.e2e.conftest import ClusterFactory, human

pytestmark = pytest.mark.e2e

ENV = {
    "THREADRUN_API_KEYS": "key-one:one",
    "THREADRUN_MAX_CONNECTIONS_PER_USER": "1",
    "THREADRUN_STREAM_HEARTBEAT_S": "5",
}
SLOW = {"configurable": {"tokens": 400, "token_delay_ms": 100}}


@pytest.fixture(scope="module")
def one(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    with private_cluster("conn-slots", ENV) as c:
        yield c.start(concurrency=2)


def test_a4_a_closed_stream_frees_its_slot_for_an_immediate_reconnect(one: Cluster) -> None:
    headers = {"x-api-key": "key-one"}
    with httpx.Client(base_url=one.url, headers=headers, timeout=30) as c:
        tid = c.post("/threads", json={}).json()["thread_id"]
        body = {"assistant_id": "lead_agent", "input": human("hi"), "config": SLOW}
        rid = c.post(f"/threads/{tid}/runs", json=body).json()["run_id"]
        path = f"/threads/{tid}/runs/{rid}/stream"
        for _ in range(3):
            with (
                httpx.Client(base_url=one.url, headers=headers, timeout=30) as sse,
                sse.stream("GET", path, headers={"Last-Event-ID": "-1"}) as res,
            ):
                assert res.status_code == 200, res.read()
                next(res.iter_lines())  # the stream is open and holds the one slot
            time.sleep(0.3)  # the client has hung up; well under one heartbeat
        c.post(f"/threads/{tid}/runs/{rid}/cancel")
