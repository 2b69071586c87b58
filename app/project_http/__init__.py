"""The `http` section of langgraph.json: the project's own app beside the API, the routes
turned off, a mount prefix, custom-route authentication (CORS: app/cors.py; the access log's
headers: app/access_log.py).

`init_app` puts `ProjectHttp` in front of Flask's `wsgi_app` (the WSGI middleware Flask's
docs recommend), so for every request, in order:

1. **mount_prefix** (e.g. "/api"): a path under the prefix moves the prefix from PATH_INFO
   to SCRIPT_NAME, so every route (API, WebSocket, chat page, custom app) answers under it
   and `request.script_root` / a Starlette `root_path` name it; a relative `Location` or
   `Content-Location` threadrun sends gets the prefix. Any other path is 404, except `/ok`,
   which also answers at the root for probes and load balancers that do not know the prefix.
2. **app**: a request one of the custom app's routes matches (custom.py) goes to it; the
   rest to threadrun. Custom routes win, as on the official server.
3. **enable_custom_route_auth**: before a custom route, `app.auth.principal()` (the API's
   credentials, 401 JSON without). The caller is `environ["threadrun.user"]` and
   `REMOTE_USER` for a Flask app, `scope["user"]` (`request.user.identity`) and
   `scope["auth"]` for a Starlette/FastAPI one. Off (the default), custom routes are public.

**The custom app's middleware wraps its own routes only**, not threadrun's (on the official
server it wraps everything). Wrapping threadrun's routes would send every built-in request
through the ASGI bridge and back to WSGI: each SSE stream and /wait would then hold a request
of the loop thread plus a bridged body, and the WebSockets (flask-sock takes the raw socket
from the gevent worker) cannot cross an ASGI bridge at all. Hence also **middleware_order**:
both values are accepted; on a custom route threadrun's authentication always runs before
the app's middleware (`auth_first`), and on built-in routes there is no custom middleware
to order. The app's own CORS middleware, likewise, answers for its routes only; threadrun's
CORS policy (`http.cors`, else THREADRUN_CORS_ORIGINS) covers the custom routes too, as the
official server's CORS middleware covers every route: their preflights are answered here
(never authenticated) and an allowed Origin's responses get the CORS headers, unless the
app sent its own.

**Lifespan**: a Starlette/FastAPI app's lifespan startup runs once per web process when the
app is built (a failed startup stops the process), its shutdown in gunicorn's `worker_exit`.
Flask has no lifespan: its module-level code runs once per process when it is imported.

**WebSocket routes** of a Starlette/FastAPI app are served (websocket.py): the upgrade's
socket is taken on the gevent side as flask-sock takes threadrun's own, and the app is driven
with the ASGI websocket protocol on the bridge's loop thread. Under enable_custom_route_auth
the upgrade is checked as threadrun's own sockets are (app/streaming/upgrade.py: the Origin
against THREADRUN_WS_ORIGINS, the credential in a header or `?api_key=`, 401/403 JSON
before the socket exists) and the socket holds one of the caller's connection slots
(`max_connections_per_user`, 429 over it) while it is open; while open its credential is
re-checked once per key-cache TTL (4401 when revoked) and the client's frames are paced to
`ws_frames_per_second` (CallerSocketRules). Without it the route is public and, as the
custom HTTP routes, counts in no one's slots and follows none of those rules (there is no
caller; the app's socket is its own, as on the official server).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask, g
from werkzeug.exceptions import HTTPException

from app.auth import principal
from app.cors import CorsPolicy
from app.errors import SERVICE_ERRORS, reply_for
from app.limits import ConnectionSlot, TokenBucket
from app.project_http.custom import USER_KEY, CustomApp, CustomRouteUser, load_custom_app
from app.project_http.routes import disabled_groups, remove_disabled
from app.project_http.websocket import is_upgrade
from app.responses import error_body, json_response
from app.services import Services, current_services
from app.streaming.upgrade import CLOSE_UNAUTHORIZED, authenticate_upgrade, credential_still_valid
from shared.project import HttpSection, Project

log = logging.getLogger(__name__)


def _preflight_for(environ: dict[str, Any]) -> str | None:
    """The method a CORS preflight asks about (None: not a preflight)."""
    if environ.get("REQUEST_METHOD") != "OPTIONS" or "HTTP_ORIGIN" not in environ:
        return None
    asked = environ.get("HTTP_ACCESS_CONTROL_REQUEST_METHOD")
    return str(asked) if asked else None


EXTENSION = "threadrun_project_http"
RELOCATED = ("location", "content-location")
ROOT_PATHS = frozenset({"/ok"})
"""Paths also answered outside the mount prefix."""

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class ProjectHttp:
    """The WSGI middleware of the `http` section (see the module docstring)."""

    def __init__(
        self, flask_app: Flask, inner: WSGIApp, http: HttpSection, custom: CustomApp | None
    ) -> None:
        self.flask = flask_app
        self.inner = inner
        self.prefix = http.mount_prefix or ""
        self.custom = custom
        self.custom_auth = http.enable_custom_route_auth
        policy: CorsPolicy | None = flask_app.extensions.get("threadrun_cors")
        self.cors = policy if policy and (policy.origins or policy.origin_regex) else None

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        if self.prefix:
            path: str = environ.get("PATH_INFO", "")
            if path == self.prefix or path.startswith(self.prefix + "/"):
                environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "") + self.prefix
                environ["PATH_INFO"] = path[len(self.prefix) :] or "/"
            elif path not in ROOT_PATHS:
                return self._outside(environ, start_response)
        if self.custom is not None:
            if is_upgrade(environ) and self.custom.matches_websocket(environ):
                return self._custom_websocket(self.custom, environ, start_response)
            asked = _preflight_for(environ)
            target = {**environ, "REQUEST_METHOD": asked} if asked else environ
            if self.custom.matches(target, self.flask.url_map):
                if asked and self.cors is not None:
                    return self._preflight(self.cors, environ, asked, start_response)
                return self._custom(self.custom, environ, start_response)
        if self.prefix:
            start_response = self._relocating(start_response, environ.get("SCRIPT_NAME", ""))
        return self.inner(environ, start_response)

    def _relocating(self, start_response: Callable[..., Any], root: str) -> Callable[..., Any]:
        """start_response with relative Location headers moved under the prefix."""
        if not root:
            return start_response

        def relocate(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            fixed = [
                (name, root + value)
                if name.lower() in RELOCATED
                and value.startswith("/")
                and not value.startswith(root + "/")
                else (name, value)
                for name, value in headers
            ]
            return start_response(status, fixed, *exc)

        return relocate

    def _outside(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        with self.flask.request_context(environ):
            body = error_body("not_found", f"this server answers under {self.prefix}/ only")
            resp = json_response(body, 404)
        return resp(environ, start_response)

    def _preflight(
        self,
        policy: CorsPolicy,
        environ: dict[str, Any],
        method: str,
        start_response: Callable[..., Any],
    ) -> Iterable[bytes]:
        """A custom route's CORS preflight, answered as Starlette's CORSMiddleware would."""
        asked = environ.get("HTTP_ACCESS_CONTROL_REQUEST_HEADERS", "")
        headers = policy.preflight_headers(environ["HTTP_ORIGIN"], method, asked)
        if headers is None:
            start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"Disallowed CORS origin, method or headers"]
        start_response(
            "200 OK", [*headers, ("Content-Type", "text/plain"), ("Content-Length", "2")]
        )
        return [b"OK"]

    def _with_cors(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Callable[..., Any]:
        """start_response adding the CORS headers for an allowed Origin (unless the custom
        app sent its own)."""
        origin = environ.get("HTTP_ORIGIN")
        policy = self.cors
        if not origin or policy is None or not policy.lists(origin):
            return start_response

        def add(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            if not any(n.lower() == "access-control-allow-origin" for n, _ in headers):
                headers = [*headers, *policy.response_headers(origin)]
            return start_response(status, headers, *exc)

        return add

    def _custom(
        self, custom: CustomApp, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        start_response = self._with_cors(environ, start_response)
        if self.custom_auth:
            with self.flask.request_context(environ):
                try:
                    who = principal()
                except HTTPException as exc:
                    reply = reply_for(exc)
                    refused = json_response(reply.body, reply.status, headers=reply.headers)
                    return refused(environ, start_response)
            environ[USER_KEY] = CustomRouteUser(who.user_id, who.role, (who.role,))
            environ["REMOTE_USER"] = who.user_id
        return custom.wsgi(environ, start_response)

    def _custom_websocket(
        self, custom: CustomApp, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        """A WebSocket route of the custom app, behind threadrun's upgrade checks when
        custom-route auth is on (the module docstring)."""
        slot: ConnectionSlot | None = None
        rules: CallerSocketRules | None = None
        if self.custom_auth:
            with self.flask.request_context(environ):
                try:
                    authenticate_upgrade()  # Origin, credential, connection slot
                except Exception as exc:  # noqa: BLE001 - every refusal is the API's JSON reply
                    reply = reply_for(exc)
                    refused = json_response(reply.body, reply.status, headers=reply.headers)
                    return refused(environ, start_response)
                who = g.principal
                slot = g.pop("ws_conn", None)
                rules = CallerSocketRules(
                    self.flask, environ, slot, who.subject, current_services()
                )
            environ[USER_KEY] = CustomRouteUser(who.user_id, who.role, (who.role,))
            environ["REMOTE_USER"] = who.user_id
        options = dict(self.flask.config.get("SOCK_SERVER_OPTIONS") or {})
        try:
            return custom.websocket(environ, start_response, options, rules)
        finally:
            if slot is not None:
                slot.release()


class CallerSocketRules:
    """threadrun's socket rules on a custom WebSocket under custom-route auth, as on its own
    sockets (app/streaming/ws.py), in the app's protocol's terms:

    - the connection slot is renewed when due, beside the socket (a slow Redis must not
      hold up the frames);
    - the credential is re-checked once per `api_key_cache_ttl_s`: a revoked key, an expired
      token or local mode ended closes the socket with 4401 (the app hears
      `websocket.disconnect` 4401); a key store that cannot be reached keeps the socket until
      the next check;
    - the client's frames are paced to `ws_frames_per_second` (burst `ws_frame_burst`). The
      app's protocol has no threadrun error frame, so nothing is dropped: over the rate the
      socket is read more slowly and the client's sends wait in TCP.
    """

    def __init__(
        self,
        flask_app: Flask,
        environ: dict[str, Any],
        slot: ConnectionSlot | None,
        subject: str,
        svc: Services,
    ) -> None:
        settings = svc.settings
        self._flask = flask_app
        self._environ = environ
        self._slot = slot
        self._subject = subject
        self._ttl = settings.api_key_cache_ttl_s
        self._checked_at = time.monotonic()
        self._frames = TokenBucket(settings.ws_frames_per_second, settings.ws_frame_burst)

    def tick(self) -> tuple[int, str] | None:
        """About once per POLL_S while the socket is open: the close code and reason when the
        socket must end, else None."""
        slot = self._slot
        if slot is not None and slot.due():
            slot.renewed_at = time.monotonic()
            threading.Thread(target=slot.renew, name="ws-slot-renew", daemon=True).start()
        now = time.monotonic()
        if now - self._checked_at < self._ttl:
            return None
        self._checked_at = now
        with self._flask.request_context(self._environ):
            try:
                valid = credential_still_valid(self._subject)
            except SERVICE_ERRORS:
                log.warning("custom websocket credential re-check failed: a service is unreachable")
                return None
        if valid:
            return None
        log.info(
            "custom websocket credential no longer valid; closing", extra={"user_id": self._subject}
        )
        return CLOSE_UNAUTHORIZED, "credential no longer valid"

    def pace(self) -> None:
        """Before each client frame is read: wait for the frame rate's next token."""
        while not self._frames.take():
            time.sleep(self._frames.wait_s())


def init_app(app: Flask, project: Project) -> None:
    """Honour `project.http` on `app` (after every blueprint is registered)."""
    http = project.http
    removed = remove_disabled(app, disabled_groups(http))
    if removed:
        log.info("http: %d built-in route(s) disabled by %s", len(removed), project.path.name)
    custom = load_custom_app(project)
    if custom is not None:
        custom.start()  # the lifespan startup: a failure stops this web process
        log.info("http.app: %s (%s) mounted beside the API", http.app, custom.kind)
    app.extensions[EXTENSION] = custom
    if custom is not None or http.mount_prefix:
        app.wsgi_app = ProjectHttp(app, app.wsgi_app, http, custom)  # type: ignore[method-assign]


def close(app: object) -> None:
    """The custom app's lifespan shutdown (gunicorn's worker_exit)."""
    extensions = getattr(app, "extensions", None)
    custom = extensions.get(EXTENSION) if isinstance(extensions, dict) else None
    if isinstance(custom, CustomApp):
        custom.close()
