"""Health and server info."""

from __future__ import annotations

from flask import Blueprint, Response

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
    return json_response(
        {
            "version": VERSION,
            "server": "threadrun",
            "flags": {
                "assistants": True,
                "crons": True,
                "langsmith": False,
                "langsmith_tracing_replicas": False,
            },
            "limits": {
                "max_input_bytes": settings.max_input_bytes,
                "ws_max_frame_bytes": settings.ws_max_frame_bytes,
                "max_body_bytes": settings.max_body_bytes,
                "max_metadata_bytes": settings.max_metadata_bytes,
            },
        }
    )
