"""CORS allow-list (flask-cors) and the WebSocket Origin check, both from settings.

Empty lists mean same-origin only for browsers: no CORS headers are sent, and a
WebSocket upgrade whose `Origin` is not this host is refused. Clients that send no
`Origin` (curl, SDKs, the CLI) are not browsers and are always allowed.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import Flask, request
from flask_cors import CORS
from werkzeug.exceptions import Forbidden

from shared.settings import Settings

ALLOW_HEADERS = ["Content-Type", "Authorization", "x-api-key", "Last-Event-ID"]
EXPOSE_HEADERS = ["Location", "Content-Location", "Retry-After"]


def origins(raw: str) -> list[str]:
    """The comma-separated allow-list, without trailing slashes."""
    return [o.strip().rstrip("/") for o in raw.split(",") if o.strip()]


def init_app(app: Flask, settings: Settings) -> None:
    """Send CORS headers (and answer preflights) for the allowed origins only."""
    allowed = origins(settings.cors_origins)
    if allowed:
        CORS(
            app,
            origins="*" if allowed == ["*"] else allowed,
            allow_headers=ALLOW_HEADERS,
            expose_headers=EXPOSE_HEADERS,
            methods=["GET", "POST", "PATCH", "DELETE", "OPTIONS"],
            supports_credentials=False,
            max_age=600,
        )


def same_origin(origin: str, host: str) -> bool:
    """Whether a browser Origin names this server's host (any scheme)."""
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def check_ws_origin(settings: Settings) -> None:
    """403 for a WebSocket upgrade from a browser origin not on `ws_origins`."""
    origin = request.headers.get("Origin")
    if origin is None:
        return
    allowed = origins(settings.ws_origins)
    if "*" in allowed or origin.rstrip("/") in allowed or same_origin(origin, request.host):
        return
    raise Forbidden(f"WebSocket origin {origin[:100]!r} is not allowed")
