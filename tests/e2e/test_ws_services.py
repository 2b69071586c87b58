"""A2 with A1: a WebSocket request frame that fails because Redis is unreachable is answered
with a `service_unavailable` error frame naming the service, with a retry hint, like the
HTTP API's 503 with Retry-After; the socket stays usable and serves again once Redis is back.

The web process reaches Redis through a proxy the test cuts and heals (the worker and the
test reach it directly). Before, such a frame was answered `internal_error`, which told a
client neither that retrying would help nor when.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from app.errors import SERVICE_RETRY_AFTER_S
from shared.redis_keys import Keys
from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ClusterFactory
from tests.e2e.faults import CuttableProxy, redis_behind_proxy
from tests.e2e.test_ws import WS, Frame, create_frame, new_thread

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cut_web(private_cluster: ClusterFactory) -> Iterator[tuple[Cluster, CuttableProxy]]:
    """A web process whose Redis is behind a cuttable proxy, and a worker on Redis directly."""
    with private_cluster("ws-services") as c, redis_behind_proxy(c) as (proxy, proxied_url):
        c.start_web({"THREADRUN_REDIS_URL": proxied_url})
        c.start_worker("w1", 2)
        yield c, proxy


def assert_unavailable(frame: Frame, request_id: str) -> None:
    assert frame["type"] == "error", frame
    assert frame["code"] == "service_unavailable", frame
    assert frame["service"] == "redis" and "Redis" in frame["message"], frame
    assert frame["retry_after"] == SERVICE_RETRY_AFTER_S, frame
    assert frame["request_id"] == request_id, frame


def follows_nothing(c: Cluster) -> bool:
    """Whether the web process has reported (its ops record, shared/ops/connections.py) that
    it follows no run's stream: a socket's subscription reports its end once it detached
    from the process's stream hub."""
    keys = Keys(c.settings.redis_prefix)
    client = redis.Redis.from_url(c.settings.redis_url)
    try:
        procs = client.zrange(keys.ops_web_index(), 0, -1)
        records = [client.hkeys(keys.ops_web(p.decode())) for p in procs]
    finally:
        client.close()
    return bool(records) and all(
        fields and not any(f.startswith(b"sub:") for f in fields) for fields in records
    )


def created_and_ended(ws: WS, frame: Frame, request_id: str) -> str:
    """Send a `run.create`; its run id once its `end` arrived with `success`."""
    reply = ws.request({**frame, "request_id": request_id}, timeout=60)
    assert reply["type"] == "run.created", reply
    run_id = str(reply["run"]["run_id"])
    frames = ws.until(lambda f: f.get("run_id") == run_id and f["type"] in ("end", "gap"))
    assert frames[-1]["type"] == "end" and frames[-1]["status"] == "success", frames[-1]
    return run_id


@pytest.mark.timeout(300)  # each refused frame waits for the web's Redis retries (~5 s)
def test_a2_a1_frames_without_redis_answer_service_unavailable_and_the_socket_recovers(
    cut_web: tuple[Cluster, CuttableProxy],
) -> None:
    c, proxy = cut_web
    tid = new_thread(c)
    with WS(c.url, f"/threads/{tid}/ws") as ws:
        first = created_and_ended(ws, create_frame(tokens=3), "c1")
        # Cut once the web has let go of that run's stream. Cut in the moment it does, the
        # refused frames below often took ~40 s each instead of ~5 s (refused all the same).
        wait_for(lambda: follows_nothing(c), 30, what="the web to report no subscription")
        proxy.cut()
        try:
            assert_unavailable(ws.request({**create_frame(), "request_id": "c2"}, 90), "c2")
            join = {"type": "run.join", "run_id": first, "last_event_id": "-1"}
            assert_unavailable(ws.request({**join, "request_id": "j2"}, 90), "j2")
            # The socket is still up and answers what needs no service.
            assert ws.request({"type": "ping", "request_id": "p"}) == {
                "type": "pong",
                "request_id": "p",
            }
        finally:
            proxy.heal()
        # Back: the same socket creates and streams runs again (the web's clients reconnect
        # at their next command; a frame sent before that may still be refused).
        for attempt in range(10):
            reply = ws.request({**create_frame(tokens=3), "request_id": f"c3-{attempt}"}, 90)
            if reply["type"] == "run.created":
                break
            assert_unavailable(reply, f"c3-{attempt}")
            time.sleep(reply["retry_after"] / 5)
        else:
            raise AssertionError("the socket did not serve again once Redis was back")
        run_id = str(reply["run"]["run_id"])
        frames = ws.until(lambda f: f.get("run_id") == run_id and f["type"] in ("end", "gap"))
        assert frames[-1]["type"] == "end" and frames[-1]["status"] == "success", frames[-1]
        # The run followed before the cut replays whole, through the same socket.
        ws.send({"type": "run.join", "run_id": first, "last_event_id": "-1", "request_id": "j3"})
        frames = ws.until(lambda f: f.get("run_id") == first and f["type"] in ("end", "gap"))
        assert frames[-1]["type"] == "end" and frames[-1]["status"] == "success", frames[-1]
