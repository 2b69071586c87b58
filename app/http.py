"""Small HTTP helpers: JSON responses and body/query parsing through pydantic models."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from flask import Response, request
from pydantic import BaseModel, ValidationError

from shared import serde
from shared.errors import RunNotFound, ValidationFailed

M = TypeVar("M", bound=BaseModel)


def checked_thread_id(thread_id: str) -> str:
    """The storage id of the caller's thread the client calls `thread_id` (thread ids are
    per owner, A4: app/thread_ids.py). A thread id that is not a UUID cannot exist: 404,
    exactly like a missing one."""
    from app import thread_ids

    return thread_ids.resolve(thread_id)


def canonical_id(value: str, missing: Callable[[str], Exception]) -> str:
    """The canonical form of a UUID in a path; one that is not a UUID cannot exist, so it
    raises `missing(message)` exactly like a missing one (a 404)."""
    try:
        return str(uuid.UUID(value))
    except ValueError as exc:
        raise missing(f"{value[:64]} not found") from exc


def checked_run_id(run_id: str) -> str:
    """A run id that is not a UUID cannot exist: 404, exactly like a missing one."""
    return canonical_id(run_id, lambda m: RunNotFound(f"run {m}"))


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response encoded with our serde (datetimes, UUIDs, messages)."""
    return Response(serde.dumps(obj), status=status, mimetype="application/json", headers=headers)


def error_body(code: str, message: str, field: str | None = None) -> dict[str, object]:
    """The JSON error shape: `detail` for LangGraph SDK users, plus code and field."""
    body: dict[str, object] = {"error": code, "message": message, "detail": message}
    if field:
        body["field"] = field
    return body


def require_json_content_type() -> None:
    """415 for a request that declares a body type other than JSON: a
    browser sends text/plain, form or multipart bodies cross-site without a preflight, so
    a JSON endpoint must never read one. No Content-Type at all (curl without -H) is read
    as JSON."""
    declared = request.mimetype
    if declared and declared != "application/json" and not declared.endswith("+json"):
        raise ValidationFailed(
            f"Content-Type {declared[:100]!r} is not JSON: send application/json",
            field="Content-Type",
            status=415,
        )


def parse_body(model: type[M], *, allow_empty: bool = False) -> M:
    """Validate the JSON body; 422 naming the field on error, 400 on non-JSON, 415 when
    the body is declared as something else."""
    require_json_content_type()
    raw = request.get_data(cache=True)
    if not raw.strip():
        if allow_empty:
            return model()
        raise ValidationFailed("request body must be a JSON object", field="body", status=422)
    try:
        data = serde.loads(raw)
    except ValueError as exc:
        raise ValidationFailed(
            f"request body is not valid JSON: {exc}", field="body", status=400
        ) from exc
    if not isinstance(data, dict):
        raise ValidationFailed("request body must be a JSON object", field="body")
    return validate(model, data)


def read_json_body() -> Any:
    """The request's JSON body (None when empty); 400 when it is not JSON, 415 when it is
    declared as something else."""
    require_json_content_type()
    raw = request.get_data(cache=True)
    if not raw.strip():
        return None
    try:
        return serde.loads(raw)
    except ValueError as exc:
        raise ValidationFailed(
            f"request body is not valid JSON: {exc}", field="body", status=400
        ) from exc


def validate_items(model: type[M], data: Any) -> list[M]:
    """Validate a non-empty JSON array item by item; 422 naming the item (`[i].field`)."""
    if not isinstance(data, list) or not data:
        raise ValidationFailed("request body must be a non-empty JSON array", field="body")
    items = []
    for index, item in enumerate(data):
        if not isinstance(item, dict):
            raise ValidationFailed(f"[{index}]: must be a JSON object", field=f"[{index}]")
        items.append(validate(model, item, prefix=f"[{index}]."))
    return items


def nul_field(value: Any, path: str = "") -> str | None:
    """The path of the first string or key holding a NUL character, else None."""
    if isinstance(value, str):
        return (path or "body") if "\x00" in value else None
    items: Any = ()
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    for key, item in items:
        here = f"{path}.{key}" if path else str(key)
        if isinstance(key, str) and "\x00" in key:
            return here.replace("\x00", "\\u0000")
        found = nul_field(item, here)
        if found is not None:
            return found.replace("\x00", "\\u0000")
    return None


def validate(model: type[M], data: dict[str, Any], prefix: str = "") -> M:
    """Validate a dict against a model, mapping errors to ValidationFailed (the field
    named after `prefix`, e.g. `[2].` for an item of an array body).

    Strings with a NUL character are refused here (422 naming the field): PostgreSQL text
    and jsonb cannot hold one, so they would fail later as a 500 (found by the fuzzer).
    """
    from app.errors import validation_failed

    if b"\\u0000" in serde.dumps(data):  # cheap pre-check; the walk names the field
        field = nul_field(data)
        if field is not None:
            field = f"{prefix}{field}"
            raise ValidationFailed(
                f"{field}: the NUL character (\\u0000) is not allowed", field=field
            )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_failed(exc, prefix) from exc


def parse_query(model: type[M]) -> M:
    """Validate the query string."""
    return validate(model, request.args.to_dict())
