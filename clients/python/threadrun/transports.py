"""The wire: run streams over SSE (`SseTransport`) or WebSocket (`WsTransport`).

A transport opens one `Subscription` per connection and yields what the server sent,
decoded into `WireItem`s; it decides nothing about recovery. It raises `ConnectionDropped`
for anything worth resuming (a transport error, a read timeout, a 5xx or 429, a retryable
WebSocket error frame) and `ThreadrunAPIError` for a refusal, so `RunStream` can tell the
two apart. The timeouts come from the `RecoveryPolicy`; the `StreamTransport` protocol is
what an in-memory fake implements in the unit tests.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import orjson

from threadrun.errors import ConnectionDropped, ThreadrunAPIError
from threadrun.recovery import RecoveryPolicy
from threadrun.results import GapInfo, StreamEvent

__all__ = [
    "SseTransport",
    "StreamTransport",
    "Subscription",
    "WireEnd",
    "WireGap",
    "WireHeartbeat",
    "WireItem",
    "WsTransport",
    "parse_sse",
    "ws_url",
]


@dataclass(frozen=True, slots=True)
class WireGap:
    """A `gap` control item from the server."""

    gap: GapInfo


@dataclass(frozen=True, slots=True)
class WireEnd:
    """An end-of-run control item (WebSocket `end` frame)."""

    status: str
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class WireHeartbeat:
    """Nothing happened for a heartbeat interval (B6)."""


WireItem = StreamEvent | WireGap | WireEnd | WireHeartbeat
"""What a subscription yields: a live event, or a control item of the stream."""


class Subscription(Protocol):
    """One subscription to a run's stream; `run_id` is known once the run was created."""

    run_id: str | None

    def __iter__(self) -> Iterator[WireItem]: ...

    def close(self) -> None: ...


class StreamTransport(Protocol):
    """Opens subscriptions; raises `ConnectionDropped` (resumable) or `ThreadrunAPIError`."""

    def open_create(self, thread_id: str, payload: dict[str, Any]) -> Subscription: ...

    def open_join(self, thread_id: str, run_id: str, cursor: str) -> Subscription: ...

    def close(self) -> None: ...


def _content_location_run_id(headers: httpx.Headers) -> str | None:
    loc = headers.get("content-location") or ""
    m = re.search(r"/runs/([0-9a-fA-F-]{36})", loc)
    return m.group(1) if m else None


def _decode_json(text: str) -> Any:
    if not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def parse_sse(lines: Iterable[str]) -> Iterator[WireItem]:
    """SSE lines -> events, gaps and heartbeats (comment lines)."""
    event_id: str | None = None
    name: str | None = None
    data: list[str] = []
    for line in lines:
        if line == "":
            if name is not None or data:
                payload = _decode_json("\n".join(data))
                if name == "gap":
                    yield WireGap(GapInfo.from_payload(payload))
                else:
                    yield StreamEvent(event_id or "", name or "message", payload)
            event_id, name, data = None, None, []
            continue
        if line.startswith(":"):
            yield WireHeartbeat()
            continue
        key, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if key == "id":
            event_id = value
        elif key == "event":
            name = value
        elif key == "data":
            data.append(value)


def _api_error(status: int, body: bytes) -> ThreadrunAPIError:
    decoded = _decode_json(body.decode(errors="replace"))
    if isinstance(decoded, dict):
        message = str(decoded.get("message") or decoded.get("detail") or decoded)
        code = decoded.get("error")
        return ThreadrunAPIError(
            f"HTTP {status}: {message}", status=status, code=str(code) if code else None
        )
    return ThreadrunAPIError(f"HTTP {status}: {body[:500].decode(errors='replace')}", status=status)


def _retryable_status(status: int) -> bool:
    return status in (408, 425, 429) or status >= 500


class _SseSubscription:
    """One streaming HTTP response."""

    def __init__(
        self,
        http: httpx.Client,
        method: str,
        url: str,
        *,
        timeout: httpx.Timeout,
        json: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        run_id: str | None = None,
    ) -> None:
        self.run_id = run_id
        self._timeout = timeout
        self._gen = self._items(http, method, url, json, headers)

    def __iter__(self) -> Iterator[WireItem]:
        return self._gen

    def _items(
        self,
        http: httpx.Client,
        method: str,
        url: str,
        json: dict[str, Any] | None,
        headers: dict[str, str] | None,
    ) -> Generator[WireItem, None, None]:
        try:
            with http.stream(
                method, url, json=json, headers=headers, timeout=self._timeout
            ) as resp:
                if resp.status_code >= 400:
                    body = resp.read()
                    if _retryable_status(resp.status_code):
                        raise ConnectionDropped(f"HTTP {resp.status_code}")
                    raise _api_error(resp.status_code, body)
                self.run_id = self.run_id or _content_location_run_id(resp.headers)
                yield from parse_sse(resp.iter_lines())
        except httpx.TransportError as exc:
            raise ConnectionDropped(f"{type(exc).__name__}: {exc}") from exc
        except httpx.StreamError as exc:  # closed under us
            raise ConnectionDropped(f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self._gen.close()


class SseTransport:
    """POST …/runs/stream to create, GET …/runs/{id}/stream with `Last-Event-ID` to resume."""

    def __init__(self, http: httpx.Client, policy: RecoveryPolicy) -> None:
        self._http = http
        self._timeout = httpx.Timeout(
            policy.connect_timeout_s, read=policy.read_timeout_s, connect=policy.connect_timeout_s
        )

    def open_create(self, thread_id: str, payload: dict[str, Any]) -> Subscription:
        return _SseSubscription(
            self._http,
            "POST",
            f"/threads/{thread_id}/runs/stream",
            timeout=self._timeout,
            json=payload,
        )

    def open_join(self, thread_id: str, run_id: str, cursor: str) -> Subscription:
        return _SseSubscription(
            self._http,
            "GET",
            f"/threads/{thread_id}/runs/{run_id}/stream",
            timeout=self._timeout,
            headers={"Last-Event-ID": cursor},
            run_id=run_id,
        )

    def close(self) -> None:
        pass


def ws_url(base_url: str) -> str:
    """The `/ws` endpoint next to an http(s) base URL."""
    base = base_url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base[len("https://") :]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://") :]
    return base + "/ws"


_WS_RETRYABLE_CODES = frozenset(
    {"internal_error", "unavailable", "overloaded", "store_error", "already_subscribed"}
)
_WS_STATUS = {
    "not_found": 404,
    "invalid_request": 422,
    "invalid_last_event_id": 400,
    "thread_busy": 409,
    "thread_exists": 409,
    "conflict": 409,
    "unauthorized": 401,
}


class _WsSubscription:
    """One `run.create` / `run.join` on its own socket (closed with the subscription)."""

    def __init__(self, transport: WsTransport, frame: dict[str, Any], run_id: str | None) -> None:
        self.run_id = run_id
        self._transport = transport
        self._frame = frame
        self._gen = self._items()

    def __iter__(self) -> Iterator[WireItem]:
        return self._gen

    def _items(self) -> Generator[WireItem, None, None]:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

        t = self._transport
        try:
            with t.connect() as ws:
                ws.send(orjson.dumps(self._frame).decode())
                while True:
                    try:
                        raw = ws.recv(timeout=t.read_timeout_s)
                    except TimeoutError as exc:
                        raise ConnectionDropped(f"no frame for {t.read_timeout_s} s") from exc
                    msg = _decode_json(raw if isinstance(raw, str) else raw.decode())
                    if not isinstance(msg, dict):
                        continue
                    item = self._handle(msg)
                    if item is None:
                        continue
                    yield item
                    if isinstance(item, WireGap | WireEnd):
                        return  # the server ended this subscription
        except (ConnectionClosed, OSError) as exc:  # TimeoutError of the handshake included
            raise ConnectionDropped(f"{type(exc).__name__}: {exc}") from exc
        except InvalidHandshake as exc:
            response = getattr(exc, "response", None)
            status = getattr(response, "status_code", None)
            if isinstance(status, int) and not _retryable_status(status):
                raise _api_error(status, getattr(response, "body", b"") or b"") from exc
            raise ConnectionDropped(f"{type(exc).__name__}: {exc}") from exc
        except InvalidURI as exc:
            raise ThreadrunAPIError(f"bad WebSocket URL: {exc}") from exc

    def _handle(self, msg: dict[str, Any]) -> WireItem | None:
        kind = msg.get("type")
        rid = msg.get("run_id")
        if kind == "run.created":
            if msg.get("request_id") == self._frame.get("request_id"):
                run = msg.get("run") or {}
                self.run_id = str(run.get("run_id") or rid or "") or None
            return None
        if kind == "error":
            if msg.get("request_id") not in (None, self._frame.get("request_id")):
                return None  # about another request (not ours)
            code = str(msg.get("code") or "error")
            text = str(msg.get("message") or code)
            if code in _WS_RETRYABLE_CODES:
                raise ConnectionDropped(f"server error {code}: {text}")
            raise ThreadrunAPIError(f"{code}: {text}", status=_WS_STATUS.get(code), code=code)
        if rid is not None and self.run_id is not None and str(rid) != self.run_id:
            return None  # another run's frame (not ours)
        if kind == "event":
            data = msg.get("data")
            return StreamEvent(str(msg.get("id") or ""), str(msg.get("event")), data)
        if kind == "gap":
            return WireGap(GapInfo.from_payload(msg))
        if kind == "heartbeat":
            return WireHeartbeat()
        if kind == "end":
            eid = msg.get("id")
            return WireEnd(str(msg.get("status") or "unknown"), str(eid) if eid else None)
        return None  # pong, acknowledgements, future frame types

    def close(self) -> None:
        self._gen.close()  # leaves the `with`: the socket is closed


class WsTransport:
    """The `/ws` endpoint (A2): a socket per subscription (a rejoin after a gap or a drop
    opens a new one, so no server-side state of the old one can interfere)."""

    def __init__(self, base_url: str, api_key: str | None, policy: RecoveryPolicy) -> None:
        self.url = ws_url(base_url)
        self._headers = {"x-api-key": api_key} if api_key else {}
        self.read_timeout_s = policy.read_timeout_s
        self._open_timeout = policy.connect_timeout_s

    def connect(self) -> Any:
        """A new socket (websockets' sync client; use it as a context manager)."""
        from websockets.sync.client import connect

        return connect(
            self.url,
            additional_headers=self._headers,
            open_timeout=self._open_timeout,
            close_timeout=2,
            max_size=None,
        )

    def open_create(self, thread_id: str, payload: dict[str, Any]) -> Subscription:
        frame = {
            "type": "run.create",
            "thread_id": thread_id,
            "request_id": uuid.uuid4().hex,
            **payload,
        }
        return _WsSubscription(self, frame, None)

    def open_join(self, thread_id: str, run_id: str, cursor: str) -> Subscription:
        frame = {
            "type": "run.join",
            "thread_id": thread_id,
            "run_id": run_id,
            "last_event_id": cursor,
            "request_id": uuid.uuid4().hex,
        }
        return _WsSubscription(self, frame, run_id)

    def close(self) -> None:
        pass
