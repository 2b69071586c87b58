"""One place that maps errors to HTTP status + JSON body: the `REPLIES` table.

An error answers with the row of the most specific class in its MRO, so a subclass of a
kind (`RunNotFound` of `NotFound`) answers as the kind unless it has a row of its own.
Flask and werkzeug errors (`HTTPException`) and driver errors PostgreSQL refuses as data
(`psycopg.errors.DataError`) have rows too, and so has a service this process cannot reach
(Redis or PostgreSQL: 503 `service_unavailable` with Retry-After, naming the service; the
client retries, as from a request the server refused while it restarts). Anything else is
a 500 without detail.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import psycopg
import redis
from flask import Flask, Response
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from app.responses import error_body, json_response
from shared.authz.decide import Denied
from shared.errors import (
    ConfigError,
    Conflict,
    LeaseLost,
    LimitExceeded,
    NotFound,
    PermissionDenied,
    StreamCursorInvalid,
    ThreadrunError,
    UpstreamFailed,
    ValidationFailed,
)

log = logging.getLogger(__name__)

__all__ = [
    "REPLIES",
    "LimitExceeded",
    "SERVICE_ERRORS",
    "Reply",
    "error_body",
    "limit_body",
    "register",
    "reply_for",
    "unavailable_service",
    "validation_failed",
]


class Reply(NamedTuple):
    """What an error answers: status, JSON body and extra headers."""

    status: int
    body: dict[str, object]
    headers: dict[str, str] | None = None


def limit_body(exc: LimitExceeded) -> dict[str, object]:
    """The JSON error of a per-user limit: naming the limit (its settings field), the field
    and, for rates and counts, when to retry."""
    out = error_body("limit_exceeded", str(exc), exc.field)
    out["limit"] = exc.limit
    if exc.retry_after is not None:
        out["retry_after"] = exc.retry_after
    return out


def _limited(exc: LimitExceeded) -> Reply:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return Reply(exc.status, limit_body(exc), headers)


def _data_error(exc: psycopg.errors.DataError) -> Reply:
    # A value PostgreSQL cannot represent (an integer beyond bigint, a NUL in text) is the
    # client's input: 422, not 500. Models bound what they can and name the field first.
    log.warning("request refused by PostgreSQL: %s", type(exc).__name__)
    return Reply(422, error_body("invalid_request", "a value is out of range or cannot be stored"))


SERVICE_RETRY_AFTER_S = 5
"""Retry-After of a 503 for an unreachable service: about one reconnect of its clients."""


SERVICE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,  # refused, reset, Sentinel without a primary, loading
    redis.TimeoutError,
    psycopg.OperationalError,  # no connection, PoolTimeout, server shutdown
)
"""Errors that mean a service this process needs is unreachable (not a fault of the request)."""

SERVICE_NAMES = {"redis": "Redis", "postgres": "PostgreSQL"}


def unavailable_service(exc: BaseException) -> str | None:
    """`redis` or `postgres` when `exc` says that service is unreachable, else None."""
    if not isinstance(exc, SERVICE_ERRORS):
        return None
    return "redis" if isinstance(exc, redis.RedisError) else "postgres"


def unavailable_message(service: str) -> str:
    """What a client is told about an unreachable service (never the driver's text: it can
    carry addresses)."""
    return f"{SERVICE_NAMES[service]} is unavailable to this server; retry in a few seconds"


def log_unavailable(service: str, exc: BaseException) -> None:
    """One warning line for a request an unreachable service failed."""
    log.warning("%s unavailable: %s: %s", SERVICE_NAMES[service], type(exc).__name__, exc)


def _unavailable(exc: Exception) -> Reply:
    # Connection refused or lost, a timeout, an exhausted pool (PoolTimeout), a server
    # shutting down: the request may succeed once the service is back, so 503 + Retry-After.
    service = unavailable_service(exc) or "postgres"
    log_unavailable(service, exc)
    return Reply(
        503,
        error_body("service_unavailable", unavailable_message(service)),
        {"Retry-After": str(SERVICE_RETRY_AFTER_S)},
    )


DENIED_CODES = {401: "unauthorized", 403: "forbidden", 404: "not_found"}


def _denied(exc: Denied) -> Reply:
    # The project's own auth (shared/authz/) refused: its status, detail and headers.
    code = DENIED_CODES.get(exc.status, "auth_error")
    return Reply(exc.status, error_body(code, exc.detail), dict(exc.headers) or None)


def _ours(exc: ThreadrunError) -> Reply:
    log.exception("unhandled threadrun error")
    return Reply(500, error_body(exc.code, str(exc)))


def _http(exc: HTTPException) -> Reply:
    code = (exc.name or "error").lower().replace(" ", "_")
    # werkzeug's own headers go along (a 405's Allow, which RFC 9110 requires; a 401's
    # WWW-Authenticate), less its HTML content type: the body is JSON.
    headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
    return Reply(exc.code or 500, error_body(code, exc.description or exc.name), headers or None)


def _unexpected(exc: BaseException) -> Reply:
    log.exception("unexpected error")
    return Reply(500, error_body("internal_error", "internal error"))


# Each function takes an error of its key's class (hence Any: the table is heterogeneous).
REPLIES: dict[type[Exception], Callable[[Any], Reply]] = {
    Denied: _denied,  # the project's auth handlers (auth.path) refused
    LimitExceeded: _limited,  # 429 with Retry-After (rates, counts) or 422 (sizes)
    StreamCursorInvalid: lambda e: Reply(400, error_body(e.code, str(e), e.field)),
    ValidationFailed: lambda e: Reply(e.status, error_body(e.code, str(e), e.field)),
    NotFound: lambda e: Reply(404, error_body(e.code, str(e))),
    PermissionDenied: lambda e: Reply(403, error_body(e.code, str(e))),
    Conflict: lambda e: Reply(409, error_body(e.code, str(e))),
    LeaseLost: lambda e: Reply(409, error_body(e.code, str(e))),
    UpstreamFailed: lambda e: Reply(502, error_body(e.code, str(e))),
    ConfigError: _unexpected,  # the server's fault: no detail for the client
    psycopg.errors.DataError: _data_error,
    **{cls: _unavailable for cls in SERVICE_ERRORS},  # 503 with Retry-After
    ThreadrunError: _ours,
    HTTPException: _http,
    Exception: _unexpected,
}


def reply_for(exc: BaseException) -> Reply:
    """The reply of the most specific class of `exc` in `REPLIES`."""
    for cls in type(exc).__mro__:
        rule = REPLIES.get(cls)
        if rule is not None:
            return rule(exc)
    return _unexpected(exc)


def validation_failed(exc: ValidationError, prefix: str = "") -> ValidationFailed:
    """The first pydantic error as a ValidationFailed naming the field."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    field = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or None)
    msg = err.get("msg", "invalid value")
    return ValidationFailed(f"{field}: {msg}" if field else msg, field=field)


def _handle(exc: Exception) -> Response:
    reply = reply_for(exc)
    return json_response(reply.body, reply.status, headers=reply.headers)


def register(app: Flask) -> None:
    """Install one handler for every class in `REPLIES`."""
    for cls in REPLIES:
        app.register_error_handler(cls, _handle)
