"""`GET /openapi.json` (A5): the routes of this app, with request schemas from the pydantic models.

The document is built from what the app really serves (Flask's URL map) and from what each
view declared with the decorators of app/http.py (`@body`, `@query`, `@streams_events`,
`@returns`, `@answers`): the same models that validate requests, so it cannot drift from
either.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from flask import Blueprint, Flask, Response, current_app
from pydantic.json_schema import models_json_schema

from app.api.meta import VERSION
from app.http import ViewSpec, spec_of

bp = Blueprint("openapi", __name__)

_PARAM = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
ERROR = {"$ref": "#/components/schemas/Error"}


JSONRPC_ERROR = {"$ref": "#/components/schemas/JsonRpcError"}
JSONRPC_TAGS = frozenset({"mcp", "a2a"})
"""The JSON-RPC protocols (app/protocols/): their 4xx answers are JSON-RPC error objects
once a request reached the protocol, the common Error before (authentication, limits)."""


def _error_responses(jsonrpc: bool = False) -> dict[str, Any]:
    schema = {"oneOf": [ERROR, JSONRPC_ERROR]} if jsonrpc else ERROR
    content = {"application/json": {"schema": schema}}
    return {
        code: {"description": why, "content": content}
        for code, why in (
            ("400", "malformed request or cursor"),
            ("401", "missing or invalid API key"),
            (
                "403",
                "the ops role or an allowed Origin is required; a system assistant is read-only",
            ),
            ("404", "not found (or another user's)"),
            ("409", "conflict (busy thread, existing thread or assistant)"),
            ("413", "body too large"),
            ("422", "invalid field (named in `field`), or a size limit (named in `limit`)"),
            ("429", "a per-user limit (named in `limit`); see Retry-After"),
        )
    } | {
        # Refused by gunicorn before the app sees it (request line > 4094 bytes), in HTML.
        "414": {"description": "request line too long", "content": {"text/html": {}}}
    }


def _specs(app: Flask) -> dict[str, ViewSpec]:
    """The declared spec of every documented endpoint (an undecorated view: the default)."""
    return {
        rule.endpoint: spec_of(app, rule.endpoint) or ViewSpec()
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static" and not rule.endpoint.startswith(("ui.", "ws.", "openapi."))
    }


def _answers(spec: ViewSpec, jsonrpc: bool) -> dict[str, Any]:
    """The view's own answers; a JSON-RPC protocol's 4xx may be its error object."""
    if not jsonrpc:
        return spec.answers
    out = {}
    for status, answer in spec.answers.items():
        if int(status) >= 400 and "application/json" in answer.get("content", {}):
            schema = {"oneOf": [ERROR, JSONRPC_ERROR]}
            answer = {**answer, "content": {"application/json": {"schema": schema}}}
        out[status] = answer
    return out


def _operation(
    endpoint: str,
    method: str,
    arguments: list[str],
    spec: ViewSpec,
    refs: Any,
    components: dict[str, Any],
) -> dict[str, Any]:
    jsonrpc = endpoint.split(".")[0] in JSONRPC_TAGS
    op: dict[str, Any] = {
        "operationId": f"{endpoint.replace('.', '_')}_{method.lower()}",
        "tags": [endpoint.split(".")[0]],
        "parameters": [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in arguments
        ],
        "responses": {
            "200": {"description": "OK", "content": {spec.media: {}}},
            **_answers(spec, jsonrpc),
            **_error_responses(jsonrpc),
        },
    }
    if spec.body is not None:
        schema = refs[(spec.body, "validation")]
        if spec.body_items:  # validated item by item, so that an error names the item
            schema = {"type": "array", "items": schema, "minItems": 1}
        op["requestBody"] = {
            "required": spec.body_required,
            "content": {"application/json": {"schema": schema}},
        }
    if spec.query is not None:
        # The query model's own component (built with the others, so that the enums and
        # models its fields name are components too and every `$ref` resolves).
        ref = refs[(spec.query, "validation")]["$ref"]
        schema = components[ref.rsplit("/", 1)[1]]
        for name, prop in schema.get("properties", {}).items():
            op["parameters"].append(
                {
                    "name": name,
                    "in": "query",
                    "required": name in schema.get("required", []),
                    "schema": prop,
                }
            )
    return op


def build(app: Flask) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `app`."""
    specs = _specs(app)
    models = {m for spec in specs.values() for m in (spec.body, spec.query) if m is not None}
    refs, defs = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)],
        ref_template="#/components/schemas/{model}",
    )
    components = dict(defs.get("$defs", {}))
    components["Error"] = {
        "type": "object",
        "properties": {
            "error": {"type": "string"},
            "message": {"type": "string"},
            "detail": {"type": "string"},
            "field": {"type": "string"},
        },
        "required": ["error", "message"],
    }
    components["JsonRpcError"] = {
        "type": "object",
        "properties": {
            "jsonrpc": {"const": "2.0"},
            "id": {},
            "error": {
                "type": "object",
                "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
                "required": ["code", "message"],
            },
        },
        "required": ["jsonrpc", "error"],
    }
    paths: dict[str, dict[str, Any]] = {}
    for rule in app.url_map.iter_rules():
        spec = specs.get(rule.endpoint)
        if spec is None or rule.websocket:  # a WebSocket is not an OpenAPI operation
            continue
        path = _PARAM.sub(r"{\1}", rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            names = _PARAM.findall(rule.rule)  # in path order (`rule.arguments` is a set)
            op = _operation(rule.endpoint, method, names, spec, refs, components)
            paths.setdefault(path, {})[method.lower()] = op
    schemes: dict[str, Any] = {"apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}
    security: list[Any] = [{"apiKey": []}]
    described = app.extensions["threadrun_project"].auth.openapi
    if described is not None:  # the project's auth describes itself (`auth.openapi`)
        schemes, security = dict(described.security_schemes), list(described.security)
        for path, methods in described.paths.items():
            for method, requirement in methods.items():
                operation: dict[str, Any] | None = paths.get(path, {}).get(method.lower())
                if operation is not None:
                    operation["security"] = requirement
    return {
        "openapi": "3.1.0",
        "info": {"title": "threadrun", "version": VERSION},
        "components": {"schemas": components, "securitySchemes": schemes},
        "security": security,
        "paths": dict(sorted(paths.items())),
    }


@cache
def _document(app_id: int) -> bytes:  # keyed per app
    from shared import serde

    return serde.dumps(build(current_app._get_current_object()))  # type: ignore[attr-defined]


@bp.get("/openapi.json")
def openapi() -> Response:
    """The OpenAPI document (A5)."""
    return Response(_document(id(current_app._get_current_object())), mimetype="application/json")  # type: ignore[attr-defined]
