"""Assistants: one per graph of the langgraph.json config; a graph name works as the id."""

from __future__ import annotations

import datetime as dt
from typing import Any

from flask import Blueprint, Response

from app.auth import principal
from app.http import json_response, parse_body
from app.schemas import AssistantSearch
from app.services import current_services
from shared.agent.graphs import assistant_id_for

bp = Blueprint("assistants", __name__)
_EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def assistant_json(graph_id: str) -> dict[str, Any]:
    """The SDK's Assistant shape for a registered graph."""
    return {
        "assistant_id": assistant_id_for(graph_id),
        "graph_id": graph_id,
        "name": graph_id,
        "description": None,
        "config": {},
        "context": {},
        "metadata": {"created_by": "system"},
        "version": 1,
        "created_at": _EPOCH,
        "updated_at": _EPOCH,
    }


def resolve_graph(assistant_id: str) -> str:
    """graph_id for an assistant id or graph name, else 404."""
    return current_services().runs.resolve_graph(assistant_id)


@bp.post("/assistants/search")
def search() -> Response:
    """List assistants."""
    principal()
    q = parse_body(AssistantSearch, allow_empty=True)
    items = [assistant_json(g) for g in current_services().registry.ids()]
    if q.graph_id:
        items = [a for a in items if a["graph_id"] == q.graph_id]
    if q.name:
        items = [a for a in items if q.name.lower() in a["name"].lower()]
    if q.metadata:
        items = [a for a in items if all(a["metadata"].get(k) == v for k, v in q.metadata.items())]
    return json_response(items[q.offset : q.offset + q.limit])


@bp.post("/assistants/count")
def count() -> Response:
    """How many assistants."""
    principal()
    return json_response(len(current_services().registry.ids()))


@bp.get("/assistants/<assistant_id>")
def get(assistant_id: str) -> Response:
    """One assistant."""
    principal()
    return json_response(assistant_json(resolve_graph(assistant_id)))
