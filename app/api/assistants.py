"""Assistants: create, get, update (a new version), delete, search, count, versions, set the
latest version, and the graph's drawing, schemas and subgraphs (A1).

A user sees their own assistants and each graph's system assistant; another user's reads
exactly like a missing one (404); a system assistant cannot be changed (403). A graph
name works wherever an assistant id does: it names the graph's system assistant.

Under the project's auth (`auth.path`) every route asks `assistants.<action>` first; a
filter narrows search and count, and an assistant it leaves out answers 404.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flask import Blueprint, Response

from app import authz
from app.api.shapes import assistant_json, assistant_version_json
from app.api.threads import delete_owned
from app.auth import principal
from app.http import answers, body, query
from app.limits import config_sized
from app.responses import json_response
from app.schemas import (
    AssistantCount,
    AssistantCreate,
    AssistantDeleteQuery,
    AssistantGraphQuery,
    AssistantLatest,
    AssistantSearch,
    AssistantUpdate,
    AssistantVersionsQuery,
    SubgraphsQuery,
)
from app.services import current_services
from shared.assistants import graph_schemas
from shared.assistants.model import Assistant
from shared.assistants.store import AssistantFilter
from shared.errors import AssistantNotFound, ThreadNotFound, ValidationFailed

bp = Blueprint("assistants", __name__)
THREAD_PAGE = 500
"""Threads listed per query when `delete_threads` removes an assistant's threads."""


def visible_assistant(
    assistant_id: str, action: str = "read", value: dict[str, Any] | None = None
) -> Assistant:
    """The assistant the caller may `action` (`assistants.<action>`, its filter on the
    assistant's metadata), else 404 like a missing one."""
    payload = value if value is not None else {}  # the handler may edit it: callers read it
    payload["assistant_id"] = assistant_id
    decision = authz.authorize("assistants", action, payload)
    assistant = current_services().assistants.get(principal().user_id, assistant_id)
    authz.require_visible(
        decision, assistant.metadata, AssistantNotFound(f"assistant {assistant_id} not found")
    )
    return assistant


@bp.post("/assistants")
@config_sized
@body(AssistantCreate)
def create(body: AssistantCreate) -> Response:
    """Create an assistant (`if_exists`: raise | do_nothing)."""
    spec = body.to_spec()
    decision = authz.authorize(
        "assistants",
        "create",
        {
            "assistant_id": spec.assistant_id,
            "graph_id": spec.graph_id,
            "config": spec.config,
            "context": spec.context,
            "metadata": dict(spec.metadata),
            "if_exists": spec.if_exists,
            "name": spec.name,
        },
    )
    if decision is not None:
        spec = dataclasses.replace(spec, metadata=decision.value.get("metadata") or {})
    assistant = current_services().assistants.create(principal().user_id, spec)
    return json_response(assistant_json(assistant))


@bp.post("/assistants/search")
@body(AssistantSearch, required=False)
def search(body: AssistantSearch) -> Response:
    """Visible assistants by graph, name substring and metadata; `X-Pagination-Next` when
    there are more."""
    decision = authz.authorize(
        "assistants",
        "search",
        {
            "graph_id": body.graph_id,
            "metadata": dict(body.metadata or {}),
            "limit": body.limit,
            "offset": body.offset,
        },
    )
    metadata = authz.narrowed(decision, body.metadata) if decision else body.metadata
    found = current_services().assistants.search(
        principal().user_id,
        AssistantFilter(graph_id=body.graph_id, name=body.name, metadata=metadata),
        limit=body.limit + 1,
        offset=body.offset,
        sort_by=body.sort_by or "created_at",
        sort_order=body.sort_order or "desc",
    )
    page = [assistant_json(a) for a in found[: body.limit]]
    if body.select:
        page = [{k: v for k, v in a.items() if k in body.select} for a in page]
    if len(found) > body.limit:
        nxt = body.offset + body.limit
        headers = {"X-Pagination-Total": str(nxt + 1), "X-Pagination-Next": str(nxt)}
    else:
        headers = {"X-Pagination-Total": str(body.offset + len(page))}
    return json_response(page, headers=headers)


@bp.post("/assistants/count")
@body(AssistantCount, required=False)
def count(body: AssistantCount) -> Response:
    """How many visible assistants match."""
    decision = authz.authorize(
        "assistants",
        "search",
        {"graph_id": body.graph_id, "metadata": dict(body.metadata or {})},
    )
    metadata = authz.narrowed(decision, body.metadata) if decision else body.metadata
    where = AssistantFilter(graph_id=body.graph_id, name=body.name, metadata=metadata)
    return json_response(current_services().assistants.count(principal().user_id, where))


@bp.get("/assistants/<assistant_id>")
def get(assistant_id: str) -> Response:
    """One assistant, by id or graph name."""
    return json_response(assistant_json(visible_assistant(assistant_id)))


@bp.patch("/assistants/<assistant_id>")
@config_sized
@body(AssistantUpdate, required=False)
def patch(assistant_id: str, body: AssistantUpdate) -> Response:
    """Write a new version (metadata merged, the rest replaced where given) and make it current."""
    patch = body.to_patch()
    if authz.active():
        value: dict[str, Any] = {
            "metadata": dict(patch.metadata or {}),
            "graph_id": patch.graph_id,
        }
        visible_assistant(assistant_id, "update", value)
        if patch.metadata is not None:  # as the handler left it
            patch = dataclasses.replace(patch, metadata=dict(value.get("metadata") or {}))
    assistant = current_services().assistants.patch(principal().user_id, assistant_id, patch)
    return json_response(assistant_json(assistant))


@bp.delete("/assistants/<assistant_id>")
@answers(204, "deleted")
@query(AssistantDeleteQuery)
def delete(assistant_id: str, query: AssistantDeleteQuery) -> Response:
    """Delete the assistant and its versions; `delete_threads=true` also deletes the caller's
    threads whose metadata names it (their running runs are told to stop)."""
    svc = current_services()
    owner = principal().user_id
    if authz.active():
        visible_assistant(assistant_id, "delete")
    deleted = svc.assistants.delete(owner, assistant_id)
    if query.delete_threads:
        _delete_threads_of(owner, deleted)
    return Response(status=204)


def _delete_threads_of(owner: str, assistant_id: str) -> None:
    svc = current_services()
    # Under the project's auth only the threads `threads.delete` lets the caller delete.
    decision = authz.authorize("threads", "delete", {"thread_id": None})
    metadata = authz.narrowed(decision, {"assistant_id": assistant_id})
    thread_ids: list[str] = []
    while True:
        page = svc.store.search_threads(
            owner,
            metadata=metadata,
            status=None,
            ids=None,
            limit=THREAD_PAGE,
            offset=len(thread_ids),
            sort_by="created_at",
            sort_order="asc",
        )
        thread_ids += [t.thread_id for t in page]
        if len(page) < THREAD_PAGE:
            break
    for thread_id in thread_ids:
        try:  # the way DELETE /threads/{id} goes: files, keys and the audit record too
            delete_owned(owner, thread_id)
        except ThreadNotFound:
            continue  # deleted meanwhile


def _compiled(assistant_id: str) -> tuple[Assistant, Any]:
    if authz.active():
        visible_assistant(assistant_id)
    return current_services().assistants.compiled(principal().user_id, assistant_id)


@bp.post("/assistants/<assistant_id>/versions")
@body(AssistantVersionsQuery, required=False)
def versions(assistant_id: str, body: AssistantVersionsQuery) -> Response:
    """The assistant's versions, newest first (`metadata` containment, `limit`, `offset`)."""
    if authz.active():
        visible_assistant(assistant_id)
    found = current_services().assistants.versions(
        principal().user_id,
        assistant_id,
        metadata=body.metadata or {},
        limit=body.limit,
        offset=body.offset,
    )
    return json_response([assistant_version_json(v) for v in found])


@bp.post("/assistants/<assistant_id>/latest")
@body(AssistantLatest)
def set_latest(assistant_id: str, body: AssistantLatest) -> Response:
    """Make an existing version the current one."""
    if authz.active():
        visible_assistant(assistant_id, "update", {"version": body.version})
    assistant = current_services().assistants.set_latest(
        principal().user_id, assistant_id, body.version
    )
    return json_response(assistant_json(assistant))


@bp.get("/assistants/<assistant_id>/graph")
@query(AssistantGraphQuery)
def graph(assistant_id: str, query: AssistantGraphQuery) -> Response:
    """The graph's nodes and edges (`xray`: true, false or a subgraph depth)."""
    _, compiled = _compiled(assistant_id)
    try:
        return json_response(graph_schemas.drawing(compiled, query.xray))
    except NotImplementedError:
        raise ValidationFailed("the graph does not support visualization") from None


@bp.get("/assistants/<assistant_id>/schemas")
def schemas(assistant_id: str) -> Response:
    """The input, output, state, config and context JSON Schemas of the graph."""
    assistant, compiled = _compiled(assistant_id)
    return json_response({"graph_id": assistant.graph_id, **graph_schemas.schemas(compiled)})


@bp.get("/assistants/<assistant_id>/subgraphs")
@bp.get("/assistants/<assistant_id>/subgraphs/<path:namespace>")
@query(SubgraphsQuery)
def subgraphs(
    assistant_id: str, namespace: str | None = None, *, query: SubgraphsQuery
) -> Response:
    """`{namespace: schemas}` of the graph's subgraphs (`recurse` into theirs)."""
    _, compiled = _compiled(assistant_id)
    try:
        return json_response(graph_schemas.subgraph_schemas(compiled, namespace, query.recurse))
    except NotImplementedError:
        raise ValidationFailed("the graph does not support visualization") from None
