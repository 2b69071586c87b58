"""A4: connections do not outlive their use: a closed stream frees its connection slot at
once, and a request body that trickles in is cut off.

A stream's hang-up watcher (a greenlet peeking at the socket) is dead before the response
closes: with HTTP keep-alive gunicorn reads the next request from the same socket at once,
and two greenlets waiting on one socket failed both (`ConcurrentObjectUseError`, a 500).

Before, a server noticed a closed SSE stream only at its next write (a heartbeat, up to
5 s later), so a user at `max_connections_per_user` who reconnected at once got 429; and
an authenticated client could hold a connection for 100 s+ by sending its body slowly.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from shared.tools.testing import Cluster
from tests.e2e.conftest import ClusterFactory, human

pytestmark = pytest.mark.e2e

ENV = {
    "THREADRUN_API_KEYS": "key-one:one",
    "THREADRUN_MAX_CONNECTIONS_PER_USER": "1",
    "THREADRUN_STREAM_HEARTBEAT_S": "5",
    "THREADRUN_REQUEST_BODY_TIMEOUT_S": "1",
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


def test_a4_a_body_that_trickles_in_is_cut_off(one: Cluster) -> None:
    """Eleven bytes of a hundred, then nothing: 408 after the 1 s body timeout."""
    host, port = one.url.removeprefix("http://").split(":")
    head = (
        "POST /threads HTTP/1.1\r\nHost: {h}\r\nx-api-key: key-one\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    ).format(h=f"{host}:{port}")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + b'{"metadata"')
        answer = sock.recv(4096).decode(errors="replace")  # before: no answer (a timeout here)
    assert answer.startswith("HTTP/1.1 408"), answer[:200]


@pytest.fixture(scope="module")
def keyless(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """Local single-user mode: its connection slot holds nothing, so closing a stream does
    no I/O that would let the watcher die before gunicorn reads the next request."""
    with private_cluster("conn-slots-keyless", {"THREADRUN_API_KEYS": ""}) as c:
        yield c.start(concurrency=2)


@pytest.mark.parametrize("mode", ["keyless", "keyed"])
def test_a4_requests_after_a_stream_on_the_same_keep_alive_connection_answer_200(
    mode: str, request: pytest.FixtureRequest
) -> None:
    """Stream runs over one HTTP/1.1 connection, each followed by more requests on it: every
    one answers 200 on that very connection (with the watcher killed without waiting for
    it, the first request after a stream answered 500 in local mode)."""
    c: Cluster = request.getfixturevalue("keyless" if mode == "keyless" else "one")
    host, port = c.url.removeprefix("http://").split(":")
    headers = {"Content-Type": "application/json"}
    if mode == "keyed":
        headers["x-api-key"] = "key-one"
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/threads", body="{}", headers=headers)
        res = conn.getresponse()
        answer = res.read()
        assert res.status == 200, answer
        tid = json.loads(answer)["thread_id"]
        sock = conn.sock  # every later request must go over this socket (keep-alive)
        assert sock is not None
        quick = {"configurable": {"tokens": 3, "token_delay_ms": 0}}
        body = json.dumps({"assistant_id": "lead_agent", "input": human("hi"), "config": quick})
        for round_ in range(3):
            conn.request("POST", f"/threads/{tid}/runs/stream", body, headers)
            res = conn.getresponse()
            stream = res.read().decode()
            assert res.status == 200, stream
            assert "event: end" in stream, stream[-500:]
            assert not res.will_close, "the server closed the connection after the stream"
            for path in (f"/threads/{tid}", f"/threads/{tid}/state", f"/threads/{tid}/runs"):
                conn.request("GET", path, headers=headers)
                res = conn.getresponse()
                answer = res.read()
                assert res.status == 200, (round_, path, res.status, answer[:300])
                assert conn.sock is sock, "the connection was not reused"
    finally:
        conn.close()
