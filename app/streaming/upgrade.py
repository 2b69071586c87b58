"""A WebSocket upgrade is authenticated and counted before the socket exists (A4, A3), the
same for every socket the web serves (the chat protocol's `/ws`, the thread streaming
protocol's): `guard(bp)` puts both hooks on a blueprint of WebSocket routes; a project's
own WebSocket routes under `enable_custom_route_auth` call `authenticate_upgrade` too
(app/project_http/websocket.py)."""

from __future__ import annotations

from flask import Blueprint, g, request
from werkzeug.exceptions import HTTPException

from app.auth import authenticate
from app.cors import check_ws_origin
from app.limits import ConnectionSlot, limiter
from app.services import current_services
from shared.authz.decide import Denied

CLOSE_UNAUTHORIZED = 4401
"""The socket's credential is no longer valid (revoked key, expired token, local mode ended):
the application range (4000-4999) with HTTP's 401 in it, as other servers use."""


def authenticate_upgrade() -> None:
    """An unauthenticated upgrade gets a 401 JSON response, one over the caller's open
    connections a 429, before the socket is accepted.

    Browsers cannot set headers on a WebSocket, so `?api_key=` is accepted as well (it ends up
    in access logs; prefer the header where the client can send one).
    """
    check_ws_origin(current_services().settings)
    g.principal = authenticate(extra_key=request.args.get("api_key"))
    g.ws_conn = limiter().acquire_connection(g.principal.subject)


def credential_still_valid(subject: str) -> bool:
    """Whether the credential the upgrade request presented (header, bearer or `?api_key=`)
    still names `subject`: a key revoked, a token expired or local mode ended makes it False.
    Call it inside the upgrade's request context; an unreachable key store raises (one of
    SERVICE_ERRORS), and the caller decides whether that keeps the socket."""
    try:
        who = authenticate(extra_key=request.args.get("api_key"))
    except (HTTPException, Denied):
        return False
    return who.subject == subject


def release_connection(_exc: BaseException | None) -> None:
    """The connection slot back when the socket's request ends."""
    conn: ConnectionSlot | None = g.pop("ws_conn", None)
    if conn is not None:
        conn.release()


def guard(bp: Blueprint) -> None:
    """Both hooks on `bp`, whose routes are all WebSockets."""
    bp.before_request(authenticate_upgrade)
    bp.teardown_request(release_connection)
