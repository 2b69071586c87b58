"""WebSocket chat protocol (A2): `run.create`, `run.join`, `run.cancel`, `ping` over one socket.

One JSON object per text frame, both ways (docs/websocket.md is the reference). The upgrade
is authenticated like HTTP (A4) plus `?api_key=`, and refused with a 401 JSON body before
the socket is accepted. Each followed run has its own subscription thread reading the
run's Redis Stream through the web's StreamSubscriber and subscription hub (same replay,
gap and end semantics as SSE: B4-B7); the threads share one send lock, and closing the
socket stops all of them. A slow client only delays its
own socket: runs publish to Redis independently, and a reader that falls behind the
retained window gets a `gap` frame (B5).

Malformed input never kills the handler: non-JSON or binary frames close the socket with
1007; a frame above `ws_max_frame_bytes` gets an `error` frame naming the limit, then close
1009; anything else wrong with a frame is answered with an `error` frame and the socket
keeps serving.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, Flask, g
from flask_sock import Sock
from simple_websocket import ConnectionClosed, Server
from werkzeug.exceptions import HTTPException

from app import public_ids
from app.admission import admit_run
from app.api.shapes import run_json
from app.auth import principal
from app.errors import (
    DENIED_CODES,
    SERVICE_ERRORS,
    SERVICE_RETRY_AFTER_S,
    LimitExceeded,
    limit_body,
    log_unavailable,
    unavailable_message,
    unavailable_service,
)
from app.http import validate
from app.ids import checked_run_id
from app.limits import ConnectionSlot, TokenBucket
from app.schemas import RunCreate
from app.services import Services, current_services
from app.streaming import frames
from app.streaming.frames import EndFrame, HeartbeatFrame
from app.streaming.upgrade import CLOSE_UNAUTHORIZED, credential_still_valid, guard
from app.streaming.ws_frames import (
    CancelFrame,
    FrameError,
    JoinFrame,
    checked_modes,
    dump,
    encode,
    request_id_of,
)
from app.streaming.ws_socket import ExplainTooBig, WholeFrames
from shared import serde
from shared.authz.decide import Denied
from shared.bridge.base import BEFORE_FIRST, END_EVENT
from shared.bridge.subscriber import StreamSubscriber
from shared.errors import StreamCursorInvalid, ThreadrunError, ValidationFailed
from shared.ops.connections import TRACKER
from shared.redis_keys import Keys
from shared.runs.model import CancelAction, OnDisconnect

log = logging.getLogger(__name__)

bp = Blueprint("ws", __name__)
sock = Sock()

# Close codes (RFC 6455): 1007 = a frame that is not JSON text, 1009 = a frame above
# ws_max_frame_bytes (sent by simple-websocket), 1011 = the handler itself failed.
CLOSE_INVALID_PAYLOAD = 1007
CLOSE_INTERNAL_ERROR = 1011
MAX_SUBSCRIPTIONS = 16  # runs one socket may follow at once
MAX_POLL_S = 1.0  # a subscription thread notices a closed socket within this
# The frame loop notices a socket closed by a failed send this late; each poll wakes every
# idle socket (5,000 idle sockets: 66% -> 47% of a core in bench/streams.py from 1 s to 5 s).
RECEIVE_POLL_S = 5.0
CLOSE_WAIT_S = 2.0  # how long the peer gets to answer our close frame
PING_INTERVAL_S = 25  # protocol-level pings detect dead peers (a leaked handler otherwise)


def init_app(app: Flask) -> None:
    """Register the WebSocket routes on `app` (after Services are built)."""
    settings = app.extensions["threadrun"].settings
    app.config.setdefault(
        "SOCK_SERVER_OPTIONS",
        {"max_message_size": settings.ws_max_frame_bytes, "ping_interval": PING_INTERVAL_S},
    )
    sock.init_app(app)
    app.register_blueprint(bp)


guard(bp)  # authenticated and counted before the socket exists (app/streaming/upgrade.py)


@sock.route("/ws", bp=bp)
def ws_root(ws: Server) -> None:
    """A socket whose frames name their `thread_id`."""
    _serve(ws, None)


@sock.route("/threads/<thread_id>/ws", bp=bp)
def ws_thread(ws: Server, thread_id: str) -> None:
    """A socket whose frames default to this thread."""
    _serve(ws, thread_id)


def _serve(ws: Server, default_thread_id: str | None) -> None:
    # Nothing may escape: after the upgrade an exception would become an HTTP 500 written
    # onto the WebSocket.
    ws.sock = WholeFrames(ws.sock)
    ws.ws = ExplainTooBig(ws.ws, current_services().settings.ws_max_frame_bytes)
    session = None
    ticket = TRACKER.open("ws")  # the ops view's open connections
    try:
        session = _Session(ws, current_services(), principal().user_id, default_thread_id)
        session.conn = g.get("ws_conn")
        session.serve()
    except Exception:  # last resort; the frame loop handles its own errors
        log.exception("websocket handler failed")
        if session is not None:
            session.close(CLOSE_INTERNAL_ERROR, "internal error")
    finally:
        TRACKER.close(ticket)
        _release(ws)


def _release(ws: Server) -> None:
    """Let simple-websocket's reader thread finish before gunicorn closes the socket.

    With `ping_interval` that (non-daemon) thread waits in select() on the socket; once gunicorn
    closes the fd it would only wake at its next ping, up to PING_INTERVAL_S later, and hold
    up a worker's shutdown meanwhile. The peer normally answers our close at once; if not,
    shutting the socket down wakes the thread.
    """
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


def _poll_subscriber(svc: Services) -> tuple[StreamSubscriber, float]:
    """A subscriber whose waits last at most MAX_POLL_S, so a thread stops promptly.

    It shares the process's subscription hub (one XREAD follows every stream) when the
    web's subscriber has one. Returned with the heartbeat interval the client should see
    (settings.stream_heartbeat_s); the thread sends a heartbeat after that much silence.
    """
    beat = svc.settings.stream_heartbeat_s
    poll = beat / max(1, math.ceil(beat / MAX_POLL_S))
    settings = svc.settings.model_copy(update={"stream_heartbeat_s": poll})
    hub = svc.subscriber.hub
    keys = Keys(svc.settings.redis_prefix)
    liveness = svc.subscriber.liveness  # idle checks shared with every stream of the process
    return StreamSubscriber(svc.redis, keys, settings, hub=hub, liveness=liveness), beat


# --- one socket ---------------------------------------------------------------------------------


@dataclass
class _Subscription:
    """One followed run on one socket."""

    run_id: str
    thread_id: str
    cursor: str
    request_id: Any
    cancel_on_disconnect: bool
    modes: list[str] | None
    admitted: bool = False  # created on this socket: followed live from its first event
    stop: threading.Event = field(default_factory=threading.Event)
    ended: bool = False
    thread: threading.Thread | None = None


class _Session:
    """The frame loop of one socket and the subscription threads it owns."""

    def __init__(
        self, ws: Server, svc: Services, owner: str, default_thread_id: str | None
    ) -> None:
        self.ws = ws
        self.svc = svc
        self.owner = owner
        self.default_thread_id = default_thread_id
        # The request's storage -> public ids, filled as frames name threads; read by the
        # sending threads too (no request context there).
        self.aliases = public_ids.aliases()
        self.closed = threading.Event()
        self._send_lock = threading.Lock()
        self._subs_lock = threading.Lock()
        self._subs: dict[str, _Subscription] = {}
        self._subscriber, self._heartbeat_s = _poll_subscriber(svc)
        self.conn: ConnectionSlot | None = None
        self._frames = TokenBucket(svc.settings.ws_frames_per_second, svc.settings.ws_frame_burst)
        self._authenticated_at = time.monotonic()
        self._limited_at = 0.0
        self._handlers: dict[str, Callable[[dict[str, Any], Any], None]] = {
            "run.create": self._create,
            "run.join": self._join,
            "run.cancel": self._cancel,
            "ping": self._ping,
        }

    # -- sending (any thread) ----------------------------------------------------------------
    def send(self, frames: list[str]) -> bool:
        """Send frames in order under the socket's lock; False once the socket is gone."""
        with self._send_lock:
            if self.closed.is_set():
                return False
            try:
                for frame in frames:
                    # Public thread ids in place of storage ids (A4, app/public_ids.py).
                    self.ws.send(public_ids.ws_frame(frame, self.aliases))
            except Exception:  # noqa: BLE001 - ConnectionClosed, OSError, wsproto state errors
                self.closed.set()
                return False
        return True

    def send_obj(self, obj: dict[str, Any]) -> bool:
        return self.send([dump(obj)])

    def error(
        self,
        code: str,
        message: str,
        request_id: Any = None,
        *,
        field: str | None = None,
        run_id: str | None = None,
    ) -> None:
        frame: dict[str, Any] = {
            "type": "error",
            "code": code,
            "message": message,
            "request_id": request_id,
        }
        if field:
            frame["field"] = field
        if run_id:
            frame["run_id"] = run_id
        self.send_obj(frame)

    def unavailable(
        self, exc: BaseException, request_id: Any = None, *, run_id: str | None = None
    ) -> None:
        """A frame failed because Redis or PostgreSQL is unreachable: the HTTP API's 503 as an
        `error` frame `service_unavailable` naming the service, with `retry_after` seconds
        (like Retry-After). The socket stays up; the same frame may succeed later."""
        service = unavailable_service(exc) or "postgres"
        log_unavailable(service, exc)
        frame: dict[str, Any] = {
            "type": "error",
            "code": "service_unavailable",
            "service": service,
            "retry_after": SERVICE_RETRY_AFTER_S,
            "message": unavailable_message(service),
            "request_id": request_id,
        }
        if run_id:
            frame["run_id"] = run_id
        self.send_obj(frame)

    def close(self, code: int, reason: str) -> None:
        """Close the socket with `code` (the frame loop then ends)."""
        got = self._send_lock.acquire(timeout=5)  # a send blocked on a stalled peer: go anyway
        try:
            if not self.closed.is_set():
                self.closed.set()
                with contextlib.suppress(Exception):  # already closed by the peer
                    self.ws.close(reason=code, message=reason)
        finally:
            if got:
                self._send_lock.release()

    # -- the frame loop (the upgrade request's thread; its request context is active) ---------
    def serve(self) -> None:
        try:
            while not self.closed.is_set():
                try:
                    msg = self.ws.receive(timeout=RECEIVE_POLL_S)
                except ConnectionClosed:
                    break
                self._renew_slot()
                if not self._still_authorized(force=False):
                    break
                if msg is None:
                    continue
                if not self._frames.take():
                    self._refuse_frame()
                    continue
                if not isinstance(msg, str):
                    self.close(CLOSE_INVALID_PAYLOAD, "binary frames are not supported")
                    break
                try:
                    data = serde.loads(msg)
                except ValueError:
                    self.close(CLOSE_INVALID_PAYLOAD, "a frame must be one JSON object")
                    break
                self.handle(data)
        finally:
            self.shutdown()

    def _renew_slot(self) -> None:
        """Renew the socket's connection slot when due, beside the frame loop: with Redis
        unreachable the renewal waits out the client's retries, and frames that need no
        service (a `ping`) must not wait for it. At most one renewal at a time: it is no
        longer due once started."""
        conn = self.conn
        if conn is None or not conn.due():
            return
        conn.renewed_at = time.monotonic()
        threading.Thread(target=conn.renew, name="ws-slot-renew", daemon=True).start()

    def _still_authorized(self, *, force: bool) -> bool:
        """Re-check the socket's credential at least once per key-cache TTL,
        and on `force` (every `run.create`): a key revoked, a token expired or local mode
        ended while the socket was open closes it with 4401 after an `error` frame. The
        upgrade request's context is still active here, so the credential is the one it
        presented (header, bearer or `?api_key=`)."""
        now = time.monotonic()
        if not force and now - self._authenticated_at < self.svc.settings.api_key_cache_ttl_s:
            return True
        try:
            valid = credential_still_valid(principal().subject)
        except SERVICE_ERRORS:
            if force:
                raise  # the frame is answered `service_unavailable`
            # A periodic check that cannot reach the key store keeps the socket; the
            # credential is checked again at the next frame.
            log.warning("websocket credential re-check failed: a service is unreachable")
            return True
        if valid:
            self._authenticated_at = now
            return True
        log.info("websocket credential no longer valid; closing", extra={"user_id": self.owner})
        self.error("unauthorized", "the credential of this socket is no longer valid")
        self.close(CLOSE_UNAUTHORIZED, "credential no longer valid")
        return False

    def _refuse_frame(self) -> None:
        """A frame over `ws_frames_per_second` is dropped; one error frame per second says so."""
        now = time.monotonic()
        if now - self._limited_at < 1.0:
            return
        self._limited_at = now
        rate = self.svc.settings.ws_frames_per_second
        self.send_obj(
            {
                "type": "error",
                "code": "limit_exceeded",
                "limit": "ws_frames_per_second",
                "message": f"more than {rate:g} frames per second; frames are being dropped",
                "retry_after": round(self._frames.wait_s(), 3),
                "request_id": None,
            }
        )

    def handle(self, data: Any) -> None:
        """Answer one decoded frame; every failure becomes an `error` frame."""
        request_id = None
        try:
            if not isinstance(data, dict):
                raise ValidationFailed("a frame must be a JSON object", field="frame")
            request_id = request_id_of(data)
            kind = data.get("type")
            if not isinstance(kind, str) or not kind:
                raise ValidationFailed("type: a frame needs a string `type`", field="type")
            handler = self._handlers.get(kind)
            if handler is None:
                raise FrameError(
                    "unknown_type",
                    f"unknown frame type {kind[:64]!r}; expected one of: "
                    + ", ".join(self._handlers),
                    "type",
                )
            handler(data, request_id)
        except StreamCursorInvalid as exc:
            self.error(exc.code, str(exc), request_id, field="last_event_id")
        except ValidationFailed as exc:
            self.error(exc.code, str(exc), request_id, field=exc.field)
        except FrameError as exc:
            self.error(exc.code, str(exc), request_id, field=exc.field)
        except LimitExceeded as exc:
            self.send_obj(
                {
                    **limit_body(exc),
                    "type": "error",
                    "code": "limit_exceeded",
                    "request_id": request_id,
                }
            )
        except Denied as exc:  # the project's auth handlers refused (shared/authz/)
            self.error(DENIED_CODES.get(exc.status, "auth_error"), exc.detail, request_id)
        except ThreadrunError as exc:
            if exc.code == "internal_error":
                log.exception("websocket frame failed")
                self.error("internal_error", "internal error", request_id)
            else:
                self.error(exc.code, str(exc), request_id)
        except HTTPException as exc:
            code = (exc.name or "error").lower().replace(" ", "_")
            self.error(code, exc.description or exc.name, request_id)
        except SERVICE_ERRORS as exc:  # Redis or PostgreSQL unreachable: retry later
            self.unavailable(exc, request_id)
        except Exception:  # a bad frame never kills the socket
            kind = data.get("type") if isinstance(data, dict) else None
            log.exception("websocket frame failed", extra={"frame_type": str(kind)[:64]})
            self.error("internal_error", "internal error", request_id)

    def _thread_id(
        self, value: Any, action: str | None = "read", what: dict[str, Any] | None = None
    ) -> str:
        tid = value if value is not None else self.default_thread_id
        if tid is None:
            raise ValidationFailed(
                "thread_id: required on /ws (or connect to /threads/{thread_id}/ws)",
                field="thread_id",
            )
        if not isinstance(tid, str):
            raise ValidationFailed("thread_id: must be a string", field="thread_id")
        return public_ids.resolve(tid, action, what)

    # -- frame handlers --------------------------------------------------------------------------
    def _create(self, data: dict[str, Any], request_id: Any) -> None:
        if not self._still_authorized(force=True):
            return
        body = {k: v for k, v in data.items() if k not in ("type", "request_id", "thread_id")}
        tid = self._thread_id(data.get("thread_id"), None)  # threads.create_run: admit_run
        spec = validate(RunCreate, body)
        self._check_capacity()
        run = admit_run(self.owner, public_ids.on_thread(spec.to_request(tid)), body)
        self.send_obj({"type": "run.created", "request_id": request_id, "run": run_json(run)})
        self._follow(
            _Subscription(
                run_id=run.run_id,
                thread_id=run.thread_id,
                cursor=BEFORE_FIRST,  # a start trimmed before the first read is a gap (B5)
                request_id=request_id,
                cancel_on_disconnect=spec.on_disconnect is OnDisconnect.CANCEL,
                modes=None,
                admitted=True,
            )
        )

    def _join(self, data: dict[str, Any], request_id: Any) -> None:
        frame = validate(JoinFrame, data)
        tid = self._thread_id(frame.thread_id)
        run = self.svc.store.get_run(tid, checked_run_id(frame.run_id), self.owner)
        run_id = run.run_id
        last = None if frame.last_event_id is None else str(frame.last_event_id)
        cursor = self._subscriber.check_cursor(run_id, last)
        if cursor:
            # Joining at the `end` event itself: answer `end` now (the subscriber would stop
            # without an item, leaving the client without any answer).
            newest = self._subscriber.last_event(run_id)
            if newest is not None and newest.id == cursor and newest.event == END_EVENT:
                self.send([encode(EndFrame(newest), run_id)])
                return
        self._follow(
            _Subscription(
                run_id=run_id,
                thread_id=run.thread_id,
                cursor=cursor,
                request_id=request_id,
                cancel_on_disconnect=frame.cancel_on_disconnect,
                modes=checked_modes(frame.stream_mode),
            )
        )

    def _cancel(self, data: dict[str, Any], request_id: Any) -> None:
        frame = validate(CancelFrame, data)
        run_id = checked_run_id(frame.run_id)
        tid = self._thread_id(
            frame.thread_id, "update", {"run_id": run_id, "action": frame.action.value}
        )
        outcome = self.svc.runs.cancel(
            owner=self.owner, thread_id=tid, run_id=run_id, action=frame.action
        )
        self.send_obj(
            {
                "type": "run.cancel.accepted",
                "request_id": request_id,
                "run_id": run_id,
                "outcome": outcome.value,
            }
        )

    def _ping(self, data: dict[str, Any], request_id: Any) -> None:
        pong: dict[str, Any] = {"type": "pong"}
        if request_id is not None:
            pong["request_id"] = request_id
        self.send_obj(pong)

    # -- subscriptions ---------------------------------------------------------------------------
    def _refusal(self, run_id: str | None) -> FrameError | None:
        """Why this socket cannot follow one more run (call with the subs lock held)."""
        if run_id is not None and run_id in self._subs:
            return FrameError(
                "already_subscribed", f"this socket already follows run {run_id}", "run_id"
            )
        if len(self._subs) >= MAX_SUBSCRIPTIONS:
            return FrameError(
                "too_many_subscriptions", f"a socket follows at most {MAX_SUBSCRIPTIONS} runs"
            )
        return None

    def _check_capacity(self) -> None:
        with self._subs_lock:
            refusal = self._refusal(None)
        if refusal is not None:
            raise refusal

    def _follow(self, sub: _Subscription) -> None:
        with self._subs_lock:
            refusal = self._refusal(sub.run_id)
            if refusal is None:
                self._subs[sub.run_id] = sub
        if refusal is not None:
            raise refusal
        sub.thread = threading.Thread(
            target=self._pump, args=(sub,), name=f"ws-sub-{sub.run_id}", daemon=True
        )
        sub.thread.start()

    def _pump(self, sub: _Subscription) -> None:
        """Relay one run's stream to the socket until end, gap, stop or a dead socket."""
        run_id, runs = sub.run_id, self.svc.runs
        keep = frames.event_filter(sub.modes)
        # A generator: closed below so nothing outlives the thread.
        batches = self._subscriber.subscribe_batches(
            run_id,
            sub.cursor,
            is_terminal=lambda: runs.is_terminal(run_id),
            unstarted_end=lambda: runs.unstarted_end(run_id),
            admitted=sub.admitted,
        )
        sub_ticket = TRACKER.open(None, run_id)  # the ops view's stream subscribers
        last_sent = time.monotonic()
        try:
            for batch in batches:
                if sub.stop.is_set() or self.closed.is_set():
                    break
                out: list[str] = []
                for frame in frames.from_batch(batch, keep):
                    if isinstance(frame, HeartbeatFrame) and not self._heartbeat_due(last_sent):
                        continue
                    sub.ended = sub.ended or frames.is_last(frame)
                    out.append(encode(frame, run_id))
                if sub.ended:
                    # Released before the last frame goes out: a client that answers `end`
                    # with another `run.join` of this run must not be told it still follows it.
                    self._release(sub)
                if out:
                    if not self.send(out):
                        break
                    last_sent = time.monotonic()
                if sub.ended:
                    break
        except StreamCursorInvalid as exc:
            self.error(exc.code, str(exc), sub.request_id, field="last_event_id", run_id=run_id)
        except SERVICE_ERRORS as exc:  # the subscription ends; a `run.join` resumes it later
            self.unavailable(exc, sub.request_id, run_id=run_id)
        except Exception:  # report, keep the socket and the other runs
            log.exception("websocket subscription failed", extra={"run_id": run_id})
            self.error("internal_error", "the subscription failed", sub.request_id, run_id=run_id)
        finally:
            batches.close()  # detaches from the hub; nothing of this subscription outlives it
            TRACKER.close(sub_ticket)
            self._release(sub)
            # Decided here, not in shutdown(): a failed send may end this thread first.
            if sub.cancel_on_disconnect and not sub.ended and self.closed.is_set():
                self._cancel_on_disconnect(sub)

    def _release(self, sub: _Subscription) -> None:
        """This socket no longer follows the run (idempotent; a newer follow is kept)."""
        with self._subs_lock:
            if self._subs.get(sub.run_id) is sub:
                del self._subs[sub.run_id]

    def _heartbeat_due(self, last_sent: float) -> bool:
        """The thread polls more often than clients get heartbeats: one per quiet interval."""
        return time.monotonic() - last_sent >= self._heartbeat_s - 0.05

    def _cancel_on_disconnect(self, sub: _Subscription) -> None:
        """The socket went away before the run's end: cancel it, as SSE does (R6)."""
        log.info(
            "websocket closed; cancelling (on_disconnect=cancel)",
            extra={"run_id": sub.run_id, "thread_id": sub.thread_id},
        )
        try:
            self.svc.runs.cancel(
                owner=self.owner,
                thread_id=sub.thread_id,
                run_id=sub.run_id,
                action=CancelAction.INTERRUPT,
            )
        except Exception:  # logged; the run ends by itself eventually
            log.exception("cancel on disconnect failed", extra={"run_id": sub.run_id})

    def shutdown(self) -> None:
        """The socket is gone: stop every subscription thread (each cancels its run if it was
        created with on_disconnect=cancel and has not ended, R6) and wait for them."""
        self.closed.set()
        with self._subs_lock:
            subs = list(self._subs.values())
        for sub in subs:
            sub.stop.set()
        for sub in subs:
            if sub.thread is not None:
                sub.thread.join(timeout=MAX_POLL_S + 5)
                if sub.thread.is_alive():
                    log.warning("websocket subscription did not stop", extra={"run_id": sub.run_id})
