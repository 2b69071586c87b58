"""The two shapes every answer of the web edge is built from: a JSON response encoded
with our serde, and the JSON error body. The ground floor of `app/`: it imports nothing
of `app/`, so the error map (`app/errors.py`), the request helpers (`app/http.py`) and
the limits (`app/limits.py`) all build on it without a circle."""

from __future__ import annotations

from typing import Any

from flask import Response

from shared import serde


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response encoded with our serde (datetimes, UUIDs, messages)."""
    return Response(serde.dumps(obj), status=status, mimetype="application/json", headers=headers)


def error_body(code: str, message: str, field: str | None = None) -> dict[str, object]:
    """The JSON error shape: `detail` for LangGraph SDK users, plus code and field."""
    body: dict[str, object] = {"error": code, "message": message, "detail": message}
    if field:
        body["field"] = field
    return body
