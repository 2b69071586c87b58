"""A4: connections do not outlive their use: a closed stream frees its connection slot at
once, and a request body that trickles in is cut off.

Before, a server noticed a closed SSE stream only at its next write (a heartbeat, up to
5 s later), so a user at `max_connections_per_user` who reconnected at once got 429; and
an authenticated client could hold a connection for 100 s+ by sending its body slowly.
"""

from __future__ import annotations

import socket
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
