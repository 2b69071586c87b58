"""R1, R4: a run cannot hold a worker slot for ever, and one user cannot hold every slot.

Before: `tokens` up to 100,000 and `token_delay_ms` up to 60,000 allowed a ~69-day run,
and two users with 16 runs each filled a 32-slot worker while a third user's run stayed
`pending`. Now the worker ends a run `timeout` after `run_timeout_s` (its checkpoints
kept), and a user holding `worker_user_share` of a worker's slots has further runs put
back while another user's run waits.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from shared.tools.testing import Cluster, wait_for
from shared.tools.testing.sse import read_stream
from tests.e2e.conftest import ClusterFactory, human

pytestmark = pytest.mark.e2e

USERS = ("hog", "fair", "slow")
KEYS = {u: f"key-{u}" for u in USERS}
ENV = {
    "THREADRUN_API_KEYS": ",".join(f"{k}:{u}" for u, k in KEYS.items()),
    "THREADRUN_WORKER_USER_SHARE": "0.5",
    "THREADRUN_REAPER_INTERVAL_S": "0.5",
}
SLOW = {"configurable": {"tokens": 400, "token_delay_ms": 100}}  # ~40 s: longer than the limit
LONG = SLOW  # the fairness cluster has no tight time limit


@pytest.fixture(scope="module")
def limited(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """A 4-slot worker with the default run time limit."""
    with private_cluster("run-limits", ENV) as c:
        yield c.start(concurrency=4)


@pytest.fixture(scope="module")
def short(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """A worker whose runs may last 3 s."""
    with private_cluster("run-timeout", {**ENV, "THREADRUN_RUN_TIMEOUT_S": "3"}) as c:
        yield c.start(concurrency=2)


def client(c: Cluster, user: str) -> httpx.Client:
    return httpx.Client(base_url=c.url, headers={"x-api-key": KEYS[user]}, timeout=60)


def start(c: httpx.Client, **extra: object) -> tuple[str, str]:
    tid = c.post("/threads", json={}).json()["thread_id"]
    body = {"assistant_id": "lead_agent", "input": human("go"), "config": SLOW, **extra}
    r = c.post(f"/threads/{tid}/runs", json=body)
    assert r.status_code == 200, r.text
    return tid, str(r.json()["run_id"])


def status(c: httpx.Client, tid: str, rid: str) -> str:
    return str(c.get(f"/threads/{tid}/runs/{rid}").json()["status"])


def test_r1_a_run_past_the_time_limit_ends_timeout_with_its_progress(short: Cluster) -> None:
    """A ~40 s run under a 3 s limit ends `timeout`; its stream says why; the thread keeps
    what was committed (the user's message) and takes the next run."""
    with client(short, "slow") as c:
        tid, rid = start(c)
        events = read_stream(c, tid, rid, "-1", within=30)
        assert events[-1].event == "end" and events[-1].data["status"] == "timeout"
        errors = [e.data for e in events if e.event == "error"]
        assert errors and errors[-1]["error"] == "RunTimeout", errors
        run = c.get(f"/threads/{tid}/runs/{rid}").json()
        assert run["status"] == "timeout"
        values = c.get(f"/threads/{tid}/state").json()["values"]
        assert values["messages"][0]["content"] == "go"
        again = {
            "assistant_id": "lead_agent",
            "input": human("next"),
            "config": {"configurable": {"tokens": 2}},
        }
        assert c.post(f"/threads/{tid}/runs/wait", json=again).status_code == 200


def test_r4_a_user_holding_their_share_lets_another_users_run_start(limited: Cluster) -> None:
    """A 4-slot worker, a share of one half. One user fills the worker, then queues a fifth
    run; another user queues one behind it. When a slot frees, the first user's queued run
    is put back (they hold more than their share while the other waits) and the other
    user's run takes the slot."""
    with client(limited, "hog") as hog, client(limited, "fair") as fair:
        hogs = [start(hog, config=LONG) for _ in range(4)]
        wait_for(lambda: all(status(hog, *r) == "running" for r in hogs), timeout=20)
        queued = start(hog, config=LONG)
        mine = start(fair, config=LONG)
        assert hog.post(f"/threads/{hogs[0][0]}/runs/{hogs[0][1]}/cancel").status_code < 300
        wait_for(lambda: status(fair, *mine) == "running", timeout=20, what="the fair run")
        assert status(hog, *queued) == "pending"
        for tid, rid in [*hogs[1:], queued]:
            hog.post(f"/threads/{tid}/runs/{rid}/cancel")
        fair.post(f"/threads/{mine[0]}/runs/{mine[1]}/cancel")
