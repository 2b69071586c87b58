"""`GET /openapi.json` (A5): the routes of this app, with request schemas from the pydantic models.

The document is built from what the app really serves (Flask's URL map) and from the same
models that validate requests, so it cannot drift from either.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from flask import Blueprint, Flask, Response, current_app
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app import schemas
from app.api import events as events_api
from app.api import memory as memory_api
from app.api import ops as ops_api
from app.api import store as store_api
from app.api.meta import VERSION

bp = Blueprint("openapi", __name__)

# endpoint -> (request body model, query model)
BODIES: dict[str, type[BaseModel]] = {
    "threads.create": schemas.ThreadCreate,
    "threads.patch": schemas.ThreadPatch,
    "threads.search": schemas.ThreadSearch,
    "threads.count": schemas.ThreadCount,
    "threads.copy": schemas.ThreadCopy,
    "threads.prune": schemas.ThreadPrune,
    "state.update_state": schemas.StateUpdate,
    "state.post_state_at": schemas.StateAtCheckpoint,
    "state.post_history": schemas.HistoryRequest,
    "assistants.create": schemas.AssistantCreate,
    "assistants.patch": schemas.AssistantUpdate,
    "assistants.search": schemas.AssistantSearch,
    "assistants.count": schemas.AssistantCount,
    "assistants.versions": schemas.AssistantVersionsQuery,
    "assistants.set_latest": schemas.AssistantLatest,
    "runs.create": schemas.RunCreate,
    "runs.create_stream": schemas.RunCreate,
    "runs.create_wait": schemas.RunCreate,
    "runs.create_stateless": schemas.StatelessRunCreate,
    "runs.create_stateless_stream": schemas.StatelessRunCreate,
    "runs.create_stateless_wait": schemas.StatelessRunCreate,
    "runs.create_batch": schemas.RunBatch,
    "runs.cancel_many": schemas.RunsCancel,
    "ops.cancel": ops_api.OpsCancel,
    "ops.requeue": ops_api.OpsRequeue,
    "store.put_item": store_api.StorePut,
    "store.delete_item": store_api.StoreDelete,
    "store.search_items": store_api.StoreSearch,
    "store.list_namespaces": store_api.StoreNamespaces,
    "crons.create_for_thread": schemas.CronCreate,
    "crons.create": schemas.CronCreate,
    "crons.patch": schemas.CronUpdate,
    "crons.search": schemas.CronSearch,
    "crons.count": schemas.CronCount,
}
REQUIRED_BODIES = {schemas.RunCreate, schemas.AssistantCreate, schemas.AssistantLatest}
QUERIES: dict[str, type[BaseModel]] = {
    "assistants.delete": schemas.AssistantDeleteQuery,
    "assistants.graph": schemas.AssistantGraphQuery,
    "assistants.subgraphs": schemas.SubgraphsQuery,
    "runs.list_runs": schemas.RunListQuery,
    "runs.cancel": schemas.CancelQuery,
    "runs.cancel_many": schemas.CancelManyQuery,
    "runs.join_stream": schemas.JoinStreamQuery,
    "thread_stream.join": schemas.ThreadStreamQuery,
    "events.run_events": events_api.RunEventsQuery,
    "events.thread_events": events_api.ThreadEventsQuery,
    "events.message_page": events_api.ThreadEventsQuery,
    "ops.runs": ops_api.OpsRunsQuery,
    "ops.audit": ops_api.OpsAuditQuery,
    "memory.list_facts": memory_api.FactsQuery,
    "store.get_item": store_api.StoreGetQuery,
}
REQUIRED_BODIES = {
    schemas.RunCreate,
    schemas.StatelessRunCreate,
    schemas.RunBatch,
    schemas.RunsCancel,
    schemas.CronCreate,
}
STREAMING = {
    "runs.create_stream",
    "runs.create_stateless_stream",
    "runs.join_stream",
    "thread_stream.join",
}
PLAIN_TEXT = {"ops.metrics_endpoint"}  # Prometheus exposition format
FILES = {"artifacts.download"}  # an artifact's own bytes, whatever its type
OTHER_SUCCESS: dict[str, dict[str, Any]] = {
    "runs.cancel": {
        "202": {"description": "cancel accepted (wait=0)", "content": {"application/json": {}}}
    },
    "runs.delete": {"204": {"description": "deleted"}},
    "runs.cancel_many": {"204": {"description": "the selected runs are cancelled"}},
    "assistants.delete": {"204": {"description": "deleted"}},
    "memory.compact": {
        "502": {
            "description": "summary generation failed; the state is unchanged",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    },
    "threads.delete": {"204": {"description": "deleted"}},
    "store.put_item": {"204": {"description": "stored"}},
    "store.delete_item": {"204": {"description": "deleted (or there was nothing)"}},
    "crons.delete": {"204": {"description": "deleted"}},
}
_PARAM = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
ERROR = {"$ref": "#/components/schemas/Error"}


def _error_responses() -> dict[str, Any]:
    content = {"application/json": {"schema": ERROR}}
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


def build(app: Flask) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `app`."""
    models = {*BODIES.values(), *QUERIES.values()}
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
    paths: dict[str, dict[str, Any]] = {}
    for rule in app.url_map.iter_rules():
        if rule.endpoint in ("static",) or rule.endpoint.startswith(("ui.", "ws.", "openapi.")):
            continue
        path = _PARAM.sub(r"{\1}", rule.rule)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            op: dict[str, Any] = {
                "operationId": f"{rule.endpoint.replace('.', '_')}_{method.lower()}",
                "tags": [rule.endpoint.split(".")[0]],
                "parameters": [
                    {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                    for name in rule.arguments
                ],
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {
                            (
                                "text/event-stream"
                                if rule.endpoint in STREAMING
                                else "text/plain"
                                if rule.endpoint in PLAIN_TEXT
                                else "*/*"
                                if rule.endpoint in FILES
                                else "application/json"
                            ): {}
                        },
                    },
                    **OTHER_SUCCESS.get(rule.endpoint, {}),
                    **_error_responses(),
                },
            }
            if rule.endpoint in BODIES:
                model = BODIES[rule.endpoint]
                op["requestBody"] = {
                    "required": model in REQUIRED_BODIES,
                    "content": {"application/json": {"schema": refs[(model, "validation")]}},
                }
            if rule.endpoint in QUERIES:
                schema = QUERIES[rule.endpoint].model_json_schema()
                for name, prop in schema.get("properties", {}).items():
                    op["parameters"].append(
                        {
                            "name": name,
                            "in": "query",
                            "required": name in schema.get("required", []),
                            "schema": prop,
                        }
                    )
            paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "threadrun", "version": VERSION},
        "components": {
            "schemas": components,
            "securitySchemes": {"apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
        },
        "security": [{"apiKey": []}],
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
