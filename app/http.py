"""Request parsing through pydantic models, and the view decorators that declare what a
route takes and holds.

A view says what it reads and what it does with decorators under its `@bp.<method>`:

    @bp.post("/threads/<thread_id>/runs/stream")
    @streams_events                # an open connection (the limiter counts it), SSE answer
    @run_sized                     # run sizes checked on the raw body (app/limits.py)
    @body(RunCreate)               # parsed once, injected as `body=`
    def create_stream(thread_id: str, body: RunCreate) -> Response: ...

Each decorator records itself in the view's `ViewSpec` (one object, carried up the
decorator chain by `functools.wraps`), and the rest of the edge reads that spec from the
URL map instead of tables of endpoint names: the limiter (`app/limits.py`) takes a
connection slot for `holds_connection`, and `/openapi.json` (`app/api/openapi.py`) documents
every body, query, media type and extra answer. A new route is limited and documented by
what it declares, or it is neither.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from flask import Flask, request
from pydantic import BaseModel, ValidationError

from app.errors import validation_failed
from shared import serde
from shared.errors import ValidationFailed

M = TypeVar("M", bound=BaseModel)
V = TypeVar("V", bound=Callable[..., Any])

RawCheck = Callable[[Any], None]
"""A check of a request's raw JSON body, before the model validates it (sizes: a model
would normalise what they count, e.g. drop repeated stream modes)."""


@dataclass
class ViewSpec:
    """What a view declared about its request and its answer."""

    body: type[BaseModel] | None = None
    """The model of its JSON body (`@body`), injected as `body=`."""
    body_required: bool = False
    body_items: bool = False
    """The body is a non-empty JSON array of `body` objects (a batch)."""
    query: type[BaseModel] | None = None
    """The model of its query string (`@query`), injected as `query=`."""
    raw_checks: list[RawCheck] = field(default_factory=list)
    holds_connection: bool = False
    """The answer is held open (SSE, /wait, /join): one of the user's connection slots."""
    media: str = "application/json"
    """The media type of its 200 answer."""
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Answers other than 200 and the common errors, by status (OpenAPI response objects)."""


def view_spec(view: Callable[..., Any]) -> ViewSpec:
    """The spec of `view` (made empty on first use)."""
    spec: ViewSpec | None = view.__dict__.get("view_spec")
    if spec is None:
        spec = ViewSpec()
        view.__dict__["view_spec"] = spec
    return spec


def spec_of(app: Flask, endpoint: str | None) -> ViewSpec | None:
    """The spec of the view serving `endpoint` in `app`, if it declared one."""
    view = app.view_functions.get(endpoint) if endpoint else None
    return view.__dict__.get("view_spec") if view is not None else None


def _injecting(view: V, name: str, parse: Callable[[], Any]) -> V:
    @functools.wraps(view)  # copies __dict__: the wrapper carries the same ViewSpec
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs[name] = parse()
        return view(*args, **kwargs)

    return cast(V, wrapper)


def body(model: type[BaseModel], *, required: bool = True, items: bool = False) -> Callable[[V], V]:
    """The view takes a JSON body validated by `model` as `body=` (422 naming the field,
    400 when it is not JSON, 415 when it is declared as something else). Not `required`: an
    empty body is `model()`. `items`: a non-empty array of `model` objects, as a list."""

    def decorate(view: V) -> V:
        spec = view_spec(view)
        spec.body, spec.body_required, spec.body_items = model, required or items, items
        return _injecting(view, "body", lambda: _parsed_body(spec))

    return decorate


def query(
    model: type[BaseModel], *, args: Callable[[], dict[str, Any]] | None = None
) -> Callable[[V], V]:
    """The view takes its query string validated by `model` as `query=`; `args` reads the
    query string into the dict to validate when plain `request.args` is not it (repeated
    or comma-separated parameters)."""

    def decorate(view: V) -> V:
        view_spec(view).query = model
        read = args or (lambda: request.args.to_dict())
        return _injecting(view, "query", lambda: validate(model, read()))

    return decorate


def checks_raw(check: RawCheck) -> Callable[[V], V]:
    """Run `check` on the raw JSON body before its model validates it."""

    def decorate(view: V) -> V:
        view_spec(view).raw_checks.append(check)
        return view

    return decorate


def holds_connection(view: V) -> V:
    """The view's answer is held open until a run ends (/wait, /join): it counts as one of
    the user's open connections while it lasts (app/limits.py)."""
    view_spec(view).holds_connection = True
    return view


def streams_events(view: V) -> V:
    """The view answers an SSE stream: held open like `holds_connection`."""
    spec = view_spec(view)
    spec.holds_connection, spec.media = True, "text/event-stream"
    return view


def returns(media: str) -> Callable[[V], V]:
    """The view's 200 answer is `media` (not JSON)."""

    def decorate(view: V) -> V:
        view_spec(view).media = media
        return view

    return decorate


def answers(status: int, description: str, *, json: bool = False) -> Callable[[V], V]:
    """The view may also answer `status` (a 202, a 204, a 502 of its own); `json`: with a
    JSON body (an error's shape for a 4xx/5xx)."""

    def decorate(view: V) -> V:
        out: dict[str, Any] = {"description": description}
        if json:
            error = {"schema": {"$ref": "#/components/schemas/Error"}} if status >= 400 else {}
            out["content"] = {"application/json": error}
        view_spec(view).answers[str(status)] = out
        return view

    return decorate


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


def _parsed_body(spec: ViewSpec) -> Any:
    model = spec.body
    assert model is not None
    sent, data = _json_body()
    if spec.body_items:
        for check in spec.raw_checks:
            check(data)
        return validate_items(model, data)
    if not sent:
        if not spec.body_required:
            return model()
        raise ValidationFailed("request body must be a JSON object", field="body", status=422)
    if not isinstance(data, dict):
        raise ValidationFailed("request body must be a JSON object", field="body")
    for check in spec.raw_checks:
        check(data)
    return validate(model, data)


def _json_body() -> tuple[bool, Any]:
    """(whether the request has a body, its JSON); 400 when it is not JSON, 415 when it is
    declared as something else."""
    require_json_content_type()
    raw = request.get_data(cache=True)
    if not raw.strip():
        return False, None
    try:
        return True, serde.loads(raw)
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
    if b"\\u0000" in serde.dumps(data):  # cheap pre-check; the walk names the field
        field_name = nul_field(data)
        if field_name is not None:
            field_name = f"{prefix}{field_name}"
            raise ValidationFailed(
                f"{field_name}: the NUL character (\\u0000) is not allowed", field=field_name
            )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_failed(exc, prefix) from exc


def non_empty_args(*, multi: tuple[str, ...] = ()) -> dict[str, Any]:
    """The query string without empty values (the SDK sends `stream_mode=` when it has
    none), each of `multi` as the list of its non-empty values."""
    args: dict[str, Any] = {k: v for k, v in request.args.items() if v != "" and k not in multi}
    for name in multi:
        values = [v for v in request.args.getlist(name) if v]
        if values:
            args[name] = values
    return args
