"""The web server model (app/gunicorn_conf.py) with a client that stops reading.

Runs against the session cluster, whose web process uses THREADRUN_WEB_WORKER_CLASS (gevent
by default; the test passes with gthread too). Idle-connection capacity is measured by
bench/streams.py, not asserted here.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Event, Request, TextMessage

from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE
from tests.e2e.test_ws import WS, api, human, knobs, new_thread, status, tokens

pytestmark = pytest.mark.e2e

SLOW_RCVBUF = 4096  # the stalled client's receive buffer: the server's sends back up quickly
TOKENS = 6_000  # ~1 KB frames: more than every kernel buffer between the server and it holds
TOKEN_DELAY_MS = 1.0  # a producer both relays keep up with (a reader that cannot gets a gap, B5)


class StalledClient:
    """A WebSocket client (wsproto over a raw socket) that sends frames and reads nothing."""

    def __init__(self, base: str, path: str) -> None:
        host, port = base.removeprefix("http://").rsplit(":", 1)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RCVBUF)
        self.sock.connect((host, int(port)))
        self.sock.settimeout(10)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(
            self.ws.send(
                Request(
                    host=f"{host}:{port}",
                    target=path,
                    extra_headers=[(b"x-api-key", ALICE.encode())],
                )
            )
        )
        self.pending: list[Event] = []
        while not any(isinstance(e, AcceptConnection) for e in self.pending):
            self._read()
        self.pending = [e for e in self.pending if not isinstance(e, AcceptConnection)]

    @property
    def rcvbuf(self) -> int:
        """The receive buffer the kernel actually granted."""
        return int(self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))

    def send(self, frame: dict[str, Any]) -> None:
        self.sock.sendall(self.ws.send(TextMessage(data=json.dumps(frame))))

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.ws.receive_data(data)
        self.pending.extend(self.ws.events())

    def frames_until_end(self, timeout: float = 60) -> list[dict[str, Any]]:
        """Start reading: every frame up to the run's `end` or `gap`."""
        out: list[dict[str, Any]] = []
        text = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.pending:
                if isinstance(event, CloseConnection):
                    raise ConnectionError(f"closed by the server: {event.code} {event.reason}")
                if isinstance(event, TextMessage):
                    text += event.data
                    if event.message_finished:
                        out.append(json.loads(text))
                        text = ""
                        if out[-1]["type"] in ("end", "gap"):
                            return out
            self.pending = []
            self._read()
        raise AssertionError(f"no end within {timeout} s ({len(out)} frames)")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def tcp_wmem_max() -> int:
    """The most a sending socket may buffer in the kernel (net.ipv4.tcp_wmem)."""
    return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])


def test_b1_a2_one_stalled_reader_slows_neither_the_run_nor_another_client(
    cluster: Cluster,
) -> None:
    """A2, B1: a WebSocket client that stops reading mid-run does not hold up the run or a
    second client of the same run: the second receives every token and `end` (success) while
    the stalled one has still read nothing. When the stalled one reads again it gets the
    events in order from the start, then `end`, or a `gap` if it fell behind the retained
    window (B5); its socket was never dropped."""
    tid = new_thread(cluster)
    with api(cluster) as h:
        # A blocker first: the measured run waits behind it, so both clients follow it live.
        body = {"assistant_id": "lead_agent", "input": human("blocker"), "config": knobs(20, 25)}
        h.post(f"/threads/{tid}/runs", json=body).raise_for_status()
        body = {
            "assistant_id": "lead_agent",
            "input": human("many tokens"),
            "stream_mode": ["messages-tuple"],
            "config": knobs(TOKENS, TOKEN_DELAY_MS),
            "multitask_strategy": "enqueue",
        }
        res = h.post(f"/threads/{tid}/runs", json=body)
        res.raise_for_status()
        run_id = res.json()["run_id"]
    join = {"type": "run.join", "run_id": run_id, "last_event_id": "-1"}
    stalled = StalledClient(cluster.url, f"/threads/{tid}/ws")
    try:
        stalled.send(join)  # ... and from now on it reads nothing
        with WS(cluster.url, f"/threads/{tid}/ws") as fast:
            fast.send(join)
            frames = fast.follow({run_id}, timeout=120)[run_id]
        assert frames[-1]["type"] == "end" and frames[-1]["status"] == "success"
        assert len(tokens(frames)) == TOKENS
        assert status(cluster, tid, run_id) == "success"
        # The stalled client really was stalled: its share of the stream did not fit in the
        # kernel buffers between the server and it, so the server's sends to it blocked.
        sent = sum(len(json.dumps(f, separators=(",", ":"), ensure_ascii=False)) for f in frames)
        assert sent > stalled.rcvbuf + tcp_wmem_max(), (sent, len(frames))

        late = stalled.frames_until_end(timeout=120)  # it reads again
        assert late[-1]["type"] in ("end", "gap")
        ids = [f["id"] for f in late if f["type"] == "event"]
        assert ids == [f["id"] for f in frames if f["type"] == "event"][: len(ids)]
        if late[-1]["type"] == "gap":
            assert late[-1]["code"] == "stream_replay_gap"
        else:
            assert len(ids) == len([f for f in frames if f["type"] == "event"])
    finally:
        stalled.close()


GUNICORN_DEFAULT_KEEPALIVE_S = 2


def get_ok(sock: socket.socket, host: str) -> bytes:
    """One `GET /ok` on an open keep-alive connection: the whole response (Content-Length)."""
    sock.sendall(f"GET /ok HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the kept-alive connection")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return head


def test_an_idle_keep_alive_connection_is_kept_past_gunicorns_default(cluster: Cluster) -> None:
    """A client pool's idle connection is still open when the client reuses it. gunicorn's
    own default closed it after 2 s; httpx (the SDK's client) keeps one 5 s, so a request sent
    as the server closed it was reset (`Connection reset by peer`). The server now keeps idle
    connections THREADRUN_WEB_KEEPALIVE_S (75 s), longer than the clients do."""
    host, port = cluster.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        assert get_ok(sock, host).startswith(b"HTTP/1.1 200")
        time.sleep(GUNICORN_DEFAULT_KEEPALIVE_S + 1.5)
        assert get_ok(sock, host).startswith(b"HTTP/1.1 200")
