"""API key / bearer token -> Principal (A4). With no keys configured: local single-user mode."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from flask import g, request
from werkzeug.exceptions import Forbidden, Unauthorized

from app.services import current_services


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a user id and a role (`user`, or `ops` for the operations API)."""

    user_id: str
    role: str = "user"

    @property
    def is_ops(self) -> bool:
        return self.role == "ops"


def _presented_key() -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    return None


def authenticate(extra_key: str | None = None) -> Principal:
    """The caller, or 401 when keys are configured and none matches.

    `extra_key` is a key presented some other way (the WebSocket `?api_key=`, since
    browsers cannot set headers on a socket).
    """
    settings = current_services().settings
    keys = settings.api_key_map
    if not keys:
        # Local single-user mode: the one user also operates the system.
        return Principal(settings.local_user, "ops")
    presented = _presented_key() or extra_key
    if presented:
        for key, (user, role) in keys.items():
            if hmac.compare_digest(key.encode(), presented.encode()):
                return Principal(user, role)
    raise Unauthorized("a valid x-api-key header (or bearer token) is required")


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
