"""Small HTTP helpers: JSON responses and body/query parsing through pydantic models."""

from __future__ import annotations

from typing import Any, TypeVar

from flask import Response, request
from pydantic import BaseModel, ValidationError

from shared import serde
from shared.errors import ValidationFailed

M = TypeVar("M", bound=BaseModel)


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response encoded with our serde (datetimes, UUIDs, messages)."""
    return Response(serde.dumps(obj), status=status, mimetype="application/json", headers=headers)


def parse_body(model: type[M], *, allow_empty: bool = False) -> M:
    """Validate the JSON body; 422 naming the field on error, 400 on non-JSON."""
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


def validate(model: type[M], data: dict[str, Any]) -> M:
    """Validate a dict against a model, mapping errors to ValidationFailed."""
    from app.errors import validation_failed

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_failed(exc) from exc


def parse_query(model: type[M]) -> M:
    """Validate the query string."""
    return validate(model, request.args.to_dict())
