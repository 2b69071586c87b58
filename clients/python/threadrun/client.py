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

A dropped connection is resumed after the last event id delivered, a replay gap is
recovered by reloading the thread's durable state, and too many gaps in a row raise
`StreamReplayGapError` while the run itself keeps going: `threadrun.recovery` spells the
rules out (SPEC B4/B5/B9).

This module holds the two classes that do IO for the caller: `ThreadrunClient` (plain
requests, and the streams it opens) and `RunStream`, the driver of one stream. The
decisions (what to do on an event, a drop, a gap, the end) live in `RunRecovery`
(`threadrun.recovery`), which does no IO; `RunStream` carries them out over a
`StreamTransport` (`threadrun.transports`: SSE or WebSocket, an in-memory fake in the unit
tests). What callers receive is in `threadrun.results`, what they catch in
`threadrun.errors`. Those modules' names are re-exported here, so imports from
`threadrun.client` keep working.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import httpx
import orjson

from threadrun.errors import (
    ConnectionDropped,
    ServerUnreachableError,
    StreamDisconnectedError,
    StreamReplayGapError,
    ThreadrunAPIError,
    ThreadrunClientError,
)
from threadrun.recovery import (
    START_CURSOR,
    TERMINAL_STATUSES,
    Deliver,
    DropDecision,
    EventDecision,
    Finish,
    GapDecision,
    GiveUp,
    PartialText,
    Reconnect,
    RecoveryPolicy,
    Rejoin,
    Reload,
    ReloadDecision,
    RunRecovery,
    Skip,
    backoff_delay,
    event_id_key,
    is_after,
    later_id,
    message_delta,
)
from threadrun.results import (
    ClientItem,
    GapInfo,
    Reconnecting,
    RunEnded,
    StateReloaded,
    StreamEvent,
)
from threadrun.transports import (
    SseTransport,
    StreamTransport,
    Subscription,
    WireEnd,
    WireGap,
    WireHeartbeat,
    WireItem,
    WsTransport,
    _api_error,
    _retryable_status,
    parse_sse,
    ws_url,
)
from threadrun.transports import _WsSubscription as _WsSubscription  # the unit tests use it

__all__ = [
    # this module
    "DEFAULT_STREAM_MODE",
    "DEFAULT_URL",
    "ConnectionInfo",
    "FaultHook",
    "RunStream",
    "ThreadrunClient",
    "default_url",
    # threadrun.results
    "ClientItem",
    "GapInfo",
    "Reconnecting",
    "RunEnded",
    "StateReloaded",
    "StreamEvent",
    # threadrun.errors
    "ConnectionDropped",
    "ServerUnreachableError",
    "StreamDisconnectedError",
    "StreamReplayGapError",
    "ThreadrunAPIError",
    "ThreadrunClientError",
    # threadrun.recovery
    "START_CURSOR",
    "TERMINAL_STATUSES",
    "Deliver",
    "DropDecision",
    "EventDecision",
    "Finish",
    "GapDecision",
    "GiveUp",
    "PartialText",
    "Reconnect",
    "RecoveryPolicy",
    "Rejoin",
    "Reload",
    "ReloadDecision",
    "RunRecovery",
    "Skip",
    "backoff_delay",
    "event_id_key",
    "is_after",
    "later_id",
    "message_delta",
    # threadrun.transports
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


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """What a fault hook sees before each read: which connection, why, how far along."""

    number: int
    reason: Literal["create", "join", "reconnect", "rejoin"]
    cursor: str | None
    events: int


FaultHook = Callable[[ConnectionInfo], bool]
"""Test hook: return True to close the underlying connection now (simulated network drop)."""


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
