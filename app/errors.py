"""One place that maps errors to HTTP status + JSON body: the `REPLIES` table.

An error answers with the row of the most specific class in its MRO, so a subclass of a
kind (`RunNotFound` of `NotFound`) answers as the kind unless it has a row of its own.
Flask and werkzeug errors (`HTTPException`) and driver errors PostgreSQL refuses as data
(`psycopg.errors.DataError`) have rows too; anything else is a 500 without detail.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import psycopg
from flask import Flask, Response
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from app.http import error_body, json_response
from app.limits import LimitExceeded
from shared.errors import (
    ConfigError,
    Conflict,
    LeaseLost,
    NotFound,
    PermissionDenied,
    StreamCursorInvalid,
    ThreadrunError,
    UpstreamFailed,
    ValidationFailed,
)

log = logging.getLogger(__name__)

__all__ = ["REPLIES", "Reply", "error_body", "register", "reply_for", "validation_failed"]


class Reply(NamedTuple):
    """What an error answers: status, JSON body and extra headers."""

    status: int
    body: dict[str, object]
    headers: dict[str, str] | None = None


def _limited(exc: LimitExceeded) -> Reply:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return Reply(exc.status, exc.body(), headers)


def _data_error(exc: psycopg.errors.DataError) -> Reply:
    # A value PostgreSQL cannot represent (an integer beyond bigint, a NUL in text) is the
    # client's input: 422, not 500. Models bound what they can and name the field first.
    log.warning("request refused by PostgreSQL: %s", type(exc).__name__)
    return Reply(422, error_body("invalid_request", "a value is out of range or cannot be stored"))


def _ours(exc: ThreadrunError) -> Reply:
    log.exception("unhandled threadrun error")
    return Reply(500, error_body(exc.code, str(exc)))


def _http(exc: HTTPException) -> Reply:
    code = (exc.name or "error").lower().replace(" ", "_")
    return Reply(exc.code or 500, error_body(code, exc.description or exc.name))


def _unexpected(exc: BaseException) -> Reply:
    log.exception("unexpected error")
    return Reply(500, error_body("internal_error", "internal error"))


# Each function takes an error of its key's class (hence Any: the table is heterogeneous).
REPLIES: dict[type[Exception], Callable[[Any], Reply]] = {
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
