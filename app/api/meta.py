"""Health and server info."""

from __future__ import annotations

from flask import Blueprint, Response, current_app

from app.responses import json_response
from app.services import current_services

bp = Blueprint("meta", __name__)
VERSION = "0.1.0"


@bp.get("/ok")
def ok() -> Response:
    """Liveness."""
    return json_response({"ok": True})


@bp.get("/info")
def info() -> Response:
    """What this server is and supports, and the size limits a client can check before
    sending (the chat page refuses an over-size message naming the limit instead of
    letting the server close its socket)."""
    settings = current_services().settings
    protocols = _protocols()
    return json_response(
        {
            "version": VERSION,
            "server": "threadrun",
            "flags": {
                "assistants": True,
                "crons": True,
                "langsmith": False,
                "langsmith_tracing_replicas": False,
                **{name: p["enabled"] for name, p in protocols.items()},
            },
            "protocols": protocols,
            "limits": {
                "max_input_bytes": settings.max_input_bytes,
                "ws_max_frame_bytes": settings.ws_max_frame_bytes,
                "max_body_bytes": settings.max_body_bytes,
                "max_metadata_bytes": settings.max_metadata_bytes,
            },
        }
    )


PROTOCOLS = {
    "thread_stream": (
        "/threads/<thread_id>/commands",
        {
            "commands": "/threads/{thread_id}/commands",
            "events": "/threads/{thread_id}/stream/events",
            "docs": "docs/thread-stream.md",
        },
    ),
    "mcp": ("/mcp", {"path": "/mcp", "transport": "streamable-http", "docs": "docs/mcp.md"}),
    "a2a": (
        "/a2a/<assistant_id>",
        {
            "path": "/a2a/{assistant_id}",
            "card": "/.well-known/agent-card.json",
            "docs": "docs/a2a.md",
        },
    ),
    "generative_ui": ("/ui/<graph_id>", {"path": "/ui/{graph_id}", "docs": "docs/genui.md"}),
}
"""Each protocol app/protocols/ (and app/api/genui.py) serves: the url rule that says it is
on (`http.disable_mcp|a2a|ui` remove theirs), and where a client finds it."""


def _protocols() -> dict[str, dict[str, object]]:
    """The protocols served besides the REST API, and whether each is on here."""
    rules = {rule.rule for rule in current_app.url_map.iter_rules()}
    return {name: {"enabled": rule in rules, **where} for name, (rule, where) in PROTOCOLS.items()}
