"""API key / bearer token -> Principal (A4).

Credentials, in order: a bearer JWT (when a JWT secret or public key is configured), a key
from THREADRUN_API_KEYS, a key created with `threadrun keys create` (hashed in Postgres,
looked up through a cache of `api_key_cache_ttl_s`, so a revoke takes effect within that
TTL). With none of the three configured the server is in local single-user mode (user
`local_user`, role ops), which is refused at start when it binds a non-loopback address.
Presented credentials are never logged.

With the project's own auth (`auth.path` in langgraph.json, shared/authz/), its
`@auth.authenticate` says who calls the API instead, and every user of the project shares
one storage tenant (`PROJECT_TENANT`), as on the LangGraph Agent Server: what a user may
see is what the project's handlers allow, not a per-user partition. Per-user limits still
count per identity (`Principal.subject`). A project Auth without `@auth.authenticate` keeps
threadrun's credentials for the identity and adds its handlers. The ops API and page always
take threadrun's own credentials (the ops role is not the project's to grant).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from dataclasses import dataclass

from flask import Flask, current_app, g, request
from werkzeug.exceptions import Forbidden, Unauthorized

from shared.auth.keys import ApiKeyStore, CachedKeyResolver, is_managed_key, no_credentials
from shared.auth.tokens import InvalidToken, JwtVerifier, looks_like_jwt
from shared.authz.decide import Authorizer, RequestParts, run_sync
from shared.authz.loader import load_authorizer
from shared.authz.users import AuthUser
from shared.db import make_pool
from shared.project import load_project
from shared.settings import Settings

log = logging.getLogger(__name__)

AUTH_POOL_MAX = 4  # key lookups are cached; a few connections per web process suffice
LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})
PROJECT_TENANT = "langgraph-project"
"""The storage owner of every resource under the project's own auth (`auth.path`)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a user id and a role (`user`, or `ops` for the operations API)."""

    user_id: str  # the storage owner of what this caller makes and reads
    role: str = "user"
    local: bool = False  # the one user of local single-user mode (no credentials at all)
    auth_user: AuthUser | None = None  # set under the project's own auth (shared/authz/)

    @property
    def is_ops(self) -> bool:
        return self.role == "ops"

    @property
    def subject(self) -> str:
        """Whom the per-user limits count: the identity (the storage owner unless the
        project's auth puts every user in one tenant)."""
        return self.auth_user.identity if self.auth_user is not None else self.user_id


@dataclass
class Authenticator:
    """The credential sources of one web process."""

    settings: Settings
    keys: CachedKeyResolver
    verifier: JwtVerifier | None
    project_auth: Authorizer | None = None

    @classmethod
    def build(cls, settings: Settings) -> Authenticator:
        """Open the key store's pool, load the JWT keys and the project's Auth object."""
        pool = make_pool(settings, name="auth", max_size=AUTH_POOL_MAX)
        resolver = CachedKeyResolver(ApiKeyStore(pool), settings.api_key_cache_ttl_s)
        project_auth = load_authorizer(load_project(settings.config))
        return cls(settings, resolver, JwtVerifier.from_settings(settings), project_auth)

    def open_mode(self) -> bool:
        """Local single-user mode: no env keys, no JWT, no active stored key, and a loopback
        bind. A public server never falls into it, not even when its last stored key is
        revoked after start (it then answers 401 until a key exists again)."""
        return self.unconfigured() and is_loopback(self.settings.host)

    def unconfigured(self) -> bool:
        """No credential source at all (env keys, JWT or an active stored key)."""
        return no_credentials(self.settings, self.keys)

    def identify(self, presented: str | None) -> Principal:
        """The caller of the API: the project's `@auth.authenticate` when it has one, else
        threadrun's credentials (`presented`), under the project's handlers if any."""
        project = self.project_auth
        if project is None:
            return self.identify_builtin(presented)
        if project.authenticates:
            user = run_sync(project.authenticate(request_parts()))
        else:
            who = self.identify_builtin(presented)
            user = AuthUser({"identity": who.user_id, "permissions": [who.role]})
        return Principal(PROJECT_TENANT, "user", auth_user=user)

    def identify_builtin(self, presented: str | None) -> Principal:
        """The caller for `presented` (threadrun's own credentials), or 401."""
        if self.open_mode():
            # Local single-user mode: the one user also operates the system.
            return Principal(self.settings.local_user, "ops", local=True)
        if presented:
            who = self._match(presented)
            if who is not None:
                return who
            log.info("authentication failed", extra={"path": request.path[:200]})
        raise Unauthorized("a valid x-api-key header (or bearer token) is required")

    def _match(self, presented: str) -> Principal | None:
        if self.verifier is not None and looks_like_jwt(presented):
            try:
                ident = self.verifier.verify(presented)
            except InvalidToken as exc:
                log.info("bearer token refused: %s", exc)
                return None
            return Principal(ident.user_id, ident.role)
        encoded = presented.encode("utf-8", "surrogatepass")
        for key, (user, role) in self.settings.api_key_map.items():
            if hmac.compare_digest(key.encode(), encoded):
                return Principal(user, role)
        if is_managed_key(presented):
            stored = self.keys.lookup(presented)
            if stored is not None:
                return Principal(stored.user_id, stored.role)
        return None


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts local connections."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def request_parts() -> RequestParts:
    """This request as the project's `@auth.authenticate` sees it."""
    websocket = request.headers.get("Upgrade", "").lower() == "websocket"
    port = request.environ.get("SERVER_PORT")
    return RequestParts(
        method=request.method,
        path=request.path,
        headers=list(request.headers.items()),
        query_string=request.query_string,
        path_params=dict(request.view_args or {}),
        scheme=request.scheme,
        server=(request.host.split(":")[0], int(port)) if port else None,
        client=(request.remote_addr, 0) if request.remote_addr else None,
        websocket=websocket,
    )


def refuse_public_open_mode(settings: Settings, auth: Authenticator) -> None:
    """A4: no local single-user mode on a non-loopback address (raises at app start);
    the project's own `@auth.authenticate` is a credential source of its own."""
    if auth.project_auth is not None and auth.project_auth.authenticates:
        return
    if not is_loopback(settings.host) and auth.unconfigured():
        raise RuntimeError(
            f"refusing to start: THREADRUN_HOST={settings.host} is not a loopback address and"
            " no credentials are configured, so anyone could use this server as the local"
            " user. Set THREADRUN_API_KEYS, create a key with `threadrun keys create --user"
            " U`, configure THREADRUN_JWT_SECRET / THREADRUN_JWT_PUBLIC_KEY_FILE, or bind"
            " 127.0.0.1."
        )


PUBLIC_BLUEPRINTS = frozenset({"meta", "openapi", "ui", "genui_assets"})
"""Health, the OpenAPI document, the chat page's files and the generative UI bundles' files
(loaded by `<script src>`, as the official server serves them) need no credentials."""
SELF_AUTHENTICATING = frozenset({"ws", "ops"})
"""Blueprints whose every view authenticates itself: the WebSocket upgrade and the ops page
accept `?api_key=`; /metrics may be public by setting."""


def _authenticate_request() -> None:
    """Every other endpoint is authenticated before its view runs (401 first, then 404)."""
    if request.method == "OPTIONS" or request.endpoint in (None, "static"):
        return
    if request.blueprint in PUBLIC_BLUEPRINTS or request.blueprint in SELF_AUTHENTICATING:
        return
    principal()


def init_app(app: Flask, settings: Settings) -> None:
    """Build the authenticator; refuse an open server on a public address; authenticate
    every non-public request up front, so a new endpoint is never open by accident."""
    auth = Authenticator.build(settings)
    refuse_public_open_mode(settings, auth)
    app.extensions["threadrun_auth"] = auth
    app.before_request(_authenticate_request)


def _presented_key() -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return None


def authenticate(extra_key: str | None = None) -> Principal:
    """The caller, or 401 when credentials are configured and none matches.

    `extra_key` is a key presented some other way (the WebSocket `?api_key=`, since
    browsers cannot set headers on a socket).
    """
    auth: Authenticator = current_app.extensions["threadrun_auth"]
    return auth.identify(_presented_key() or extra_key)


def authenticate_builtin(extra_key: str | None = None) -> Principal:
    """The caller by threadrun's own credentials only (the ops API and page)."""
    auth: Authenticator = current_app.extensions["threadrun_auth"]
    return auth.identify_builtin(_presented_key() or extra_key)


def project_authorizer() -> Authorizer | None:
    """The project's Auth object as served (None without `auth.path`)."""
    auth: Authenticator = current_app.extensions["threadrun_auth"]
    return auth.project_auth


def principal() -> Principal:
    """The authenticated caller of this request (cached on `g`)."""
    if "principal" not in g:
        g.principal = authenticate()
    return g.principal  # type: ignore[no-any-return]


def require_ops() -> Principal:
    """The caller if it has the `ops` role, else 403 (after 401 for no valid key). Always
    threadrun's own credentials, also under the project's auth."""
    if "ops_principal" not in g:
        auth: Authenticator = current_app.extensions["threadrun_auth"]
        g.ops_principal = principal() if auth.project_auth is None else authenticate_builtin()
    who: Principal = g.ops_principal
    if not who.is_ops:
        raise Forbidden("this endpoint needs the ops role")
    return who
