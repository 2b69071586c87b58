"""One place that maps shared.errors (and pydantic/werkzeug errors) to HTTP status + JSON."""

from __future__ import annotations

import logging

import psycopg
from flask import Flask, Response
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from app.http import json_response
from shared.errors import (
    Conflict,
    LeaseLost,
    NotFound,
    StreamCursorInvalid,
    ThreadrunError,
    ValidationFailed,
)

log = logging.getLogger(__name__)


def error_body(code: str, message: str, field: str | None = None) -> dict[str, object]:
    """The JSON error shape: `detail` for LangGraph SDK users, plus code and field."""
    body: dict[str, object] = {"error": code, "message": message, "detail": message}
    if field:
        body["field"] = field
    return body


def validation_failed(exc: ValidationError, prefix: str = "") -> ValidationFailed:
    """The first pydantic error as a ValidationFailed naming the field."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    field = f"{prefix}{loc}" if loc else (prefix.rstrip(".") or None)
    msg = err.get("msg", "invalid value")
    return ValidationFailed(f"{field}: {msg}" if field else msg, field=field)


def register(app: Flask) -> None:
    """Install the error handlers."""

    @app.errorhandler(ValidationFailed)
    def _invalid(exc: ValidationFailed) -> Response:
        return json_response(error_body(exc.code, str(exc), exc.field), exc.status)

    @app.errorhandler(StreamCursorInvalid)
    def _cursor(exc: StreamCursorInvalid) -> Response:
        return json_response(error_body(exc.code, str(exc), exc.field), 400)

    @app.errorhandler(NotFound)
    def _not_found(exc: NotFound) -> Response:
        return json_response(error_body(exc.code, str(exc)), 404)

    @app.errorhandler(Conflict)
    def _conflict(exc: Conflict) -> Response:
        return json_response(error_body(exc.code, str(exc)), 409)

    @app.errorhandler(LeaseLost)
    def _lease(exc: LeaseLost) -> Response:
        return json_response(error_body(exc.code, str(exc)), 409)

    @app.errorhandler(psycopg.errors.DataError)
    def _data(exc: psycopg.errors.DataError) -> Response:
        # A value PostgreSQL cannot represent (an integer beyond bigint, a NUL in text) is the
        # client's input: 422, not 500. Models bound what they can and name the field first.
        log.warning("request refused by PostgreSQL: %s", type(exc).__name__)
        msg = "a value is out of range or cannot be stored"
        return json_response(error_body("invalid_request", msg), 422)

    @app.errorhandler(ThreadrunError)
    def _ours(exc: ThreadrunError) -> Response:
        log.exception("unhandled threadrun error")
        return json_response(error_body(exc.code, str(exc)), 500)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> Response:
        code = (exc.name or "error").lower().replace(" ", "_")
        return json_response(error_body(code, exc.description or exc.name), exc.code or 500)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        log.exception("unexpected error")
        return json_response(error_body("internal_error", "internal error"), 500)
