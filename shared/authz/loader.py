"""Find the project's `langgraph_sdk.Auth` object (`auth.path`, e.g. "./auth.py:auth")."""

from __future__ import annotations

from langgraph_sdk import Auth

from shared.agent.graphs import load_variable
from shared.authz.decide import Authorizer, AuthzConfigError
from shared.errors import ConfigError
from shared.project import Project, ProjectConfigError


def load_authorizer(project: Project) -> Authorizer | None:
    """The project's Authorizer, or None when it has no `auth.path`.

    Everything wrong with it is a start-up error naming the file: a spec that does not
    load, an object that is not an `Auth`, an `@auth.authenticate` asking for a request part
    that does not exist. A security setting is never dropped.
    """
    section = project.auth
    if section.path is None:
        return None
    try:
        value = load_variable("auth.path", section.path, project.base)
    except ConfigError as exc:
        raise ProjectConfigError(f"{project.path}: auth.path {section.path!r}: {exc}") from exc
    if not isinstance(value, Auth):
        raise ProjectConfigError(
            f"{project.path}: auth.path {section.path!r} is a {type(value).__name__},"
            " not a langgraph_sdk.Auth"
        )
    try:
        return Authorizer(value, section.cache)
    except AuthzConfigError as exc:
        raise ProjectConfigError(f"{project.path}: auth.path {section.path!r}: {exc}") from exc
