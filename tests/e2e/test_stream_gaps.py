"""B5: no false gap, against real processes.

A gap tells a client that events it needs are gone, so it must reload state; with no
fault, no client may ever get one. Fresh streams of fast runs under concurrent load (the
interleaving that produced gaps with null bounds: the run starts, publishes everything and
ends between the subscriber's first read and its terminal check), and runs cancelled
while still pending (they never had a stream: joining one says how it ended).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from shared.tools.testing import Cluster
from shared.tools.testing.sse import iter_sse, read_stream
from tests.e2e.conftest import ALICE, ClusterFactory, human

pytestmark = pytest.mark.e2e

LOAD = {
    "THREADRUN_MAX_ACTIVE_RUNS": "1000",
    "THREADRUN_RUNS_PER_MINUTE": "100000",
    "THREADRUN_MAX_CONNECTIONS_PER_USER": "200",
}
FAST = {"configurable": {"tokens": 2}}
SLOW = {"configurable": {"tokens": 400, "token_delay_ms": 100}}


@pytest.fixture(scope="module")
def gaps(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    with private_cluster("gaps", LOAD) as c:
        yield c.start(concurrency=16)


@pytest.fixture
def http(gaps: Cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gaps.url, headers={"x-api-key": ALICE}, timeout=60) as c:
        yield c


def body(config: dict[str, Any]) -> dict[str, Any]:
    return {"assistant_id": "lead_agent", "input": human("hi"), "config": config}


def test_b5_no_gap_on_fresh_streams_under_load(gaps: Cluster) -> None:
    """200 fresh `POST /threads/{id}/runs/stream` of fast runs at 20 concurrent clients:
    every stream ends with `end`, and not one carries a gap."""

    def one(_: int) -> list[str]:
        with httpx.Client(base_url=gaps.url, headers={"x-api-key": ALICE}, timeout=60) as c:
            tid = c.post("/threads", json={}).json()["thread_id"]
            with c.stream("POST", f"/threads/{tid}/runs/stream", json=body(FAST)) as res:
                assert res.status_code == 200, res.read()
                return [m.event for m in iter_sse(res.iter_lines())]

    with ThreadPoolExecutor(20) as pool:
        streams = list(pool.map(one, range(200)))
    names = Counter(name for events in streams for name in events)
    assert names["gap"] == 0, names
    assert all(events and events[-1] == "end" for events in streams), names


def test_b5_a_run_cancelled_while_pending_says_how_it_ended(
    http: httpx.Client,
) -> None:
    """A run cancelled while queued never had a stream: joining it from the start gets
    `end` with status `interrupted`, not a gap with null bounds."""
    tid = http.post("/threads", json={}).json()["thread_id"]
    slow = http.post(f"/threads/{tid}/runs", json=body(SLOW)).json()["run_id"]
    queued = http.post(f"/threads/{tid}/runs", json=body(FAST)).json()["run_id"]
    assert http.post(f"/threads/{tid}/runs/{queued}/cancel").status_code in (200, 202, 204)
    events = read_stream(http, tid, queued, "-1", within=30)
    assert [e.event for e in events] == ["end"]
    assert events[0].data == {"run_id": queued, "status": "interrupted"}
    http.post(f"/threads/{tid}/runs/{slow}/cancel")
