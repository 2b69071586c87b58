"""What a browser may do here: the Host allow-list, CORS (flask-cors), the Origin check of
state-changing requests and WebSocket upgrades, all from settings.

- **Host**: `THREADRUN_ALLOWED_HOSTS` lists the names this server answers to. Empty means
  loopback names only while the server is in local single-user mode (no credentials, so a
  DNS-rebinding page that resolves its own name to 127.0.0.1 would otherwise act as the
  local user) and any name once credentials are configured (a rebinding page has none).
- **Origin**: a browser request that changes something (POST, PUT, PATCH, DELETE) or opens
  a WebSocket from an origin that is neither this server (an allowed host) nor on
  `THREADRUN_CORS_ORIGINS` / `THREADRUN_WS_ORIGINS` is refused with 403. Clients that send
  no `Origin` (curl, SDKs, the CLI) are not browsers and are always allowed.
- **CORS**: empty lists mean same-origin only: no CORS headers are sent.

JSON endpoints also refuse a body that is not declared JSON with 415 (`app/http.py`), so a
cross-site "simple" request (text/plain, no preflight) can never be parsed as one.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import Flask, current_app, request
from flask_cors import CORS
from werkzeug.exceptions import BadRequest, Forbidden

from shared.settings import Settings

ALLOW_HEADERS = ["Content-Type", "Authorization", "x-api-key", "Last-Event-ID"]
EXPOSE_HEADERS = ["Location", "Content-Location", "Retry-After"]


def origins(raw: str) -> list[str]:
    """The comma-separated allow-list, without trailing slashes."""
    return [o.strip().rstrip("/") for o in raw.split(",") if o.strip()]


UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def hostname(netloc: str) -> str:
    """The host name of a `host[:port]` (brackets of an IPv6 literal removed), lowercased."""
    return (urlsplit(f"//{netloc}").hostname or "").lower()


def host_allowed(settings: Settings, host: str, open_mode: bool) -> bool:
    """Whether a request for `host` (a Host header or an Origin's netloc) may be served."""
    from app.auth import is_loopback

    name = hostname(host)
    listed = [h.lower() for h in origins(settings.allowed_hosts)]
    if listed:
        return "*" in listed or name in listed
    return not open_mode or is_loopback(name)


def _open_mode() -> bool:
    from app.auth import Authenticator

    auth: Authenticator = current_app.extensions["threadrun_auth"]
    return auth.open_mode()


def _origin_allowed(origin: str, allowed: list[str], open_mode: bool, settings: Settings) -> bool:
    """A browser origin: on the list, or this server under an allowed host name."""
    if "*" in allowed or origin.rstrip("/") in allowed:
        return True
    return same_origin(origin, request.host) and host_allowed(
        settings, urlsplit(origin).netloc, open_mode
    )


def guard_browser_requests(settings: Settings) -> None:
    """Before every request: 400 for a Host that is not allowed; 403 for a state-changing
    request from a browser origin that is not allowed."""
    open_mode = _open_mode()
    if not host_allowed(settings, request.host, open_mode):
        raise BadRequest(
            f"Host {request.host[:100]!r} is not allowed: list it in THREADRUN_ALLOWED_HOSTS"
        )
    origin = request.headers.get("Origin")
    if origin is None or request.method not in UNSAFE_METHODS:
        return
    if not _origin_allowed(origin, origins(settings.cors_origins), open_mode, settings):
        raise Forbidden(
            f"origin {origin[:100]!r} may not change anything here: list it in"
            " THREADRUN_CORS_ORIGINS"
        )


def init_app(app: Flask, settings: Settings) -> None:
    """Guard every request (Host, Origin); send CORS headers (and answer preflights) for the
    allowed origins only."""
    app.before_request(lambda: guard_browser_requests(settings))
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
    if _origin_allowed(origin, origins(settings.ws_origins), _open_mode(), settings):
        return
    raise Forbidden(f"WebSocket origin {origin[:100]!r} is not allowed")
