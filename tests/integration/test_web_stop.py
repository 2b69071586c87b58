"""A stopping web process and its idle kept-alive connections (app/gevent_worker.py).

The server keeps an idle connection `web_keepalive_s` (75 s), longer than the clients do; a
stop must still not wait for them. gunicorn, run with the product's own config
(app/gunicorn_conf.py) on a tiny app, is sent SIGTERM (its graceful stop) with a grace of
30 s: an idle connection is closed after the linger (2 s), a request sent on one meanwhile
is answered with `Connection: close`, and the process is gone long before the grace ends.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.tools.testing import free_port

ROOT = Path(__file__).resolve().parents[2]
GRACE_S = 30
WITHIN_S = 12  # the linger (2 s) and the watcher's polls, far below the grace


def request(sock: socket.socket) -> bytes:
    """One GET on an open connection; the response's head (the body is 2 bytes)."""
    sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    data = b""
    while not data.endswith(b"ok"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    return data.partition(b"\r\n\r\n")[0]


def wait_eof(sock: socket.socket) -> None:
    sock.settimeout(GRACE_S + 10)
    while True:
        try:
            if not sock.recv(4096):
                return
        except ConnectionResetError:
            return


@pytest.fixture(params=["gevent", "gthread"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    env = {
        **os.environ,
        "THREADRUN_HOST": "127.0.0.1",
        "THREADRUN_PORT": str(port),
        "THREADRUN_WEB_WORKERS": "1",
        "THREADRUN_WEB_THREADS": "4",
        "THREADRUN_WEB_WORKER_CLASS": request.param,
        "THREADRUN_WEB_GRACEFUL_TIMEOUT_S": str(GRACE_S),
        "THREADRUN_WEB_KEEPALIVE_S": "75",
    }
    argv = [sys.executable, "-m", "gunicorn", "-c", "python:app.gunicorn_conf"]
    proc = subprocess.Popen(
        [*argv, "tests.fixtures.tiny_wsgi:app"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError("gunicorn did not start") from None
                time.sleep(0.1)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_a_stop_closes_idle_kept_alive_connections_after_a_linger(
    server: tuple[subprocess.Popen[bytes], int],
) -> None:
    """H1: SIGTERM with two idle kept-alive connections and a 30 s grace. A request sent on
    one during the linger is answered, with `Connection: close`; the other connection is
    closed by the server; the process exits well within the grace."""
    proc, port = server
    idle = socket.create_connection(("127.0.0.1", port), timeout=10)
    late = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        assert request(idle).startswith(b"HTTP/1.1 200")
        assert request(late).startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.7)  # the worker has seen the stop; the linger has not ended
        head = request(late).lower()
        assert head.startswith(b"http/1.1 200") and b"connection: close" in head
        wait_eof(idle)
        assert time.monotonic() - t0 < WITHIN_S
        assert proc.wait(WITHIN_S) == 0
    finally:
        idle.close()
        late.close()
