"""`http.app`: the project's own app, a Starlette/FastAPI (ASGI) or a Flask (WSGI) one, and
which requests are its own.

A request is the custom app's when one of its routes matches the path and method, as on
the official server (whose user routes come first in one router): Starlette's
`route.matches(scope)` giving `Match.FULL`, Flask's `url_map.bind_to_environ(...).match()`.
A path the custom app has under another method only (`Match.PARTIAL`, Flask's 405) goes to it
too when threadrun has no route for that path, so the app's 405 is what the client sees.
FastAPI's own /openapi.json, /docs, /redoc are not taken: threadrun's /openapi.json stays.
A WebSocket upgrade is a Starlette app's when one of its routes matches it as a `websocket`
scope (`@app.websocket(...)`, a `WebSocketRoute`, a `Mount`); it is served by websocket.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from a2wsgi.asgi import build_scope
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map

from app.project_http.bridge import AsgiBridge, LifespanFailed
from app.project_http.websocket import SocketRules, serve, websocket_scope
from shared.agent.graphs import load_variable
from shared.errors import ConfigError
from shared.project import Project, ProjectConfigError

USER_KEY = "threadrun.user"
"""WSGI environ key of the authenticated caller of a custom route (a `CustomRouteUser`);
`REMOTE_USER` also carries its user id. In the ASGI scope it is `scope["user"]` (and
`request.user` in Starlette/FastAPI), with `scope["auth"]` its credentials."""


@dataclass(frozen=True)
class CustomRouteUser:
    """The caller of a custom route when `enable_custom_route_auth` is on (Starlette's
    `BaseUser` shape: `identity`, `display_name`, `is_authenticated`, plus `permissions`)."""

    identity: str
    role: str
    permissions: tuple[str, ...] = field(default=())

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def display_name(self) -> str:
        return self.identity


class CustomApp(ABC):
    """The project's app as a WSGI callable, with its route matcher and its lifespan."""

    kind = "custom"

    @abstractmethod
    def matches(self, environ: dict[str, Any], builtin: Map) -> bool:
        """Whether this request is the custom app's."""

    @abstractmethod
    def wsgi(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """Serve one request."""

    def matches_websocket(self, environ: dict[str, Any]) -> bool:
        """Whether this WebSocket upgrade is one of the app's WebSocket routes (an ASGI app's
        only: a Flask app's upgrades are plain requests to it)."""
        return False

    def websocket(
        self,
        environ: dict[str, Any],
        start_response: Callable[..., Any],
        options: dict[str, Any],
        rules: SocketRules | None = None,
    ) -> Iterable[bytes]:
        """Serve one WebSocket upgrade `matches_websocket` took (websocket.py's `serve`)."""
        raise NotImplementedError(f"a {self.kind} app serves no WebSocket routes")

    def start(self) -> None:  # noqa: B027 - a hook: an app without a lifespan has nothing to do
        """Startup, once per web process."""

    def close(self) -> None:  # noqa: B027 - a hook, as `start`
        """Shutdown, once per web process."""


def _builtin_has_path(environ: dict[str, Any], builtin: Map) -> bool:
    try:
        builtin.bind_to_environ(environ).match()
    except MethodNotAllowed:
        return True
    except NotFound:
        return False
    except HTTPException:  # a redirect (strict slashes) or a WebSocket-only rule: it is ours
        return True
    return True


class StarletteApp(CustomApp):
    """A Starlette (or FastAPI) app through the ASGI bridge."""

    kind = "asgi"

    def __init__(self, app: Any, where: str = "http.app") -> None:
        from starlette.routing import Match

        self.app = app
        self.where = where
        self._full, self._partial = Match.FULL, Match.PARTIAL
        skipped = {
            getattr(app, name, None)
            for name in ("openapi_url", "docs_url", "redoc_url", "swagger_ui_oauth2_redirect_url")
        } - {None}
        self.routes = [r for r in app.router.routes if getattr(r, "path", None) not in skipped]
        self.bridge = AsgiBridge(self._with_user)
        self.state: dict[str, Any] = {}

    async def _with_user(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            scope["state"] = self.state
        else:
            scope["state"] = dict(self.state)
            environ = scope.get("wsgi_environ") or {}
            user = environ.get(USER_KEY)
            if user is not None:
                from starlette.authentication import AuthCredentials

                scope["user"] = user
                scope["auth"] = AuthCredentials(["authenticated", *user.permissions])
        await self.app(scope, receive, send)

    def matches(self, environ: dict[str, Any], builtin: Map) -> bool:
        scope = build_scope(environ)  # type: ignore[arg-type]
        partial = False
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == self._full:
                return True
            partial = partial or match == self._partial
        return partial and not _builtin_has_path(environ, builtin)

    def wsgi(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        return self.bridge.wsgi(environ, start_response)

    def matches_websocket(self, environ: dict[str, Any]) -> bool:
        scope = websocket_scope(build_scope(environ))  # type: ignore[arg-type]
        return any(route.matches(scope)[0] == self._full for route in self.routes)

    def websocket(
        self,
        environ: dict[str, Any],
        start_response: Callable[..., Any],
        options: dict[str, Any],
        rules: SocketRules | None = None,
    ) -> Iterable[bytes]:
        scope = websocket_scope(build_scope(environ))  # type: ignore[arg-type]
        return serve(
            self.bridge.asgi, self.bridge.loop, scope, environ, start_response, options, rules
        )

    def start(self) -> None:
        try:
            self.bridge.start()
        except LifespanFailed as exc:
            raise LifespanFailed(f"{self.where}: the app's lifespan startup failed: {exc}") from exc

    def close(self) -> None:
        self.bridge.close()


class FlaskApp(CustomApp):
    """A Flask app, called as the WSGI app it is (no lifespan: Flask has none)."""

    kind = "wsgi"

    def __init__(self, app: Any) -> None:
        self.app = app

    def matches(self, environ: dict[str, Any], builtin: Map) -> bool:
        try:
            self.app.url_map.bind_to_environ(environ).match()
        except MethodNotAllowed:
            return not _builtin_has_path(environ, builtin)
        except NotFound:
            return False
        except HTTPException:  # a strict-slashes redirect: the custom app answers it
            return True
        return True

    def wsgi(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        result: Iterable[bytes] = self.app(environ, start_response)
        return result


def classify(app: object, where: str) -> CustomApp:
    """The custom app for a loaded `http.app` variable, or ProjectConfigError."""
    try:
        from starlette.applications import Starlette
    except ImportError:  # pragma: no cover - starlette comes with a2wsgi users' apps
        Starlette = None  # type: ignore[assignment,misc]
    from flask import Flask

    if Starlette is not None and isinstance(app, Starlette):
        return StarletteApp(app, where)
    if isinstance(app, Flask):
        return FlaskApp(app)
    raise ProjectConfigError(
        f"{where}: {type(app).__module__}.{type(app).__qualname__} is neither a Starlette/"
        "FastAPI (ASGI) nor a Flask (WSGI) application: threadrun matches a request against"
        " the app's routes, so it needs one of those two"
    )


def load_custom_app(project: Project) -> CustomApp | None:
    """The project's `http.app`, loaded and checked (None when the key is not set)."""
    spec = project.http.app
    if spec is None:
        return None
    where = f"{project.path}: 'http.app' ({spec!r})"
    try:
        app = load_variable("http.app", spec, project.base)
    except ConfigError as exc:
        raise ProjectConfigError(f"{where}: {exc}") from exc
    return classify(app, where)
