"""Per-user limits (A3, A4): run rate, active runs, request sizes, open connections.

Every refusal is a `LimitExceeded`: 429 with `Retry-After` (rates, counts) or 422 (sizes),
and a JSON error naming the limit (`limit`: the settings field) and the `field`.

The counters live in Redis so they hold across web processes. They are small Lua scripts
(`shared/lua/limit_*.lua`) rather than flask-limiter: the limits are per authenticated user (known only after auth),
the WebSocket `run.create` frame must share them with the HTTP routes, and the active-run
and connection counts are sets with expiring members, which flask-limiter's
fixed/moving windows do not model.

What a route holds is what it declares (app/http.py): the hooks here take a connection slot
for a view marked `holds_connection` / `streams_events`; `config_sized` checks sizes on a
raw body; run admission (rate, active-run slot) is app/admission.py's.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import gevent
import redis
from flask import Flask, Response, current_app, g, request
from gevent import monkey as gevent_monkey
from werkzeug.exceptions import RequestTimeout

from app.auth import principal
from app.http import checks_raw, spec_of
from app.services import Services
from shared import lua, serde
from shared.errors import LimitExceeded
from shared.redis_keys import LimitKeys
from shared.runs.limits import RunSlot, unlimited_slot
from shared.settings import Settings

log = logging.getLogger(__name__)

V = TypeVar("V", bound=Callable[..., Any])

# --- sizes (pure) -----------------------------------------------------------------------------


def _json_size(value: Any) -> int:
    return len(serde.dumps(value))


def check_run_sizes(data: dict[str, Any], settings: Settings) -> None:
    """Input/command size, stream_mode length and metadata size of a raw run request."""
    for name in ("input", "command"):
        if data.get(name) is not None and _json_size(data[name]) > settings.max_input_bytes:
            raise LimitExceeded(
                "max_input_bytes",
                f"{name}: larger than {settings.max_input_bytes} bytes of JSON",
                status=422,
                field=name,
            )
    modes = data.get("stream_mode")
    if isinstance(modes, list) and len(modes) > settings.max_stream_modes:
        raise LimitExceeded(
            "max_stream_modes",
            f"stream_mode: more than {settings.max_stream_modes} entries",
            status=422,
            field="stream_mode",
        )
    check_config_sizes(data, settings)


def check_config_sizes(data: dict[str, Any], settings: Settings) -> None:
    """Metadata, context, config.metadata and config.configurable sizes of a raw request
    (a run, an assistant or a thread)."""
    check_metadata_size(data.get("metadata"), settings, "metadata")
    config = data.get("config")
    if isinstance(config, dict):
        check_metadata_size(config.get("metadata"), settings, "config.metadata")
        check_metadata_size(config.get("configurable"), settings, "config.configurable")
    check_metadata_size(data.get("context"), settings, "context")


def _run_sizes(raw: Any) -> None:
    if isinstance(raw, dict):
        check_run_sizes(raw, limiter().settings)


def _batch_sizes(raw: Any) -> None:
    if not isinstance(raw, list):
        return  # the view answers the malformed body (422)
    for index, item in enumerate(raw):
        if isinstance(item, dict):
            try:
                check_run_sizes(item, limiter().settings)
            except LimitExceeded as exc:
                exc.field = f"[{index}].{exc.field}"
                raise


def run_sized(view: V) -> V:
    """The view takes a run's fields (a run, a cron): their sizes are checked on the raw
    body before its model validates it (422 naming the limit and the field)."""
    return checks_raw(_run_sizes)(view)


def batch_sized(view: V) -> V:
    """`run_sized` for a JSON array of runs: 422 naming `[i].field`."""
    return checks_raw(_batch_sizes)(view)


def _config_sizes(raw: Any) -> None:
    if isinstance(raw, dict):
        check_config_sizes(raw, limiter().settings)


def config_sized(view: V) -> V:
    """The view stores metadata, context or config (a thread, an assistant): their sizes
    are checked on the raw body before its model validates it (422 naming the limit)."""
    return checks_raw(_config_sizes)(view)


def check_metadata_size(value: Any, settings: Settings, field_name: str = "metadata") -> None:
    """A metadata-like object over `max_metadata_bytes` of JSON is refused (422)."""
    if value is not None and _json_size(value) > settings.max_metadata_bytes:
        raise LimitExceeded(
            "max_metadata_bytes",
            f"{field_name}: larger than {settings.max_metadata_bytes} bytes of JSON",
            status=422,
            field=field_name,
        )


# --- Redis-backed counters ----------------------------------------------------------------------


@dataclass
class ConnectionSlot:
    """One open SSE stream or WebSocket of a user (or one heavy read in flight: `key`),
    renewed while it lives."""

    limiter: Limiter
    user_id: str
    conn_id: str
    renewed_at: float = field(default_factory=time.monotonic)
    released: bool = False
    key: str = ""  # the sorted set it counts in; the user's connections by default

    def __post_init__(self) -> None:
        self.key = self.key or self.limiter.keys.connections(self.user_id)

    def due(self) -> bool:
        """Whether a third of the TTL has passed since the last renewal (cheap)."""
        ttl = self.limiter.settings.limit_slot_ttl_s
        return not self.released and time.monotonic() - self.renewed_at >= ttl / 3

    def maybe_renew(self) -> None:
        """Renew when a third of the TTL has passed (cheap to call often)."""
        if not self.due():
            return
        self.renewed_at = time.monotonic()
        self.renew()

    def renew(self) -> None:
        """Extend the slot's TTL now (a failure is logged: the slot lives until its TTL)."""
        ttl = self.limiter.settings.limit_slot_ttl_s
        try:
            self.limiter.renew_conn(
                keys=[self.key],
                args=[self.conn_id, int(ttl * 1000)],
            )
        except redis.RedisError:
            log.warning("connection slot renewal failed")

    def release(self) -> None:
        """The connection closed."""
        if self.released:
            return
        self.released = True
        try:
            self.limiter.redis.zrem(self.key, self.conn_id)
        except redis.RedisError:  # it expires after limit_slot_ttl_s
            log.warning("connection slot release failed")


class Limiter:
    """The Redis-backed per-user limits of one web process."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.settings = services.settings
        self.redis = services.redis
        self.keys = LimitKeys(self.settings.redis_prefix)
        self.runs = services.run_limits
        self._acquire_conn = lua.register(self.redis, "limit_acquire_connection")
        self.renew_conn = lua.register(self.redis, "limit_renew_connection")

    def throttled(self) -> bool:
        """Whether the per-user rate, active-run and connection limits apply to the caller:
        always, except to the one user of local single-user mode unless
        `limit_local_user` asks for them (a benchmark or a test loop
        against `make run` must not get 429s). Sizes always apply."""
        return self.settings.limit_local_user or not principal().local

    def check_run_rate(self, user_id: str, runs: int = 1) -> None:
        """`runs_per_minute` per user (shared/runs/limits.py), for a throttled caller."""
        if self.throttled():
            self.runs.check_rate(user_id, runs)

    def reserve_run(self, user_id: str) -> RunSlot:
        """A slot under `max_active_runs` (shared/runs/limits.py) for a throttled caller,
        or 429; for any other a slot that binds and releases nothing."""
        if not self.throttled():
            return unlimited_slot(user_id)
        return self.runs.reserve(user_id)

    def acquire_connection(self, user_id: str) -> ConnectionSlot:
        """A slot under `max_connections_per_user` (open SSE streams + WebSockets), or 429."""
        return self._slot(
            user_id,
            self.keys.connections(user_id),
            "max_connections_per_user",
            self.settings.max_connections_per_user,
            "open streams and WebSockets",
        )

    def acquire_heavy_read(self, user_id: str) -> ConnectionSlot:
        """Room for one state or history read under `heavy_reads_per_minute` and
        `max_heavy_reads_per_user`, or 429: a few users reading huge histories must not
        stall everyone else's reads on the web processes and PostgreSQL."""
        if self.throttled():
            self.runs.gcra(
                self.keys.heavy_rate(user_id),
                "heavy_reads_per_minute",
                self.settings.heavy_reads_per_minute,
                "state and history reads per minute",
            )
        return self._slot(
            user_id,
            self.keys.heavy_reads(user_id),
            "max_heavy_reads_per_user",
            self.settings.max_heavy_reads_per_user,
            "state and history reads in flight",
        )

    def _slot(self, user_id: str, key: str, name: str, limit: int, what: str) -> ConnectionSlot:
        if not self.throttled():
            return ConnectionSlot(self, user_id, "", released=True, key=key)  # nothing to hold
        ttl_ms = int(self.settings.limit_slot_ttl_s * 1000)
        slot_id = uuid.uuid4().hex
        if not self._acquire_conn(keys=[key], args=[limit, slot_id, ttl_ms]):
            raise LimitExceeded(
                name,
                f"at most {limit} {what} per user",
                retry_after=self.settings.active_runs_retry_after_s,
            )
        return ConnectionSlot(self, user_id, slot_id, key=key)


@contextmanager
def heavy_read() -> Iterator[None]:
    """Hold one of the caller's heavy-read slots for the block (429 when none is free)."""
    slot = limiter().acquire_heavy_read(principal().subject)
    try:
        yield
    finally:
        slot.release()


def limiter() -> Limiter:
    """The Limiter of the current app."""
    return current_app.extensions["threadrun_limits"]  # type: ignore[no-any-return]


# --- the HTTP hooks ---------------------------------------------------------------------------------


class _SlotStream:
    """A streamed body that renews its connection slot per chunk and frees it on close, or
    as soon as the client hangs up (`_watch_hangup`): a server notices a closed stream only
    at its next write, up to a heartbeat later, and meanwhile the user's immediate
    reconnect would find the slot still taken (429)."""

    def __init__(self, body: Iterable[Any], slot: ConnectionSlot) -> None:
        self._body = body
        self._slot = slot
        self._watcher = _watch_hangup(request.environ.get("gunicorn.socket"), slot)

    def __iter__(self) -> Iterator[Any]:
        for chunk in self._body:
            self._slot.maybe_renew()
            yield chunk

    def close(self) -> None:
        try:
            if self._watcher is not None:
                if self._slot.released:
                    # The watcher saw the hang-up and is freeing the slot: it no longer
                    # waits on the socket, so let its Redis call finish (killed mid-call,
                    # the slot stayed taken until its TTL).
                    self._watcher.join()
                else:
                    # Dead before this returns: on a keep-alive connection gunicorn reads
                    # the next request from the same socket right after, and two greenlets
                    # waiting on one socket fail both (ConcurrentObjectUseError: a 500).
                    self._watcher.kill(block=True)
            close = getattr(self._body, "close", None)
            if close is not None:
                close()
        finally:
            self._slot.release()


def _watch_hangup(sock: socket.socket | None, slot: ConnectionSlot) -> Any:
    """Under gevent, a greenlet that frees `slot` when the client closes `sock` (a peek
    that reads end-of-file); None elsewhere (the gthread server: the slot is freed at the
    stream's next write). Data from the client (it never sends any on a stream) ends the
    watch without consuming it."""
    if sock is None or not gevent_monkey.is_module_patched("socket"):
        return None

    def watch() -> None:
        try:
            if sock.recv(1, socket.MSG_PEEK) == b"":
                slot.release()
        except OSError:
            slot.release()

    return gevent.spawn(watch)


def _read_body_in_time() -> None:
    """Read a request's body (cached for the views) within `request_body_timeout_s`, or 408:
    a client that trickles its body must not hold a connection for minutes. Under gevent a
    timeout bounds the whole read; under gthread the socket's timeout bounds each wait for
    more bytes."""
    if not request.content_length and request.headers.get("Transfer-Encoding") is None:
        return
    limit = limiter().settings.request_body_timeout_s
    late = RequestTimeout(f"the request body did not arrive within {limit:g} s")
    if gevent_monkey.is_module_patched("socket"):
        with gevent.Timeout(limit, late):
            request.get_data(cache=True)
        return
    sock: socket.socket | None = request.environ.get("gunicorn.socket")
    if sock is None:
        request.get_data(cache=True)
        return
    previous = sock.gettimeout()
    sock.settimeout(limit)
    try:
        request.get_data(cache=True)
    except OSError as exc:  # TimeoutError included
        raise late from exc
    finally:
        sock.settimeout(previous)


def _before() -> None:
    if request.method == "OPTIONS":
        return
    spec = spec_of(current_app, request.endpoint)
    if spec is not None and spec.holds_connection:
        g.limit_conn = limiter().acquire_connection(principal().subject)


def _after(resp: Response) -> Response:
    conn: ConnectionSlot | None = g.pop("limit_conn", None)
    if conn is not None:
        if resp.is_streamed and resp.status_code < 300:
            resp.response = _SlotStream(resp.response, conn)
        else:
            conn.release()
    return resp


def _teardown(_exc: BaseException | None) -> None:
    """Release what an exception left taken (after_request does not run then)."""
    conn: ConnectionSlot | None = g.pop("limit_conn", None)
    if conn is not None:
        conn.release()


def init_app(app: Flask) -> None:
    """Install the limit hooks (after Services are built); `app/errors.py` answers
    `LimitExceeded` like every other error (429 with Retry-After, or 422)."""
    app.extensions["threadrun_limits"] = Limiter(app.extensions["threadrun"])
    app.before_request(_read_body_in_time)
    app.before_request(_before)
    app.after_request(_after)
    app.teardown_request(_teardown)


class TokenBucket:
    """Frames per second of one WebSocket (process-local: the socket lives in one process)."""

    def __init__(self, rate: float, burst: int, clock: Any = time.monotonic) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self._clock = clock
        self._at = clock()

    def take(self) -> bool:
        """Spend one token if there is one."""
        now = self._clock()
        self.tokens = min(self.burst, self.tokens + (now - self._at) * self.rate)
        self._at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def wait_s(self) -> float:
        """Seconds until the next token."""
        return max(0.0, (1 - self.tokens) / self.rate)
