"""Health and server info."""

from __future__ import annotations

from flask import Blueprint, Response

from app.http import json_response

bp = Blueprint("meta", __name__)
VERSION = "0.1.0"


@bp.get("/ok")
def ok() -> Response:
    """Liveness."""
    return json_response({"ok": True})


@bp.get("/info")
def info() -> Response:
    """What this server is and supports."""
    return json_response(
        {
            "version": VERSION,
            "server": "threadrun",
            "flags": {
                "assistants": True,
                "crons": False,
                "langsmith": False,
                "langsmith_tracing_replicas": False,
            },
        }
    )
