"""LangChain's thread streaming protocol, as the SDK's `client.threads.stream` speaks it
(`langgraph_sdk/stream/`, types in `langchain_protocol`), on threadrun's bridge:

- `POST /threads/{id}/commands`: one command, one answer (commands.py);
- `POST /threads/{id}/stream/events`: an SSE stream of the thread's protocol events that
  match the body's channels and namespaces, after its `since` (the seq of the last event the
  client has): the SSE `id` is the seq, the `event` the method;
- `WS /threads/{id}/stream/events`: every inbound frame a command (the subscription commands
  included), events of the socket's subscriptions outbound.

Events come from the runs' own Redis Streams through the thread follower, so a reconnect
after any seq resumes exactly (no duplicate, no loss) on any web process, and events the
client needs that are gone are an unsolicited `resume_gap` error, never silence
(shared/bridge/protocol.py). The filter is the SDK's own `matches_subscription`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Flask, Response, stream_with_context
from flask_sock import Sock
from langgraph_sdk.stream.subscription import matches_subscription
from simple_websocket import ConnectionClosed, Server

from app import public_ids
from app.api.threads import owned_thread
from app.auth import principal
from app.http import body, streams_events
from app.protocols.thread_stream import commands
from app.protocols.thread_stream.commands import CommandError, Handler, answer, error, success
from app.protocols.thread_stream.schemas import Command, EventStreamRequest
from app.protocols.thread_stream.source import StoreSource
from app.responses import json_response
from app.services import Services, current_services
from app.streaming.sse import HEARTBEAT
from app.streaming.upgrade import guard
from shared import serde
from shared.bridge.base import Heartbeat
from shared.bridge.protocol import ProtocolItem, ProtocolWalk
from shared.errors import ThreadrunError
from shared.ops.connections import TRACKER

log = logging.getLogger(__name__)
bp = Blueprint("thread_stream_protocol", __name__)
ws_bp = Blueprint("thread_stream_protocol_ws", __name__)
sock = Sock()  # routes on ws_bp only; the server options are the app's (app/streaming/ws.py)
guard(ws_bp)  # authenticated and counted before the socket exists, as the chat socket is

_NOT_ON_HTTP = (
    "subscriptions belong to a connection: POST /threads/{id}/stream/events with the filter,"
    " or send this command on WS /threads/{id}/stream/events"
)


def _not_on_http(_thread_id: str, _params: dict[str, Any]) -> dict[str, Any]:
    raise CommandError("not_supported", _NOT_ON_HTTP)


HANDLERS: dict[str, Handler] = {
    "run.start": commands.run_start,
    "input.respond": commands.input_respond,
    "input.inject": commands.input_inject,
    "state.get": commands.state_get,
    "state.listCheckpoints": commands.list_checkpoints,
    "state.fork": commands.state_fork,
    "agent.getTree": commands.agent_tree,
    "subscription.subscribe": _not_on_http,
    "subscription.unsubscribe": _not_on_http,
    "subscription.reconnect": _not_on_http,
}


def init_app(app: Flask) -> None:
    """Register the routes on `app`."""
    app.register_blueprint(bp)
    app.register_blueprint(ws_bp)


def _walk(svc: Services) -> ProtocolWalk:
    return ProtocolWalk(svc.follower, svc.subscriber, StoreSource(svc.store, principal().user_id))


# --- HTTP ---------------------------------------------------------------------------------
@bp.post("/threads/<thread_id>/commands")
@body(Command)
def command(thread_id: str, body: Command) -> Response:
    """One protocol command on the caller's thread; its answer (a protocol error for what
    the command asks that cannot be done)."""
    raw = body.model_dump()
    return json_response(answer(thread_id, raw, HANDLERS))


@bp.post("/threads/<thread_id>/stream/events")
@streams_events
@body(EventStreamRequest)
def stream_events(thread_id: str, body: EventStreamRequest) -> Response:
    """The thread's protocol events matching the filter, after `since`, until the client
    leaves (or the thread is deleted)."""
    svc = current_services()
    thread = owned_thread(thread_id)  # 404 before any byte
    wanted = body.subscription()
    batches = _walk(svc).walk(thread.thread_id, body.since)
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return Response(
        stream_with_context(_sse(batches, wanted)), mimetype="text/event-stream", headers=headers
    )


def _sse(batches: Iterator[list[ProtocolItem]], wanted: dict[str, Any]) -> Iterator[bytes]:
    """SSE frames: `id` the seq, `event` the method; errors as `event: error`."""
    ticket = TRACKER.open("sse")
    try:
        for batch in batches:
            out: list[bytes] = []
            for item in batch:
                if isinstance(item, Heartbeat):
                    out.append(HEARTBEAT)
                elif item.get("type") == "error":
                    out.append(b"event: error\ndata: " + serde.dumps(item) + b"\n\n")
                elif matches_subscription(item, wanted):  # type: ignore[arg-type]
                    head = f"id: {item['seq']}\nevent: {item['method']}\ndata: ".encode()
                    out.append(head + serde.dumps(item) + b"\n\n")
            if out:
                yield b"".join(out)
    finally:
        TRACKER.close(ticket)


# --- WebSocket ----------------------------------------------------------------------------
@sock.route("/threads/<thread_id>/stream/events", bp=ws_bp)
def stream_socket(ws: Server, thread_id: str) -> None:
    """Commands in, answers and the subscriptions' events out."""
    ticket = TRACKER.open("ws")
    try:
        try:
            thread = owned_thread(thread_id)
        except ThreadrunError as exc:
            # A browser cannot read a refused upgrade's status: 4000 + the status.
            ws.close(4000 + getattr(exc, "status", 404), str(exc)[:120])
            return
        _Socket(ws, current_services(), thread_id, thread.thread_id).serve()
    except ConnectionClosed:
        pass
    except Exception:  # after the upgrade an exception would be an HTTP 500 on the socket
        log.exception("thread stream socket failed")
        with contextlib.suppress(Exception):
            ws.close(1011, "internal error")
    finally:
        TRACKER.close(ticket)


class _Socket:
    """One protocol WebSocket: its subscriptions, and the walk that feeds them (started by
    the first `subscription.subscribe`, from its `since`)."""

    def __init__(self, ws: Server, svc: Services, public_id: str, storage_id: str) -> None:
        self.ws = ws
        self.svc = svc
        self.public_id = public_id
        self.storage_id = storage_id
        self.subscriptions: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.walker: threading.Thread | None = None
        self.walk = _walk(svc)
        self.aliases = public_ids.aliases()  # resolved by owned_thread in this request

    def send(self, message: dict[str, Any]) -> None:
        # Public thread ids in place of storage ids (A4), as the SSE answer's are.
        text = serde.dumps_str(message)
        with self.lock:
            self.ws.send(public_ids.protocol_text(text, self.aliases))

    def serve(self) -> None:
        try:
            while True:
                raw = self.ws.receive()
                if raw is None:
                    continue
                self.send(self.handle(raw))
        finally:
            self.closed.set()

    def handle(self, raw: str | bytes) -> dict[str, Any]:
        try:
            frame = serde.loads(raw)
        except ValueError:
            return error(None, "invalid_argument", "a command frame must be JSON")
        if (
            not isinstance(frame, dict)
            or not isinstance(frame.get("id"), int)
            or isinstance(frame.get("id"), bool)
            or not isinstance(frame.get("method"), str)
        ):
            cid = frame.get("id") if isinstance(frame, dict) else None
            return error(
                cid if isinstance(cid, int) else None,
                "invalid_argument",
                "a command needs an integer id and a string method",
            )
        method = frame["method"]
        if method.startswith("subscription."):
            try:
                params = commands.params_of(method, frame.get("params"))
            except CommandError as exc:
                return error(frame["id"], exc.code, exc.message)
            return success(frame["id"], self.subscription(method, params, frame.get("params")))
        return answer(self.public_id, frame, HANDLERS)

    def subscription(self, method: str, params: dict[str, Any], raw: Any) -> dict[str, Any]:
        if method == "subscription.unsubscribe":
            self.subscriptions.pop(params["subscription_id"], None)
            return {}
        if method == "subscription.reconnect":
            wanted = params.get("subscriptions") or []
            return {"restored": all(s in self.subscriptions for s in wanted)}
        sid = f"sub-{len(self.subscriptions) + 1}"
        self.subscriptions[sid] = dict(params)
        if self.walker is None:
            since = raw.get("since") if isinstance(raw, dict) else None
            since = since if isinstance(since, int) and not isinstance(since, bool) else None
            self.walker = threading.Thread(target=self.relay, args=(since,), daemon=True)
            self.walker.start()
        return {"subscription_id": sid}

    def relay(self, since: int | None) -> None:
        try:
            for batch in self.walk.walk(self.storage_id, since):
                if self.closed.is_set():
                    return
                for item in batch:
                    if isinstance(item, Heartbeat):
                        continue  # the socket has its pings
                    subs = list(self.subscriptions.values())
                    if item.get("type") == "error" or any(
                        matches_subscription(item, s)  # type: ignore[arg-type]
                        for s in subs
                    ):
                        self.send(item)
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("thread stream socket relay failed")
            with contextlib.suppress(Exception):
                self.send(error(None, "unknown_error", "the thread's event stream failed"))
                self.ws.close(1011, "stream failed")
