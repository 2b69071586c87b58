"""API key / bearer token -> Principal (A4).

Credentials, in order: a bearer JWT (when a JWT secret or public key is configured), a key
from THREADRUN_API_KEYS, a key created with `threadrun keys create` (hashed in Postgres,
looked up through a cache of `api_key_cache_ttl_s`, so a revoke takes effect within that
TTL). With none of the three configured the server is in local single-user mode (user
`local_user`, role ops), which is refused at start when it binds a non-loopback address.
Presented credentials are never logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from dataclasses import dataclass

from flask import Flask, current_app, g, request
from werkzeug.exceptions import Forbidden, Unauthorized

from shared.auth.keys import ApiKeyStore, CachedKeyResolver, is_managed_key
from shared.auth.tokens import InvalidToken, JwtVerifier, looks_like_jwt
from shared.db import make_pool
from shared.settings import Settings

log = logging.getLogger(__name__)

AUTH_POOL_MAX = 4  # key lookups are cached; a few connections per web process suffice
LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a user id and a role (`user`, or `ops` for the operations API)."""

    user_id: str
    role: str = "user"
    local: bool = False  # the one user of local single-user mode (no credentials at all)

    @property
    def is_ops(self) -> bool:
        return self.role == "ops"


@dataclass
class Authenticator:
    """The credential sources of one web process."""

    settings: Settings
    keys: CachedKeyResolver
    verifier: JwtVerifier | None

    @classmethod
    def build(cls, settings: Settings) -> Authenticator:
        """Open the key store's pool and load the JWT keys."""
        pool = make_pool(settings, name="auth", max_size=AUTH_POOL_MAX)
        resolver = CachedKeyResolver(ApiKeyStore(pool), settings.api_key_cache_ttl_s)
        return cls(settings, resolver, JwtVerifier.from_settings(settings))

    def open_mode(self) -> bool:
        """Local single-user mode: no env keys, no JWT, no active stored key, and a loopback
        bind. A public server never falls into it, not even when its last stored key is
        revoked after start (it then answers 401 until a key exists again)."""
        return self.unconfigured() and is_loopback(self.settings.host)

    def unconfigured(self) -> bool:
        """No credential source at all (env keys, JWT or an active stored key)."""
        return (
            not self.settings.api_key_map and self.verifier is None and not self.keys.any_active()
        )

    def identify(self, presented: str | None) -> Principal:
        """The caller for `presented`, or 401."""
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


def refuse_public_open_mode(settings: Settings, auth: Authenticator) -> None:
    """A4: no local single-user mode on a non-loopback address (raises at app start)."""
    if not is_loopback(settings.host) and auth.unconfigured():
        raise RuntimeError(
            f"refusing to start: THREADRUN_HOST={settings.host} is not a loopback address and"
            " no credentials are configured, so anyone could use this server as the local"
            " user. Set THREADRUN_API_KEYS, create a key with `threadrun keys create --user"
            " U`, configure THREADRUN_JWT_SECRET / THREADRUN_JWT_PUBLIC_KEY_FILE, or bind"
            " 127.0.0.1."
        )


PUBLIC_BLUEPRINTS = frozenset({"meta", "openapi", "ui"})
"""Health, the OpenAPI document and the chat page's files need no credentials."""
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


def principal() -> Principal:
    """The authenticated caller of this request (cached on `g`)."""
    if "principal" not in g:
        g.principal = authenticate()
    return g.principal  # type: ignore[no-any-return]


def require_ops() -> Principal:
    """The caller if it has the `ops` role, else 403 (after 401 for no valid key)."""
    who = principal()
    if not who.is_ops:
        raise Forbidden("this endpoint needs the ops role")
    return who
