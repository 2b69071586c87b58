"""A WebSocket route of the custom ASGI app (`http.app`): the socket on the gevent side, the
app driven with the ASGI websocket protocol on the bridge's loop thread (bridge.py).

The upgrade request's greenlet (a thread under gthread) holds the socket the way flask-sock
does for threadrun's own `/ws`: simple-websocket's `Server` takes it from the WSGI environ
and answers the handshake, with threadrun's socket options (`SOCK_SERVER_OPTIONS`: pings,
`ws_max_frame_bytes`), whole-frame writes (`WholeFrames`) and its teardown. In order:

1. **connect**: the app's task starts on the loop with a `websocket` scope (path, root_path,
   query_string, headers, subprotocols, client, server, the lifespan's state, the caller
   under custom-route auth); its first `receive()` is `websocket.connect`.
2. **the app's answer** decides the handshake: `websocket.accept` -> 101 with the app's
   subprotocol (one the client offered) and headers; `websocket.close` -> 403, as the ASGI
   spec says; the denial-response extension (`websocket.http.response.start` / `.body`) ->
   that response; the app failing or returning first -> 500; no answer within
   ACCEPT_TIMEOUT_S -> the app is cancelled, 500.
3. **frames**: `websocket.receive` (text or bytes) for each client message,
   `websocket.send` out to the client; the app's `websocket.close` closes the socket with
   its code and reason.
4. **the end**: the client's close (or a vanished client: a reset, EOF or a missed pong)
   reaches the app as `websocket.disconnect` with the close code, and its `send()` raises
   `ClientDisconnected` (an OSError, as the spec asks) from then on; an app that has not
   ended DISCONNECT_GRACE_S later is cancelled, so no task outlives its client. An app that
   returns without closing closes the socket with 1000, one that fails with 1011.

Neither side ever waits on the other. The greenlet hands messages to the loop with
`call_soon_threadsafe` only; the loop hands messages to the greenlet through a deque and a
`threading.Event` (gevent's Event under the gevent worker, which a native thread may set, as
a2wsgi's responder relies on). Each direction holds at most MAX_PENDING messages: an app
that sends faster than its client reads waits in `send()` (an asyncio wait: the loop's other
tasks run on) while the greenlet's blocked write waits for TCP; a client that sends faster
than the app reads is not handed more than that to the loop, the rest waits in
simple-websocket's buffer (frames capped at `ws_max_frame_bytes`, as on threadrun's sockets).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any, Protocol

from simple_websocket import ConnectionClosed, Server
from wsproto.events import AcceptConnection, Event

from app.streaming.ws_socket import WholeFrames
from shared.errors import ThreadrunError
from shared.ops.connections import TRACKER

log = logging.getLogger(__name__)

MAX_PENDING = 64
"""Messages one direction holds before its sender waits (see the module docstring)."""
ACCEPT_TIMEOUT_S = 30.0  # the app's answer to `websocket.connect`
DISCONNECT_GRACE_S = 5.0  # after the client left, before the app's task is cancelled
POLL_S = 1.0  # the greenlets' waits: a stop is noticed within this
CLOSE_WAIT_S = 2.0  # how long simple-websocket's reader gets to see the peer's close
CLOSE_NORMAL, CLOSE_INTERNAL_ERROR = 1000, 1011

APP_DONE = "threadrun.app_done"
CLIENT_GONE = "threadrun.client_gone"

ASGIApp = Callable[..., Any]
StartResponse = Callable[..., Any]


class SocketRules(Protocol):
    """The web's rules for one socket (threadrun's under custom-route auth: the caller's
    connection slot, credential re-check and frame rate; app/project_http/__init__.py)."""

    def tick(self) -> tuple[int, str] | None:
        """About every POLL_S while the socket is open: a close code and reason to end it."""

    def pace(self) -> None:
        """Before each client frame is read: wait while the client is over its frame rate."""


class ClientDisconnected(ThreadrunError, OSError):
    """The app sent on a socket its client has left (the ASGI spec: an OSError)."""


def is_upgrade(environ: dict[str, Any]) -> bool:
    """Whether this request asks for a WebSocket."""
    upgrade = str(environ.get("HTTP_UPGRADE", "")).lower()
    return environ.get("REQUEST_METHOD") == "GET" and upgrade == "websocket"


def websocket_scope(http_scope: dict[str, Any]) -> dict[str, Any]:
    """The ASGI `websocket` scope of an upgrade request, from a2wsgi's `http` scope of it."""
    scope = {k: v for k, v in http_scope.items() if k != "method"}
    offered = dict(scope["headers"]).get(b"sec-websocket-protocol", b"").decode("latin-1")
    scope.update(
        type="websocket",
        scheme="wss" if scope.get("scheme") == "https" else "ws",
        subprotocols=[p.strip() for p in offered.split(",") if p.strip()],
        extensions={"websocket.http.response": {}},
    )
    scope["asgi"] = {"version": "3.0", "spec_version": "2.4"}
    return scope


class _ToGreenlet:
    """Messages from the loop thread to the greenlet: a deque and a threading Event."""

    def __init__(self) -> None:
        self._items: collections.deque[dict[str, Any]] = collections.deque()
        self._ready = threading.Event()

    def put(self, message: dict[str, Any]) -> None:
        """Any thread; never blocks."""
        self._items.append(message)
        self._ready.set()

    def get(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or None after `timeout` (one consumer)."""
        while not self._items:
            if not self._ready.wait(timeout):
                return None
            self._ready.clear()
        return self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)


class _AcceptWith:
    """The socket's wsproto connection during the handshake: the app's accept headers added
    to the 101 (simple-websocket sends none of its own)."""

    def __init__(self, conn: Any, headers: list[tuple[bytes, bytes]]) -> None:
        self._conn = conn
        self._headers = headers

    def send(self, event: Event) -> bytes:
        if isinstance(event, AcceptConnection) and self._headers:
            event = AcceptConnection(
                subprotocol=event.subprotocol,
                extensions=event.extensions,
                extra_headers=[*event.extra_headers, *self._headers],
            )
        return bytes(self._conn.send(event))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _AcceptingServer(Server):  # type: ignore[misc]
    """simple-websocket's Server answering with the app's subprotocol and headers."""

    ws: Any  # its wsproto connection (set by simple-websocket before the handshake)

    def __init__(
        self,
        environ: dict[str, Any],
        subprotocol: str | None,
        headers: list[tuple[bytes, bytes]],
        options: dict[str, Any],
    ) -> None:
        self._accept_headers = headers
        super().__init__(environ, subprotocols=[subprotocol] if subprotocol else None, **options)

    def handshake(self) -> None:
        raw = self.ws
        self.ws = _AcceptWith(raw, self._accept_headers)
        try:
            super().handshake()
        finally:
            self.ws = raw


class AsgiWebSocket:
    """One WebSocket of the custom app: its ASGI task on `loop`, its socket here."""

    def __init__(self, app: ASGIApp, loop: asyncio.AbstractEventLoop, scope: dict[str, Any]):
        self.app = app
        self.loop = loop
        self.scope = scope
        self.to_client = _ToGreenlet()
        self.to_app: collections.deque[dict[str, Any]] = collections.deque()
        self.room_for_app = threading.Event()  # set by the loop as the app reads
        self.task: asyncio.Task[None] | None = None
        self.done = threading.Event()
        self.gone = False  # the client left (or the socket was closed): no more frames
        self._ending = threading.Lock()
        self._ended = False
        self._arrived: asyncio.Event | None = None
        self._credits: asyncio.Semaphore | None = None

    # -- the loop thread ---------------------------------------------------------------------
    def _start(self) -> None:
        self._arrived = asyncio.Event()
        self._credits = asyncio.Semaphore(MAX_PENDING)
        if self.to_app:
            self._arrived.set()
        self.task = self.loop.create_task(self._run())

    async def _run(self) -> None:
        error: BaseException | None = None
        try:
            await self.app(self.scope, self._receive, self._send)
        except asyncio.CancelledError as exc:
            error = exc
        except Exception as exc:  # reported to the greenlet: 500 or 1011
            error = exc
            if not isinstance(exc, ClientDisconnected):
                log.exception("custom app websocket %s failed", self.path)
        finally:
            self.done.set()
            self.to_client.put({"type": APP_DONE, "error": error})

    def _wake(self) -> None:
        assert self._arrived is not None
        self._arrived.set()

    async def _receive(self) -> dict[str, Any]:
        assert self._arrived is not None
        while not self.to_app:
            await self._arrived.wait()
            self._arrived.clear()
        message = self.to_app.popleft()
        if len(self.to_app) < MAX_PENDING:
            self.room_for_app.set()
        return message

    async def _send(self, message: dict[str, Any]) -> None:
        assert self._credits is not None
        if not self.gone:
            await self._credits.acquire()
        if self.gone:  # nothing reaches the client any more
            if message.get("type") == "websocket.send":
                raise ClientDisconnected("the client has left this WebSocket")
            return
        self.to_client.put(message)

    def _credit(self) -> None:
        assert self._credits is not None
        self._credits.release()

    def _over(self) -> None:
        """The socket is over: a `send()` waiting for room wakes (and fails); a task still
        running DISCONNECT_GRACE_S from now is cancelled."""
        assert self._credits is not None
        for _ in range(MAX_PENDING):
            self._credits.release()

        def cancel() -> None:
            if self.task is not None and not self.task.done():
                log.info("custom app websocket %s: cancelled after its client left", self.path)
                self.task.cancel()

        self.loop.call_later(DISCONNECT_GRACE_S, cancel)

    # -- the greenlet (any thread but the loop's) ----------------------------------------------
    def start(self) -> None:
        """Start the app's task; its first `receive()` is `websocket.connect`."""
        self.to_app.append({"type": "websocket.connect"})
        self.loop.call_soon_threadsafe(self._start)

    def tell_app(self, message: dict[str, Any]) -> None:
        """Queue a message for the app's `receive()` (never blocks)."""
        self.to_app.append(message)
        self.loop.call_soon_threadsafe(self._wake)

    def from_app(self, timeout: float) -> dict[str, Any] | None:
        """The app's next message (None after `timeout`); a sent frame frees its place."""
        message = self.to_client.get(timeout)
        if message is not None and message["type"] not in (APP_DONE, CLIENT_GONE):
            self.loop.call_soon_threadsafe(self._credit)
        return message

    @property
    def path(self) -> str:
        return str(self.scope.get("path", ""))

    def end(self, code: int, reason: str = "") -> None:
        """The socket is over (once, from any thread but the loop's): the app hears
        `websocket.disconnect` with `code`, and the loop cancels a task that has not ended
        DISCONNECT_GRACE_S later; nobody here waits for it."""
        with self._ending:
            if self._ended:
                return
            self._ended = True
        self.gone = True
        self.tell_app({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.loop.call_soon_threadsafe(self._over)

    def cancel(self) -> None:
        """Cancel the app's task now (from any thread)."""

        def cancel() -> None:
            if self.task is not None:
                self.task.cancel()

        self.gone = True
        self.loop.call_soon_threadsafe(cancel)

    def wait_room(self, ws: Server) -> bool:
        """Wait while the app has MAX_PENDING unread messages; False once the socket ends
        (the app's task, or the socket: its reader still sees the client's close)."""
        while len(self.to_app) >= MAX_PENDING:
            if self.gone or self.done.is_set() or not ws.connected:
                return False
            self.room_for_app.wait(POLL_S)
            self.room_for_app.clear()
        return not self.gone


def serve(
    app: ASGIApp,
    loop: asyncio.AbstractEventLoop,
    scope: dict[str, Any],
    environ: dict[str, Any],
    start_response: StartResponse,
    options: dict[str, Any],
    rules: SocketRules | None = None,
) -> Iterable[bytes]:
    """Serve one upgrade request to the custom app's WebSocket route (the module docstring):
    `options` are simple-websocket's Server options, `rules` the web's rules for the socket
    (None: the app's own socket, as on the official server)."""
    version = environ.get("HTTP_SEC_WEBSOCKET_VERSION")
    if not environ.get("HTTP_SEC_WEBSOCKET_KEY") or version != "13":
        return _plain(start_response, "400 Bad Request", b"not a WebSocket version 13 handshake")
    session = AsgiWebSocket(app, loop, scope)
    session.start()
    answer = session.from_app(ACCEPT_TIMEOUT_S)
    kind = answer["type"] if answer is not None else None
    if kind == "websocket.accept":
        assert answer is not None
        return _serve_accepted(session, answer, environ, start_response, options, rules)
    if kind == "websocket.http.response.start":
        assert answer is not None
        return _denial(session, answer, start_response)
    if kind == "websocket.close":
        session.end(1006)
        return _plain(start_response, "403 Forbidden", b"")
    if answer is None:
        log.warning("custom app websocket %s: no accept or close in time", session.path)
        session.cancel()
    elif kind != APP_DONE:
        log.warning("custom app websocket %s sent %r before accepting", session.path, kind)
        session.end(1006)
    return _plain(start_response, "500 Internal Server Error", b"Internal Server Error")


def _plain(start_response: StartResponse, status: str, body: bytes) -> list[bytes]:
    start_response(
        status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
    )
    return [body]


def _denial(
    session: AsgiWebSocket, start: dict[str, Any], start_response: StartResponse
) -> Iterable[bytes]:
    """The denial-response extension: the app's own HTTP response instead of the upgrade."""
    status = int(start.get("status", 403))
    headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in start.get("headers", [])]
    chunks: list[bytes] = []
    while True:
        message = session.from_app(ACCEPT_TIMEOUT_S)
        if message is None or message["type"] == APP_DONE:
            break
        if message["type"] == "websocket.http.response.body":
            chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                break
    body = b"".join(chunks)
    if not any(n.lower() == "content-length" for n, _ in headers):
        headers.append(("Content-Length", str(len(body))))
    session.end(1006)
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    start_response(f"{status} {phrase}", headers)
    return [body]


def _serve_accepted(
    session: AsgiWebSocket,
    accept: dict[str, Any],
    environ: dict[str, Any],
    start_response: StartResponse,
    options: dict[str, Any],
    rules: SocketRules | None,
) -> Iterable[bytes]:
    offered = session.scope.get("subprotocols") or []
    chosen = accept.get("subprotocol")
    headers = [(bytes(n), bytes(v)) for n, v in accept.get("headers") or []]
    try:
        ws = _AcceptingServer(environ, chosen if chosen in offered else None, headers, options)
    except Exception:  # noqa: BLE001 - a handshake wsproto refuses, or a gone socket
        log.warning("custom app websocket %s: handshake failed", session.path)
        session.end(1006)
        return _plain(start_response, "400 Bad Request", b"WebSocket handshake failed")
    ws.sock = WholeFrames(ws.sock)
    ticket = TRACKER.open("ws")  # the ops view's open connections
    pace = rules.pace if rules is not None else None
    reader = threading.Thread(
        target=_read, args=(session, ws, pace), name="asgi-ws-reader", daemon=True
    )
    try:
        reader.start()
        _pump(session, ws, rules)
    finally:
        session.end(1006)  # a no-op unless the socket failed under the pump
        TRACKER.close(ticket)
        _release(ws)
        reader.join(POLL_S + 1)
    return _finished(ws, start_response)


def _read(session: AsgiWebSocket, ws: Server, pace: Callable[[], None] | None) -> None:
    """Client -> app, until the socket ends; then `websocket.disconnect` with its code."""
    code, reason = 1006, ""
    try:
        while not session.gone and not session.done.is_set():
            if not session.wait_room(ws):
                if session.gone or session.done.is_set():
                    return
                raise ConnectionClosed(ws.close_reason, ws.close_message)
            if pace is not None:
                pace()
            data = ws.receive(timeout=POLL_S)
            if data is None:
                continue
            if isinstance(data, str):
                session.tell_app({"type": "websocket.receive", "text": data})
            else:
                session.tell_app({"type": "websocket.receive", "bytes": bytes(data)})
    except ConnectionClosed as exc:
        code, reason = int(exc.reason or 1005), str(exc.message or "")
    except Exception:  # a socket error: the client is gone
        log.debug("custom app websocket reader failed", exc_info=True)
    if not session.gone:  # the client left: the app hears it, the pump wakes
        session.end(code, reason)
        session.to_client.put({"type": CLIENT_GONE})


def _pump(session: AsgiWebSocket, ws: Server, rules: SocketRules | None) -> None:
    """App -> client, until the app's task ends, closes the socket, its client leaves, or the
    web's rules end it (a credential no longer valid)."""
    while True:
        verdict = rules.tick() if rules is not None else None
        if verdict is not None:
            code, reason = verdict
            with contextlib.suppress(Exception):  # the client left already
                ws.close(reason=code, message=reason)
            session.end(code, reason)
            return
        message = session.from_app(POLL_S)
        if message is None:
            continue
        kind = message["type"]
        if kind == APP_DONE:  # returned without closing: 1000; failed: 1011
            session.gone = True  # the reader stops; the app is past hearing anything
            code = CLOSE_INTERNAL_ERROR if message.get("error") is not None else CLOSE_NORMAL
            with contextlib.suppress(Exception):  # the client left already
                ws.close(reason=code)
            return
        if kind == CLIENT_GONE:
            return
        if kind == "websocket.send":
            text, data = message.get("text"), message.get("bytes")
            try:
                ws.send(text if text is not None else bytes(data or b""))
            except Exception:  # noqa: BLE001 - ConnectionClosed, OSError: the client left
                session.end(1006)
                return
        elif kind == "websocket.close":
            code = int(message.get("code") or CLOSE_NORMAL)
            reason = str(message.get("reason") or "")
            with contextlib.suppress(Exception):  # the client left already
                ws.close(reason=code, message=reason or None)
            session.end(code, reason)
            return


def _release(ws: Server) -> None:
    """Let simple-websocket's reader thread see the peer's close, then drop the socket (as
    app/streaming/ws.py does for threadrun's sockets)."""
    with contextlib.suppress(Exception):  # already closed (by the peer or by us)
        ws.close()
    reader = getattr(ws, "thread", None)
    if reader is None:
        return
    reader.join(timeout=CLOSE_WAIT_S)
    if reader.is_alive():
        with contextlib.suppress(OSError):
            ws.sock.shutdown(socket.SHUT_RDWR)
        reader.join(timeout=1)


def _finished(ws: Server, start_response: StartResponse) -> Iterable[bytes]:
    """The end of the upgrade request, as flask-sock ends it: gunicorn must not write a
    response on the socket (StopIteration closes the connection), werkzeug wants one."""
    if ws.mode == "gunicorn":
        raise StopIteration
    if ws.mode == "werkzeug":
        start_response("200 OK", [])
    return []
