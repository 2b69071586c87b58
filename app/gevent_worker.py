"""gunicorn's gevent worker, whose idle kept-alive connections do not hold up a stop.

The web server keeps an idle connection `web_keepalive_s` (75 s): longer than the clients'
pools keep theirs, so that a client never reuses a connection the server is closing (app/
gunicorn_conf.py). gunicorn's gevent worker, stopping, waits for every open connection up to
`graceful_timeout` and then kills them, and an idle one stays open until its keep-alive
ends: every stop (a deploy, a Ctrl-C of `make run`, `max_requests`) with one client
connected would have waited the whole grace. gunicorn's gthread worker does not: a stopping
gthread worker keeps its kept-alive connections `STOP_KEEPALIVE_LINGER` (2 s, at most the
keep-alive) for a request a client may already be sending, answered with
`Connection: close`, then closes them. This worker does the same under gevent.

Written here because gunicorn's gevent worker has no hook for it: the one place that knows
a connection is idle is the timeout around the wait for its next request (`timeout_ctx`),
and the one that knows its socket is `handle`.
"""

from __future__ import annotations

import contextlib
import socket
from types import TracebackType
from typing import Any

import gevent
from gevent import getcurrent
from gunicorn.workers import ggevent

STOP_KEEPALIVE_LINGER = 2.0
"""How long a stopping worker keeps an idle connection open (gunicorn's gthread value)."""
STOP_POLL_S = 0.5
"""How often the stop watcher looks whether the worker is stopping (gunicorn's own loop: 1 s)."""
CLOSE_EVERY_S = 0.1


class _IdleWait:
    """The keep-alive timeout around one wait for a request, recording the wait as idle."""

    def __init__(self, idle: set[Any], timeout: Any) -> None:
        self._idle = idle
        self._timeout = timeout

    def __enter__(self) -> None:
        self._idle.add(getcurrent())
        self._timeout.__enter__()

    def __exit__(
        self,
        typ: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._idle.discard(getcurrent())
        return bool(self._timeout.__exit__(typ, value, tb))


class GeventWorker(ggevent.GeventWorker):  # type: ignore[misc]  # gunicorn has no types
    """`gevent` with idle connections closed STOP_KEEPALIVE_LINGER after a stop begins."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sockets_by_handler: dict[Any, socket.socket] = {}
        self._idle: set[Any] = set()

    def handle(self, listener: Any, client: socket.socket, addr: Any) -> None:
        me = getcurrent()
        self._sockets_by_handler[me] = client
        try:
            super().handle(listener, client, addr)
        finally:
            self._sockets_by_handler.pop(me, None)

    def timeout_ctx(self) -> _IdleWait:
        return _IdleWait(self._idle, super().timeout_ctx())

    def run(self) -> None:
        gevent.spawn(self._close_idle_once_stopping)
        super().run()

    def _close_idle_once_stopping(self) -> None:
        """Wait for the stop, linger, then shut every idle connection's socket down (its
        handler reads end-of-file and returns); a busy one closes itself after its response
        (gunicorn answers `Connection: close` once the worker is not alive)."""
        while self.alive:
            gevent.sleep(STOP_POLL_S)
        gevent.sleep(min(STOP_KEEPALIVE_LINGER, float(self.cfg.keepalive)))
        while True:
            for handler in list(self._idle):
                sock = self._sockets_by_handler.get(handler)
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
            gevent.sleep(CLOSE_EVERY_S)
