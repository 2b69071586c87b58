"""Python client of threadrun: stream runs over WebSocket or SSE, survive drops and gaps (B9).

    client = ThreadrunClient("http://127.0.0.1:8000", api_key="…", transport="ws")
    tid = client.create_thread()["thread_id"]
    for item in client.stream_run(tid, "lead_agent", input={"messages": [...]}):
        match item:
            case StreamEvent(): ...        # one live event (metadata, messages, values, …)
            case Reconnecting(): ...       # the connection dropped; resuming after the last id
            case StateReloaded(): ...      # view incomplete: transient state dropped, durable
                                           # state reloaded (GET /threads/{id}/state)
            case RunEnded(): ...           # the run's terminal status ("interrupted" = cancelled)

Recovery, as SPEC B4/B5/B9 describe it:

- a dropped connection (transport error, read timeout, or a stream that closes without
  `end`) is resumed with the last event id seen, with bounded retries and back-off; the
  server replays exactly the events after it (B4), and the client also refuses any id
  that is not after the last one delivered, so no event is delivered twice;
- a `gap` (events after the cursor were trimmed, B5) drops the transient view (the
  partial assistant text), reloads the run's status and the thread's durable state,
  yields `StateReloaded`, then rejoins after `latest_available_event_id` — or, when the
  stream is gone (null bounds), ends with `RunEnded` if the run is terminal, else waits
  and rejoins from the start of what is retained;
- after `max_consecutive_gaps` gaps with no event delivered in between, it raises
  `StreamReplayGapError`: the live view is lost, the run itself keeps going.

The decisions (what to do on an event, a drop, a gap, the end) live in `RunRecovery`,
which does no IO; `RunStream` drives it over a `StreamTransport` (SSE or WebSocket here,
an in-memory fake in the unit tests).
"""

from __future__ import annotations

import os
import random
import re
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import httpx
import orjson

TERMINAL_STATUSES = frozenset({"success", "error", "timeout", "interrupted"})
START_CURSOR = "-1"
"""`Last-Event-ID` meaning "from the start of what is retained" (B4)."""

DEFAULT_URL = "http://127.0.0.1:8000"


def default_url(env: Mapping[str, str] | None = None) -> str:
    """The server to talk to: THREADRUN_URL, else the address `make run` serves on
    (THREADRUN_HOST and THREADRUN_PORT, as the server reads them; a wildcard bind address
    is reached on 127.0.0.1), else DEFAULT_URL."""
    env = os.environ if env is None else env
    if env.get("THREADRUN_URL"):
        return env["THREADRUN_URL"]
    host = env.get("THREADRUN_HOST") or "127.0.0.1"
    if host in ("0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{env.get('THREADRUN_PORT') or 8000}"


DEFAULT_STREAM_MODE: tuple[str, ...] = ("messages-tuple", "values")


# --- what a caller receives -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One live event of the run; `data` is decoded JSON."""

    id: str
    event: str
    data: Any


@dataclass(frozen=True, slots=True)
class GapInfo:
    """The body of a `gap` control event (B5)."""

    run_id: str | None
    requested_event_id: str | None
    earliest_available_event_id: str | None
    latest_available_event_id: str | None
    code: str = "stream_replay_gap"

    @classmethod
    def from_payload(cls, payload: Any) -> GapInfo:
        """Parse the gap payload (tolerant: a malformed one is a gap with null bounds)."""
        p: Mapping[str, Any] = payload if isinstance(payload, Mapping) else {}

        def opt(key: str) -> str | None:
            value = p.get(key)
            return str(value) if value not in (None, "") else None

        return cls(
            run_id=opt("run_id"),
            requested_event_id=opt("requested_event_id"),
            earliest_available_event_id=opt("earliest_available_event_id"),
            latest_available_event_id=opt("latest_available_event_id"),
            code=str(p.get("code") or "stream_replay_gap"),
        )


@dataclass(frozen=True, slots=True)
class StateReloaded:
    """The live view was incomplete: transient state dropped, durable state reloaded (B9)."""

    state: dict[str, Any]
    gap: GapInfo


@dataclass(frozen=True, slots=True)
class RunEnded:
    """The run reached a terminal status (`interrupted` = cancelled)."""

    run_id: str
    status: str


@dataclass(frozen=True, slots=True)
class Reconnecting:
    """The connection dropped; the client resumes after `last_event_id` in `delay` seconds."""

    run_id: str
    attempt: int
    delay: float
    last_event_id: str | None
    reason: str


ClientItem = StreamEvent | StateReloaded | RunEnded | Reconnecting


# --- errors ------------------------------------------------------------------------------------
class ThreadrunClientError(Exception):
    """Root of the errors this client raises."""


class ThreadrunAPIError(ThreadrunClientError):
    """The server refused a request (4xx, or a WebSocket `error` frame)."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ServerUnreachableError(ThreadrunClientError):
    """No answer from the server at all (refused, unknown host, timed out)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"cannot reach the threadrun server at {url} ({reason}). Is it running? `make run`"
            " starts one and prints its URL; --url or THREADRUN_URL point elsewhere."
        )
        self.url = url


class StreamDisconnectedError(ThreadrunClientError):
    """The stream could not be resumed within the retry budget. The run keeps going."""

    def __init__(self, message: str, *, run_id: str | None, last_event_id: str | None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.last_event_id = last_event_id


class StreamReplayGapError(ThreadrunClientError):
    """Too many consecutive replay gaps: the live view is lost, but the run keeps going (B9)."""

    def __init__(self, run_id: str | None, gaps: Sequence[GapInfo]) -> None:
        self.run_id = run_id
        self.gaps = tuple(gaps)
        last = self.gaps[-1] if self.gaps else None
        super().__init__(
            f"run {run_id}: the live stream had {len(self.gaps)} replay gaps in a row "
            f"(events after {last.requested_event_id if last else None} were trimmed before "
            "they could be read); the live view is incomplete but the run itself keeps going: "
            "reload the thread state (GET /threads/{id}/state) or join the run again later"
        )


class ConnectionDropped(Exception):
    """A transport lost its connection (or never got one); the stream can be resumed."""


# --- pure recovery logic (no IO) ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RecoveryPolicy:
    """Bounds of reconnection and gap recovery."""

    max_retries: int = 5
    """Consecutive failed connection attempts before `StreamDisconnectedError`."""
    backoff_initial_s: float = 0.25
    backoff_factor: float = 2.0
    backoff_max_s: float = 5.0
    jitter: float = 0.1
    """Up to this fraction of the delay is added at random (spreads reconnect storms)."""
    max_consecutive_gaps: int = 3
    lost_stream_wait_s: float = 1.0
    """Wait before rejoining a live run whose stream is gone (gap with null bounds)."""
    read_timeout_s: float = 20.0
    """Silence (no event, no heartbeat) after which a connection counts as dropped (B6)."""
    connect_timeout_s: float = 10.0


def backoff_delay(policy: RecoveryPolicy, attempt: int, rand: float = 0.0) -> float:
    """Delay before reconnect attempt `attempt` (1-based); `rand` in [0, 1) scales the jitter."""
    base = policy.backoff_initial_s * policy.backoff_factor ** max(0, attempt - 1)
    base = min(base, policy.backoff_max_s)
    return base * (1.0 + policy.jitter * rand)


_REDIS_ID = re.compile(r"^(\d+)-(\d+)$")


def event_id_key(event_id: str) -> tuple[int, int] | None:
    """The order key of an event id, if it has the `<ms>-<seq>` shape our server uses."""
    m = _REDIS_ID.match(event_id)
    return (int(m.group(1)), int(m.group(2))) if m else None


def is_after(event_id: str, last: str | None) -> bool:
    """Whether `event_id` comes after `last` (ids of unknown shape: only equality is known)."""
    if last is None:
        return True
    a, b = event_id_key(event_id), event_id_key(last)
    if a is None or b is None:
        return event_id != last
    return a > b


def later_id(a: str | None, b: str | None) -> str | None:
    """The later of two cursors (None = nothing seen)."""
    if a is None:
        return b
    if b is None:
        return a
    return b if is_after(b, a) else a


def message_delta(event: StreamEvent) -> tuple[str | None, str] | None:
    """(message id, text) of an assistant token in a `messages` event of the top graph."""
    if event.event != "messages" or not isinstance(event.data, list) or not event.data:
        return None
    chunk = event.data[0]
    if not isinstance(chunk, dict) or chunk.get("type") not in ("AIMessageChunk", "ai"):
        return None
    content = chunk.get("content")
    if isinstance(content, list):
        content = "".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    if not isinstance(content, str) or not content:
        return None
    mid = chunk.get("id")
    return (str(mid) if mid is not None else None, content)


@dataclass
class PartialText:
    """Transient view: the assistant message being streamed, built from `messages` events."""

    message_id: str | None = None
    text: str = ""

    def apply(self, event: StreamEvent) -> str:
        """Fold one event in; returns the new text (empty if the event carries none)."""
        delta = message_delta(event)
        if delta is None:
            return ""
        mid, piece = delta
        if mid != self.message_id:
            self.message_id, self.text = mid, ""
        self.text += piece
        return piece

    def reset(self) -> None:
        """Forget it (after a gap the buffer may miss tokens)."""
        self.message_id, self.text = None, ""


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand the event to the caller."""

    event: StreamEvent


@dataclass(frozen=True, slots=True)
class Skip:
    """Not after the last delivered id: a duplicate, drop it."""


@dataclass(frozen=True, slots=True)
class Finish:
    """The run ended; `reload_first`: the view is stale, reload durable state before `RunEnded`."""

    status: str
    reload_first: bool


@dataclass(frozen=True, slots=True)
class Reconnect:
    """Resume after `cursor` once `delay` has passed."""

    cursor: str
    delay: float
    attempt: int


@dataclass(frozen=True, slots=True)
class Reload:
    """Reload the run's status and the thread's durable state, then call `after_reload`."""

    gap: GapInfo


@dataclass(frozen=True, slots=True)
class Rejoin:
    """Subscribe again after `cursor` once `delay` has passed (after a gap)."""

    cursor: str
    delay: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stop and raise `error`."""

    error: ThreadrunClientError


EventDecision = Deliver | Skip | Finish
DropDecision = Reconnect | GiveUp
GapDecision = Reload | GiveUp
ReloadDecision = Finish | Rejoin


@dataclass
class RunRecovery:
    """What to do on an event, a drop, a gap, the end — for one run's stream. No IO.

    Invariants: delivered event ids strictly increase; the transient view is reset on
    every gap; `consecutive_gaps` counts gaps since the last delivered event; `failures`
    counts connection attempts since the last event or gap received.
    """

    policy: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    run_id: str | None = None
    last_event_id: str | None = None
    consecutive_gaps: int = 0
    failures: int = 0
    stale_view: bool = False
    last_gap: GapInfo | None = None
    finished: bool = False
    view: PartialText = field(default_factory=PartialText)
    values: Any = None
    _gaps: list[GapInfo] = field(default_factory=list)

    @property
    def cursor(self) -> str:
        """The `Last-Event-ID` to resume with."""
        return self.last_event_id or START_CURSOR

    def on_event(self, event: StreamEvent) -> EventDecision:
        """A live event arrived."""
        if event.id:
            if not is_after(event.id, self.last_event_id) and event.event != "end":
                return Skip()  # (`end` again, e.g. a join with the end's own id, still ends)
            self.last_event_id = later_id(self.last_event_id, event.id)
        self.failures = 0
        self.consecutive_gaps = 0
        self._gaps.clear()
        if event.event == "end":
            status = event.data.get("status") if isinstance(event.data, dict) else None
            return self.on_end(str(status or "unknown"))
        self.view.apply(event)
        if event.event == "values":
            self.values = event.data
            self.stale_view = False
        return Deliver(event)

    def on_end(self, status: str, event_id: str | None = None) -> Finish:
        """The stream ended with the run's status (`event_id`: the `end` event's id)."""
        if event_id:
            self.last_event_id = later_id(self.last_event_id, event_id)
        self.finished = True
        if self.stale_view:  # the final reload replaces the transient view too
            self.view.reset()
        return Finish(status, reload_first=self.stale_view)

    def on_drop(self, rand: float = 0.0) -> DropDecision:
        """The connection dropped (or could not be opened); `rand` in [0, 1) for jitter."""
        self.failures += 1
        if self.failures > self.policy.max_retries:
            return GiveUp(
                StreamDisconnectedError(
                    f"run {self.run_id}: the stream dropped and {self.policy.max_retries} "
                    f"reconnects failed (last event {self.last_event_id}); the run itself "
                    "keeps going: join it again later",
                    run_id=self.run_id,
                    last_event_id=self.last_event_id,
                )
            )
        return Reconnect(
            self.cursor, backoff_delay(self.policy, self.failures, rand), attempt=self.failures
        )

    def on_gap(self, gap: GapInfo) -> GapDecision:
        """The server could not replay after our cursor (B5): drop the transient view."""
        self.view.reset()
        self.stale_view = True
        self.last_gap = gap
        self.failures = 0
        self.consecutive_gaps += 1
        self._gaps.append(gap)
        if self.consecutive_gaps >= self.policy.max_consecutive_gaps:
            return GiveUp(StreamReplayGapError(self.run_id, self._gaps))
        return Reload(gap)

    def after_reload(
        self, gap: GapInfo, run_status: str, state: Mapping[str, Any]
    ) -> ReloadDecision:
        """Durable state reloaded (status read first, then state): end, or rejoin (B9)."""
        self.values = state.get("values")
        if run_status in TERMINAL_STATUSES:
            # The status was committed before the state was read: the state is final.
            self.stale_view = False
            self.finished = True
            return Finish(run_status, reload_first=False)
        if gap.latest_available_event_id is None:
            # The stream is gone while the run lives: wait for it and take what is retained;
            # ids not after the last delivered one are still refused.
            return Rejoin(START_CURSOR, self.policy.lost_stream_wait_s)
        self.last_event_id = later_id(self.last_event_id, gap.latest_available_event_id)
        return Rejoin(self.cursor, 0.0)


# --- transports ---------------------------------------------------------------------------------
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


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """What a fault hook sees before each read: which connection, why, how far along."""

    number: int
    reason: Literal["create", "join", "reconnect", "rejoin"]
    cursor: str | None
    events: int


FaultHook = Callable[[ConnectionInfo], bool]
"""Test hook: return True to close the underlying connection now (simulated network drop)."""


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


# --- the driver ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Ended:
    decision: Finish


@dataclass(frozen=True, slots=True)
class _Gapped:
    gap: GapInfo


@dataclass(frozen=True, slots=True)
class _Dropped:
    reason: str


_Outcome = _Ended | _Gapped | _Dropped
T = TypeVar("T")


class RunStream(Iterator[ClientItem]):
    """The items of one run's stream, across reconnects and gap recoveries."""

    def __init__(
        self,
        *,
        transport: StreamTransport,
        thread_id: str,
        fetch_run: Callable[[str, str], Mapping[str, Any]],
        fetch_state: Callable[[str], dict[str, Any]],
        create: dict[str, Any] | None = None,
        run_id: str | None = None,
        last_event_id: str | None = None,
        policy: RecoveryPolicy | None = None,
        fault_hook: FaultHook | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if create is None and run_id is None:
            raise ValueError("either create a run or name the run to join")
        self.thread_id = thread_id
        self.recovery = RunRecovery(
            policy or RecoveryPolicy(), run_id=run_id, last_event_id=last_event_id
        )
        self._transport = transport
        self._fetch_run = fetch_run
        self._fetch_state = fetch_state
        self._create = create
        self._fault = fault_hook
        self._sleep = sleep
        self._rand = rand
        self._sub: Subscription | None = None
        self.connections = 0
        self._gen = self._run()

    # -- what callers may look at
    @property
    def run_id(self) -> str | None:
        """The run's id (known once it was created)."""
        return self.recovery.run_id

    @property
    def last_event_id(self) -> str | None:
        """The cursor to resume from."""
        return self.recovery.last_event_id

    @property
    def partial_text(self) -> str:
        """The assistant text streamed so far for the current message (transient)."""
        return self.recovery.view.text

    @property
    def values(self) -> Any:
        """The latest full values seen: a `values` event or the reloaded state's values."""
        return self.recovery.values

    def __iter__(self) -> RunStream:
        return self

    def __next__(self) -> ClientItem:
        return next(self._gen)

    def close(self) -> None:
        """Stop following the stream (the run keeps going unless on_disconnect=cancel)."""
        self._gen.close()

    def __enter__(self) -> RunStream:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- the loop
    def _run(self) -> Generator[ClientItem, None, None]:
        rec = self.recovery
        try:
            reason: Literal["create", "join", "reconnect", "rejoin"]
            if self._create is not None:
                reason, cursor = "create", None
            else:
                reason, cursor = "join", rec.cursor
            while True:
                outcome = yield from self._consume(reason, cursor)
                if isinstance(outcome, _Ended):
                    if outcome.decision.reload_first:
                        state = yield from self._reload_state()
                        rec.values = state.get("values")
                        assert rec.last_gap is not None
                        yield StateReloaded(state, rec.last_gap)
                    yield RunEnded(rec.run_id or "", outcome.decision.status)
                    return
                if isinstance(outcome, _Gapped):
                    decision = rec.on_gap(outcome.gap)
                    if isinstance(decision, GiveUp):
                        raise decision.error
                    status, state = yield from self._reload_run_and_state()
                    yield StateReloaded(state, outcome.gap)
                    after = rec.after_reload(outcome.gap, status, state)
                    if isinstance(after, Finish):
                        yield RunEnded(rec.run_id or "", after.status)
                        return
                    if after.delay:
                        self._sleep(after.delay)
                    reason, cursor = "rejoin", after.cursor
                    continue
                # dropped
                if rec.run_id is None:
                    raise StreamDisconnectedError(
                        f"the connection dropped before the run was created or named "
                        f"({outcome.reason}); it may or may not exist: list the thread's runs",
                        run_id=None,
                        last_event_id=None,
                    )
                drop = rec.on_drop(self._rand())
                if isinstance(drop, GiveUp):
                    raise drop.error
                yield Reconnecting(
                    rec.run_id, drop.attempt, drop.delay, rec.last_event_id, outcome.reason
                )
                self._sleep(drop.delay)
                reason, cursor = "reconnect", drop.cursor
        finally:
            self._close_sub()
            self._transport.close()

    def _close_sub(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            sub.close()

    def _open(self, reason: str, cursor: str | None) -> Subscription:
        if reason == "create":
            assert self._create is not None
            return self._transport.open_create(self.thread_id, self._create)
        assert self.recovery.run_id is not None and cursor is not None
        return self._transport.open_join(self.thread_id, self.recovery.run_id, cursor)

    def _consume(
        self, reason: Literal["create", "join", "reconnect", "rejoin"], cursor: str | None
    ) -> Generator[ClientItem, None, _Outcome]:
        """One connection: deliver its events; return how it ended."""
        rec = self.recovery
        self.connections += 1
        number, events = self.connections, 0
        sub: Subscription | None = None
        try:
            sub = self._sub = self._open(reason, cursor)
            items = iter(sub)
            while True:
                if self._fault is not None and self._fault(
                    ConnectionInfo(number, reason, cursor, events)
                ):
                    self._close_sub()
                    return _Dropped("connection closed by the fault hook")
                item = next(items, None)
                rec.run_id = rec.run_id or sub.run_id
                if item is None:
                    return _Dropped("the server closed the stream before its end")
                if isinstance(item, StreamEvent):
                    if rec.run_id is None and item.event == "metadata":
                        rid = item.data.get("run_id") if isinstance(item.data, dict) else None
                        rec.run_id = str(rid) if rid else None
                    decision = rec.on_event(item)
                    if isinstance(decision, Deliver):
                        events += 1
                        yield decision.event
                    elif isinstance(decision, Finish):
                        return _Ended(decision)
                elif isinstance(item, WireGap):
                    return _Gapped(item.gap)
                elif isinstance(item, WireEnd):
                    return _Ended(rec.on_end(item.status, item.event_id))
        except ConnectionDropped as exc:
            if sub is not None:  # the run may have been named before the drop
                rec.run_id = rec.run_id or sub.run_id
            return _Dropped(str(exc))
        finally:
            self._close_sub()

    def _retrying(self, fn: Callable[[], T]) -> Generator[ClientItem, None, T]:
        """Call `fn`, retrying drops with the same budget and back-off as the stream."""
        rec = self.recovery
        while True:
            try:
                return fn()
            except ConnectionDropped as exc:
                drop = rec.on_drop(self._rand())
                if isinstance(drop, GiveUp):
                    raise drop.error from exc
                yield Reconnecting(
                    rec.run_id or "", drop.attempt, drop.delay, rec.last_event_id, str(exc)
                )
                self._sleep(drop.delay)

    def _reload_run_and_state(self) -> Generator[ClientItem, None, tuple[str, dict[str, Any]]]:
        """The run's status, then the thread's state (in this order: see `after_reload`)."""
        rid = self.recovery.run_id or ""

        def both() -> tuple[str, dict[str, Any]]:
            status = str(self._fetch_run(self.thread_id, rid).get("status"))
            return status, self._fetch_state(self.thread_id)

        result = yield from self._retrying(both)
        return result

    def _reload_state(self) -> Generator[ClientItem, None, dict[str, Any]]:
        result = yield from self._retrying(lambda: self._fetch_state(self.thread_id))
        return result


# --- the client ------------------------------------------------------------------------------------
class ThreadrunClient:
    """Threads, state and runs over HTTP; run streams over WebSocket (`ws`) or SSE (`sse`)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        api_key: str | None = None,
        transport: Literal["ws", "sse"] = "ws",
        *,
        policy: RecoveryPolicy | None = None,
        timeout: float = 30.0,
        fault_hook: FaultHook | None = None,
    ) -> None:
        if transport not in ("ws", "sse"):
            raise ValueError(f"transport must be 'ws' or 'sse', not {transport!r}")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.transport = transport
        self.policy = policy or RecoveryPolicy()
        self.fault_hook = fault_hook
        headers = {"x-api-key": api_key} if api_key else {}
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=self.policy.connect_timeout_s),
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def __enter__(self) -> ThreadrunClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- plain requests
    def _request(
        self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None
    ) -> Any:
        try:
            resp = self._http.request(method, path, json=json, params=params)
        except httpx.TransportError as exc:
            raise ConnectionDropped(f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            if _retryable_status(resp.status_code):
                raise ConnectionDropped(f"HTTP {resp.status_code} on {method} {path}")
            raise _api_error(resp.status_code, resp.content)
        return orjson.loads(resp.content) if resp.content.strip() else None

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        """A request for callers: a drop is a `ThreadrunClientError`, not our internal signal."""
        try:
            return self._request(method, path, **kw)
        except ConnectionDropped as exc:
            if isinstance(exc.__cause__, httpx.TransportError):
                raise ServerUnreachableError(str(self._http.base_url), str(exc)) from exc
            raise ThreadrunClientError(f"{method} {path} failed: {exc}") from exc

    def search_assistants(self, *, limit: int = 100) -> list[dict[str, Any]]:
        """POST /assistants/search: the assistants the caller can run."""
        result: list[dict[str, Any]] = self._call(
            "POST", "/assistants/search", json={"limit": limit}
        )
        return result

    def create_thread(
        self, *, metadata: dict[str, Any] | None = None, thread_id: str | None = None
    ) -> dict[str, Any]:
        """POST /threads."""
        body: dict[str, Any] = {"metadata": metadata or {}}
        if thread_id:
            body["thread_id"] = thread_id
        result: dict[str, Any] = self._call("POST", "/threads", json=body)
        return result

    def get_thread(self, thread_id: str) -> dict[str, Any]:
        """GET /threads/{id}."""
        result: dict[str, Any] = self._call("GET", f"/threads/{thread_id}")
        return result

    def get_state(self, thread_id: str) -> dict[str, Any]:
        """GET /threads/{id}/state: the durable state (values, next, checkpoint, …)."""
        result: dict[str, Any] = self._call("GET", f"/threads/{thread_id}/state")
        return result

    def get_run(self, thread_id: str, run_id: str) -> dict[str, Any]:
        """GET /threads/{id}/runs/{run_id}."""
        result: dict[str, Any] = self._call("GET", f"/threads/{thread_id}/runs/{run_id}")
        return result

    def create_run(
        self,
        thread_id: str,
        assistant_id: str,
        *,
        input: Any = None,
        config: dict[str, Any] | None = None,
        stream_mode: str | Sequence[str] = DEFAULT_STREAM_MODE,
        **fields: Any,
    ) -> dict[str, Any]:
        """POST /threads/{id}/runs: a background run."""
        body = self._run_payload(assistant_id, input, config, stream_mode, fields)
        result: dict[str, Any] = self._call("POST", f"/threads/{thread_id}/runs", json=body)
        return result

    def cancel(
        self, thread_id: str, run_id: str, *, action: str = "interrupt", wait: bool = False
    ) -> dict[str, Any]:
        """POST …/cancel (R5); `wait` returns once the run is terminal."""
        params = {"action": action, "wait": "true" if wait else "false"}
        result: dict[str, Any] = self._call(
            "POST", f"/threads/{thread_id}/runs/{run_id}/cancel", params=params
        )
        return result

    # -- streams
    @staticmethod
    def _run_payload(
        assistant_id: str,
        input: Any,
        config: dict[str, Any] | None,
        stream_mode: str | Sequence[str],
        fields: Mapping[str, Any],
    ) -> dict[str, Any]:
        modes = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
        body: dict[str, Any] = {"assistant_id": assistant_id, "stream_mode": modes, **fields}
        if input is not None:
            body["input"] = input
        if config is not None:
            body["config"] = config
        return body

    def _transport(self) -> StreamTransport:
        if self.transport == "sse":
            return SseTransport(self._http, self.policy)
        return WsTransport(self.base_url, self.api_key, self.policy)

    def _stream(self, thread_id: str, **kw: Any) -> RunStream:
        return RunStream(
            transport=self._transport(),
            thread_id=thread_id,
            fetch_run=lambda tid, rid: self._request("GET", f"/threads/{tid}/runs/{rid}"),
            fetch_state=lambda tid: self._request("GET", f"/threads/{tid}/state"),
            policy=self.policy,
            fault_hook=self.fault_hook,
            **kw,
        )

    def stream_run(
        self,
        thread_id: str,
        assistant_id: str,
        *,
        input: Any = None,
        config: dict[str, Any] | None = None,
        stream_mode: str | Sequence[str] = DEFAULT_STREAM_MODE,
        **fields: Any,
    ) -> RunStream:
        """Create a run and stream it; `fields` are further RunCreate fields (metadata, …).

        Keep the default `on_disconnect="continue"`: with "cancel" the server cancels the run
        when the connection drops, before the client can resume it (R6).
        """
        body = self._run_payload(assistant_id, input, config, stream_mode, fields)
        return self._stream(thread_id, create=body)

    def join_run(self, thread_id: str, run_id: str, last_event_id: str | None = None) -> RunStream:
        """Follow an existing run from after `last_event_id` (None: from the start retained)."""
        return self._stream(thread_id, run_id=run_id, last_event_id=last_event_id)
