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
- **CORS**: empty lists mean same-origin only: no CORS headers are sent. The project file's
  `http.cors` (langgraph.json), when set, wins over `THREADRUN_CORS_ORIGINS` entirely: its
  origins, `allow_origin_regex`, methods, headers, credentials, exposed headers and max age
  are Starlette's CORSMiddleware's, as on the official server (Starlette's safelisted
  request headers are always allowed), and its origins (regex included) are also the ones
  the Origin check above lets change things. The WebSocket list stays THREADRUN_WS_ORIGINS.

JSON endpoints also refuse a body that is not declared JSON with 415 (`app/http.py`), so a
cross-site "simple" request (text/plain, no preflight) can never be parsed as one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from flask import Flask, current_app, request
from flask_cors import CORS
from werkzeug.exceptions import BadRequest, Forbidden

from shared.project import CorsSection, load_project
from shared.settings import Settings

ALLOW_HEADERS = ["Content-Type", "Authorization", "x-api-key", "Last-Event-ID"]
EXPOSE_HEADERS = ["Location", "Content-Location", "Retry-After"]


def origins(raw: str) -> list[str]:
    """The comma-separated allow-list, without trailing slashes."""
    return [o.strip().rstrip("/") for o in raw.split(",") if o.strip()]


UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
SAFELISTED_HEADERS = ["Accept", "Accept-Language", "Content-Language", "Content-Type"]
"""Starlette's CORSMiddleware allows these whatever `allow_headers` says."""


@dataclass(frozen=True)
class CorsPolicy:
    """Which browser origins may call this server, and the CORS headers they get."""

    origins: list[str]
    source: str  # what to edit to change it, for the 403's message
    origin_regex: re.Pattern[str] | None = None
    methods: list[str] = field(default_factory=lambda: ["GET", "POST", "PATCH", "DELETE"])
    headers: list[str] = field(default_factory=lambda: list(ALLOW_HEADERS))
    expose: list[str] = field(default_factory=lambda: list(EXPOSE_HEADERS))
    credentials: bool = False
    max_age: int = 600

    @classmethod
    def build(cls, settings: Settings, project_cors: CorsSection | None) -> CorsPolicy:
        """From the project's `http.cors` when set, else from THREADRUN_CORS_ORIGINS."""
        if project_cors is None:
            return cls(origins(settings.cors_origins), "THREADRUN_CORS_ORIGINS")
        c = project_cors
        rx = re.compile(rf"(?:{c.allow_origin_regex})\Z") if c.allow_origin_regex else None
        headers = (
            c.allow_headers if "*" in c.allow_headers else SAFELISTED_HEADERS + c.allow_headers
        )
        return cls(
            [o.rstrip("/") for o in c.allow_origins],
            f"http.cors of {settings.config}",
            origin_regex=rx,
            methods=list(c.allow_methods),
            headers=headers,
            expose=list(c.expose_headers),
            credentials=c.allow_credentials,
            max_age=c.max_age,
        )

    def lists(self, origin: str) -> bool:
        """Whether `origin` is allowed by the list or the regex."""
        if "*" in self.origins or origin.rstrip("/") in self.origins:
            return True
        return self.origin_regex is not None and self.origin_regex.match(origin) is not None

    def response_headers(self, origin: str) -> list[tuple[str, str]]:
        """The CORS headers of an actual (not preflight) response to an allowed `origin`."""
        echo = self.credentials or self.origins != ["*"]
        headers = [("Access-Control-Allow-Origin", origin if echo else "*")]
        if echo:
            headers.append(("Vary", "Origin"))
        if self.credentials:
            headers.append(("Access-Control-Allow-Credentials", "true"))
        if self.expose:
            headers.append(("Access-Control-Expose-Headers", ", ".join(self.expose)))
        return headers

    def preflight_headers(
        self, origin: str, method: str, asked: str
    ) -> list[tuple[str, str]] | None:
        """The answer headers of a preflight, or None when it is refused (Starlette's rule:
        the origin, the method and every requested header must be allowed)."""
        methods = {m.upper() for m in self.methods}
        allowed = {h.lower() for h in self.headers}
        wanted = [h.strip().lower() for h in asked.split(",") if h.strip()]
        if not self.lists(origin) or ("*" not in methods and method.upper() not in methods):
            return None
        if "*" not in allowed and any(h not in allowed for h in wanted):
            return None
        headers = self.response_headers(origin)
        headers.append(("Access-Control-Allow-Methods", ", ".join(sorted(methods))))
        headers.append(("Access-Control-Allow-Headers", ", ".join(wanted or sorted(allowed))))
        headers.append(("Access-Control-Max-Age", str(self.max_age)))
        return headers

    def flask_cors_origins(self) -> str | list[str | re.Pattern[str]]:
        """The `origins` argument of flask-cors."""
        if self.origins == ["*"]:
            return "*"
        found: list[str | re.Pattern[str]] = list(self.origins)
        if self.origin_regex is not None:
            found.append(self.origin_regex)
        return found


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


def guard_browser_requests(settings: Settings, policy: CorsPolicy | None = None) -> None:
    """Before every request: 400 for a Host that is not allowed; 403 for a state-changing
    request from a browser origin that is not allowed."""
    policy = policy or CorsPolicy.build(settings, None)
    open_mode = _open_mode()
    if not host_allowed(settings, request.host, open_mode):
        raise BadRequest(
            f"Host {request.host[:100]!r} is not allowed: list it in THREADRUN_ALLOWED_HOSTS"
        )
    origin = request.headers.get("Origin")
    if origin is None or request.method not in UNSAFE_METHODS:
        return
    if policy.lists(origin) or _origin_allowed(origin, [], open_mode, settings):
        return
    raise Forbidden(
        f"origin {origin[:100]!r} may not change anything here: list it in {policy.source}"
    )


def init_app(app: Flask, settings: Settings) -> None:
    """Guard every request (Host, Origin); send CORS headers (and answer preflights) for the
    allowed origins only."""
    policy = CorsPolicy.build(settings, load_project(settings.config).http.cors)
    app.extensions["threadrun_cors"] = policy  # the custom app's routes (app/project_http/)
    app.before_request(lambda: guard_browser_requests(settings, policy))
    if policy.origins or policy.origin_regex is not None:
        CORS(
            app,
            origins=policy.flask_cors_origins(),
            allow_headers=policy.headers,
            expose_headers=policy.expose,
            methods=[*policy.methods, "OPTIONS"],
            supports_credentials=policy.credentials,
            max_age=policy.max_age,
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
