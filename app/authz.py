"""The web's door to the project's authorization (shared/authz/): one call per action.

Every route, WebSocket frame and stream that touches a thread, assistant, cron or the
store asks `authorize(resource, action, value)` before it acts. Without `auth.path` it
answers None at once and nothing else changes. With it, the answer carries the handler's
filter: a search narrows its metadata condition with it (`narrowed`), a single resource
already read must match it (`require_visible`: 404 otherwise, the official server's answer
for a resource its filter leaves out), and a create uses the value the handler edited.
"""

from __future__ import annotations

from flask import g

from app.auth import principal, project_authorizer
from shared.authz.decide import Decision, run_sync
from shared.authz.filters import NOTHING, contains, merge
from shared.errors import NotFound
from shared.vocab import JSONObject


def authorize(resource: str, action: str, value: JSONObject) -> Decision | None:
    """The project's decision for the caller (`Denied` when refused); None without
    project auth."""
    authz = project_authorizer()
    if authz is None:
        return None
    user = principal().auth_user
    assert user is not None  # every principal is a project user under project auth
    return run_sync(authz.authorize(user, resource, action, value))


def narrowed(decision: Decision | None, metadata: JSONObject | None) -> JSONObject:
    """The request's metadata condition under the decision's filter."""
    own = metadata or {}
    if decision is None or decision.containment is None:
        return own
    merged = merge(own, decision.containment)
    return NOTHING if merged is None else merged


def visible(decision: Decision | None, metadata: JSONObject) -> bool:
    """Whether a resource with `metadata` passes the decision's filter."""
    return (
        decision is None or decision.containment is None or contains(metadata, decision.containment)
    )


def require_visible(decision: Decision | None, metadata: JSONObject, missing: NotFound) -> None:
    """`missing` (404) when the filter leaves the resource out."""
    if not visible(decision, metadata):
        raise missing


def active() -> bool:
    """Whether this server runs the project's auth."""
    if "authz_active" not in g:
        g.authz_active = project_authorizer() is not None
    return bool(g.authz_active)
