"""An ASGI app behind threadrun's WSGI server: one asyncio loop on a native thread per web
process, a2wsgi's responder per request, and the ASGI lifespan run on that loop.

Why a2wsgi with a loop we start, and not a2wsgi's own loop or a loop of our own per request:
a2wsgi starts its loop with `threading.Thread`, which the gevent worker's `patch_all()` turns
into a greenlet. An asyncio loop in a greenlet leaves CPython's "running loop" (kept per OS
thread, not per greenlet) set for every other greenlet of the process while it waits, so any
`asyncio.run()` elsewhere in the web process would fail with "cannot be called from a running
event loop". The loop here runs on an unpatched native thread (gevent's
`get_original("_thread", "start_new_thread")`) with the unpatched selector; the request's
greenlet waits on a2wsgi's `threading.Event`, which under gevent is a gevent Event that a
native thread may set (it wakes the hub through its thread-safe async watcher). Under the
gthread worker the same code runs on ordinary threads. A loop per request would rebuild the
app's state (its lifespan, its clients) for every call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Iterable
from typing import Any

from a2wsgi import ASGIMiddleware

from shared.project import ProjectConfigError

log = logging.getLogger(__name__)

LIFESPAN_TIMEOUT_S = 30.0

ASGIApp = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _native(module: str, name: str) -> Any:
    """The unpatched `module.name` when gevent has patched it, else the module's own."""
    try:
        from gevent import monkey
    except ImportError:  # pragma: no cover - gevent is a dependency
        monkey = None
    if monkey is not None and monkey.is_module_patched(module):
        return monkey.get_original(module, name)
    return getattr(__import__(module), name)


class LifespanFailed(ProjectConfigError):
    """The ASGI app answered `lifespan.startup.failed`: the web process does not start."""


class Lifespan:
    """The ASGI lifespan protocol of one app, driven from outside its loop."""

    def __init__(self, app: ASGIApp, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop
        self.supported = True
        self._task: concurrent.futures.Future[None] | None = None
        self._inbox: asyncio.Queue[dict[str, Any]] | None = None
        self._outbox: asyncio.Queue[dict[str, Any]] | None = None

    async def _start(self) -> dict[str, Any]:
        self._inbox, self._outbox = asyncio.Queue(), asyncio.Queue()
        inbox, outbox = self._inbox, self._outbox
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}

        async def run() -> None:
            try:
                await self.app(scope, inbox.get, outbox.put)
            except Exception as exc:  # noqa: BLE001 - the spec: no lifespan support raises
                await outbox.put({"type": "threadrun.lifespan.error", "error": exc})

        asyncio.ensure_future(run())
        await inbox.put({"type": "lifespan.startup"})
        return await outbox.get()

    async def _stop(self) -> dict[str, Any]:
        assert self._inbox is not None and self._outbox is not None
        await self._inbox.put({"type": "lifespan.shutdown"})
        return await self._outbox.get()

    def startup(self) -> None:
        """Run the app's startup; raise LifespanFailed when it fails."""
        answer = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(
            LIFESPAN_TIMEOUT_S
        )
        kind = answer.get("type")
        if kind == "threadrun.lifespan.error":
            # The spec: an app that does not support lifespan raises; the server goes on.
            self.supported = False
            log.info("custom app has no lifespan (%s)", answer["error"])
            return
        if kind != "lifespan.startup.complete":
            raise LifespanFailed(answer.get("message") or f"lifespan startup answered {kind!r}")

    def shutdown(self) -> None:
        """Run the app's shutdown (errors are logged: the process is leaving anyway)."""
        if not self.supported or self._inbox is None:
            return
        try:
            answer = asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(
                LIFESPAN_TIMEOUT_S
            )
        except Exception:
            log.exception("custom app lifespan shutdown failed")
            return
        if answer.get("type") != "lifespan.shutdown.complete":
            log.warning("custom app lifespan shutdown answered %r", answer)


class AsgiBridge:
    """An ASGI app as a WSGI callable, on its own loop thread, lifespan included."""

    def __init__(self, app: ASGIApp) -> None:
        selector = _native("selectors", "DefaultSelector")()
        self.loop = asyncio.SelectorEventLoop(selector)
        _native("_thread", "start_new_thread")(self._run, ())
        self.asgi = app
        self.wsgi: WSGIApp = ASGIMiddleware(app, loop=self.loop)  # type: ignore[assignment]
        self.lifespan = Lifespan(app, self.loop)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        """The app's lifespan startup, once per web process."""
        self.lifespan.startup()

    def close(self) -> None:
        """The app's lifespan shutdown, then stop the loop."""
        self.lifespan.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
