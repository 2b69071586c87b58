"""The decisions: who is calling (`authenticate`) and what they may do (`authorize`).

Semantics of the LangGraph Agent Server's custom auth, which the project's `auth.py` was
written against:

- `@auth.authenticate` gets the request parts it names as parameters (`request`, `headers`
  as `dict[bytes, bytes]` with lower-case names, `authorization`, `path`, `method`,
  `query_params`, `path_params`, `scope`, `scopes`, `user`). A name it asks for that does
  not exist is a start-up error. `Auth.exceptions.HTTPException` answers with its status,
  detail and headers; an `AssertionError` is a 403; any other exception a 401 (the caller
  is not authenticated, never let through).
- For an action, the most specific handler runs: `(resource, action)`, `(resource, *)`,
  `(*, action)`, then the global one. None or True allows, False is 403, a dict is a filter
  (shared/authz/filters.py) on the resource's metadata. A handler may edit `value` (stamp
  `metadata.owner`, rewrite a store namespace); the caller uses the edited value. A
  handler that raises anything else, or returns anything else, refuses (403): fail closed.
- `auth.cache` reuses an authenticate answer for the same values of `cache_keys` headers
  for `ttl_seconds`, at most `max_size` entries (per process).

The handlers are coroutines. The async callers (workers) await them; the web's gevent
request greenlets call `run_sync`, which drives each on a short-lived event loop of its own
(asyncio's selector is gevent-patched there, so a handler's awaited I/O yields to other
requests instead of blocking the process).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from cachetools import TTLCache
from langgraph_sdk import Auth

from shared.authz.filters import InvalidFilter, containment
from shared.authz.users import AuthUser, InvalidUser, normalize_user
from shared.errors import ConfigError, ThreadrunError
from shared.project import AuthCacheSection
from shared.vocab import JSONObject

log = logging.getLogger(__name__)
T = TypeVar("T")

AUTHENTICATE_PARAMS = frozenset(
    {
        "request",
        "headers",
        "authorization",
        "path",
        "method",
        "query_params",
        "path_params",
        "scope",
        "scopes",
        "user",
    }
)
"""What `@auth.authenticate` may ask for (the official server's names)."""

RESOURCES = ("threads", "assistants", "crons", "store", "runs")


class AuthzConfigError(ConfigError):
    """The project's Auth object cannot be served as written (raised at start-up)."""


class Denied(ThreadrunError):
    """The caller may not: the status (401, 403, or a handler's own), detail and headers."""

    def __init__(self, status: int, detail: str, headers: Mapping[str, str] | None = None):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = dict(headers or {})

    def __str__(self) -> str:
        return f"{self.status}: {self.detail}"


@dataclass(frozen=True, slots=True)
class RequestParts:
    """A request as `@auth.authenticate` sees it (HTTP or a WebSocket upgrade)."""

    method: str
    path: str
    headers: Sequence[tuple[str, str]]
    query_string: bytes = b""
    path_params: Mapping[str, Any] = field(default_factory=dict)
    scheme: str = "http"
    server: tuple[str, int] | None = None
    client: tuple[str, int] | None = None
    websocket: bool = False

    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers]

    def scope(self) -> dict[str, Any]:
        """An ASGI-style scope of the request (what the official server's handlers get)."""
        return {
            "type": "websocket" if self.websocket else "http",
            "method": self.method,
            "path": self.path,
            "raw_path": self.path.encode(),
            "root_path": "",
            "scheme": self.scheme,
            "query_string": self.query_string,
            "headers": self.raw_headers(),
            "path_params": dict(self.path_params),
            "server": self.server,
            "client": self.client,
        }


@dataclass(frozen=True, slots=True)
class Decision:
    """An allowed action: the filter (a containment document on metadata) it is under,
    None when unfiltered, and the value as the handler left it."""

    containment: JSONObject | None
    value: JSONObject


class Authorizer:
    """The project's Auth object, served: authenticate, then authorize per action."""

    def __init__(self, auth: Auth, cache: AuthCacheSection | None = None) -> None:
        self.auth = auth
        self._authenticate = auth._authenticate_handler
        self._params = _authenticate_params(self._authenticate)
        self._handlers: dict[tuple[str, str], Any] = {}
        self._cache_keys = tuple(k.lower() for k in cache.cache_keys) if cache else ()
        self._cache: TTLCache[tuple[str, ...], AuthUser] | None = (
            TTLCache(maxsize=cache.max_size, ttl=cache.ttl_seconds) if cache else None
        )
        self._cache_lock = threading.Lock()

    @property
    def authenticates(self) -> bool:
        """Whether the project has an `@auth.authenticate` (else threadrun's own credentials
        say who is calling and only the handlers are the project's)."""
        return self._authenticate is not None

    # --- who -------------------------------------------------------------------------

    async def authenticate(self, parts: RequestParts) -> AuthUser:
        """The caller, or `Denied` (401 unless the handler said otherwise)."""
        assert self._authenticate is not None
        key = self._cache_key(parts)
        if key is not None:
            with self._cache_lock:
                hit = self._cache.get(key) if self._cache is not None else None
            if hit is not None:
                return hit
        try:
            returned = await self._authenticate(**self._arguments(parts))
            user = normalize_user(returned)
        except Auth.exceptions.HTTPException as exc:
            raise Denied(exc.status_code, str(exc.detail), dict(exc.headers or {})) from None
        except AssertionError as exc:
            raise Denied(403, str(exc) or "Forbidden") from None
        except InvalidUser as exc:
            log.error("@auth.authenticate returned no usable user: %s", exc)
            raise Denied(401, "authentication failed") from None
        except Exception:
            log.exception("@auth.authenticate raised; the request is refused")
            raise Denied(401, "authentication failed") from None
        if key is not None and self._cache is not None:
            with self._cache_lock:
                self._cache[key] = user
        return user

    def _cache_key(self, parts: RequestParts) -> tuple[str, ...] | None:
        if self._cache is None or not self._cache_keys:
            return None
        found = {k.lower(): v for k, v in parts.headers}
        values = tuple(found.get(k, "") for k in self._cache_keys)
        return values if any(values) else None

    def _arguments(self, parts: RequestParts) -> dict[str, Any]:
        args: dict[str, Any] = {}
        names = self._params
        headers = dict(parts.raw_headers())
        if "headers" in names:
            args["headers"] = headers
        if "authorization" in names:
            raw = headers.get(b"authorization")
            args["authorization"] = raw.decode("latin-1") if raw is not None else None
        if "path" in names:
            args["path"] = parts.path
        if "method" in names:
            args["method"] = "WEBSOCKET" if parts.websocket else parts.method
        if "path_params" in names:
            args["path_params"] = dict(parts.path_params)
        if "scopes" in names:
            args["scopes"] = []
        if "user" in names:
            args["user"] = None
        if "scope" in names:
            args["scope"] = parts.scope()
        if "query_params" in names or "request" in names:
            from starlette.datastructures import QueryParams  # the official server's type
            from starlette.requests import Request

            if "query_params" in names:
                args["query_params"] = QueryParams(parts.query_string)
            if "request" in names:
                if parts.websocket:
                    raise Denied(
                        403,
                        "@auth.authenticate asks for `request`, which a WebSocket connection"
                        " has not; use `headers`, `authorization` or `scope`",
                    )
                args["request"] = Request(parts.scope())
        return args

    # --- what ------------------------------------------------------------------------

    def handler_for(self, resource: str, action: str) -> Any:
        """The most specific handler for (resource, action), or None."""
        key = (resource, action)
        if key in self._handlers:
            return self._handlers[key]
        found = None
        for candidate in ((resource, action), (resource, "*"), ("*", action), ("*", "*")):
            handlers = self.auth._handlers.get(candidate)
            if handlers:
                found = handlers[-1]
                break
        if found is None and self.auth._global_handlers:
            found = self.auth._global_handlers[-1]
        self._handlers[key] = found
        return found

    async def authorize(
        self, user: AuthUser, resource: str, action: str, value: JSONObject
    ) -> Decision:
        """May `user` do `action` on `resource` with `value`? The decision, or `Denied`."""
        handler = self.handler_for(resource, action)
        if handler is None:
            return Decision(None, value)
        ctx = Auth.types.AuthContext(
            permissions=user.permissions,
            user=user,  # AuthUser has BaseUser's surface
            resource=resource,  # type: ignore[arg-type]
            action=action,  # type: ignore[arg-type]
        )
        try:
            result = await handler(ctx=ctx, value=value)
        except Auth.exceptions.HTTPException as exc:
            raise Denied(exc.status_code, str(exc.detail), dict(exc.headers or {})) from None
        except AssertionError as exc:
            raise Denied(403, str(exc) or "Forbidden") from None
        except Exception:
            log.exception(
                "auth handler for %s.%s raised; refused",
                resource,
                action,
                extra={"resource": resource, "action": action},
            )
            raise Denied(403, f"the authorization handler for {resource}.{action} failed") from None
        if result is None or result is True:
            return Decision(None, value)
        if result is False:
            raise Denied(403, "Forbidden")
        if not isinstance(result, dict):
            log.error(
                "auth handler for %s.%s returned a %s, not a filter, None or a bool",
                resource,
                action,
                type(result).__name__,
            )
            raise Denied(403, f"the authorization handler for {resource}.{action} failed")
        try:
            return Decision(containment(result) or None, value)
        except InvalidFilter as exc:
            log.error("auth handler for %s.%s: %s", resource, action, exc)
            raise Denied(403, f"the authorization handler for {resource}.{action} failed") from None


def _authenticate_params(fn: Callable[..., Awaitable[Any]] | None) -> frozenset[str]:
    if fn is None:
        return frozenset()
    if not inspect.iscoroutinefunction(fn):
        raise AuthzConfigError(f"@auth.authenticate {fn.__name__} must be an async function")
    names = set()
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        if name not in AUTHENTICATE_PARAMS:
            raise AuthzConfigError(
                f"@auth.authenticate {fn.__name__} asks for {name!r}; it may ask for"
                f" {', '.join(sorted(AUTHENTICATE_PARAMS))}"
            )
        names.add(name)
    return frozenset(names)


def run_sync(awaitable: Awaitable[T]) -> T:
    """Drive a handler's coroutine from synchronous code.

    In a gevent web process the coroutine runs on gevent's pool of native threads, each
    with an event loop of its own, and only the calling greenlet waits. Not on a loop in
    the request greenlet: asyncio keeps "the running loop" per OS thread, so two requests
    whose handlers await real I/O at the same time would find each other's loop running.
    Elsewhere (tests, benchmarks, the CLI) it runs on this thread's own loop.
    """
    if _gevent_patched():
        from gevent import get_hub

        return cast("T", get_hub().threadpool.apply(_on_own_loop, (awaitable,)))
    return _on_own_loop(awaitable)


def _gevent_patched() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("threading"))


def _native_local() -> Any:
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        return monkey.get_original("threading", "local")()
    return threading.local()


_loops: Any = None


def _on_own_loop(awaitable: Awaitable[T]) -> T:
    global _loops
    if _loops is None:
        _loops = _native_local()
    loop = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = _loops.loop = asyncio.new_event_loop()
    return loop.run_until_complete(awaitable)
