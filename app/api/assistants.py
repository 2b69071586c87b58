"""Assistants: create, get, update (a new version), delete, search, count, versions, set the
latest version, and the graph's drawing, schemas and subgraphs (A1).

A user sees their own assistants and each graph's system assistant; another user's reads
exactly like a missing one (404); a system assistant cannot be changed (403). A graph
name works wherever an assistant id does: it names the graph's system assistant.
"""

from __future__ import annotations

from flask import Blueprint, Response

from app.api.shapes import assistant_json, assistant_version_json
from app.auth import principal
from app.http import json_response, parse_body, parse_query
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
from shared.assistants.store import AssistantFilter
from shared.errors import ThreadNotFound, ValidationFailed

bp = Blueprint("assistants", __name__)
THREAD_PAGE = 500
"""Threads listed per query when `delete_threads` removes an assistant's threads."""


@bp.post("/assistants")
def create() -> Response:
    """Create an assistant (`if_exists`: raise | do_nothing)."""
    body = parse_body(AssistantCreate)
    assistant = current_services().assistants.create(principal().user_id, body.to_spec())
    return json_response(assistant_json(assistant))


@bp.post("/assistants/search")
def search() -> Response:
    """Visible assistants by graph, name substring and metadata; `X-Pagination-Next` when
    there are more."""
    q = parse_body(AssistantSearch, allow_empty=True)
    found = current_services().assistants.search(
        principal().user_id,
        AssistantFilter(graph_id=q.graph_id, name=q.name, metadata=q.metadata),
        limit=q.limit + 1,
        offset=q.offset,
        sort_by=q.sort_by or "created_at",
        sort_order=q.sort_order or "desc",
    )
    page = [assistant_json(a) for a in found[: q.limit]]
    if q.select:
        page = [{k: v for k, v in a.items() if k in q.select} for a in page]
    if len(found) > q.limit:
        nxt = q.offset + q.limit
        headers = {"X-Pagination-Total": str(nxt + 1), "X-Pagination-Next": str(nxt)}
    else:
        headers = {"X-Pagination-Total": str(q.offset + len(page))}
    return json_response(page, headers=headers)


@bp.post("/assistants/count")
def count() -> Response:
    """How many visible assistants match."""
    q = parse_body(AssistantCount, allow_empty=True)
    where = AssistantFilter(graph_id=q.graph_id, name=q.name, metadata=q.metadata)
    return json_response(current_services().assistants.count(principal().user_id, where))


@bp.get("/assistants/<assistant_id>")
def get(assistant_id: str) -> Response:
    """One assistant, by id or graph name."""
    return json_response(
        assistant_json(current_services().assistants.get(principal().user_id, assistant_id))
    )


@bp.patch("/assistants/<assistant_id>")
def patch(assistant_id: str) -> Response:
    """Write a new version (metadata merged, the rest replaced where given) and make it current."""
    body = parse_body(AssistantUpdate, allow_empty=True)
    assistant = current_services().assistants.patch(
        principal().user_id, assistant_id, body.to_patch()
    )
    return json_response(assistant_json(assistant))


@bp.delete("/assistants/<assistant_id>")
def delete(assistant_id: str) -> Response:
    """Delete the assistant and its versions; `delete_threads=true` also deletes the caller's
    threads whose metadata names it (their running runs are told to stop)."""
    q = parse_query(AssistantDeleteQuery)
    svc = current_services()
    owner = principal().user_id
    deleted = svc.assistants.delete(owner, assistant_id)
    if q.delete_threads:
        _delete_threads_of(owner, deleted)
    return Response(status=204)


def _delete_threads_of(owner: str, assistant_id: str) -> None:
    svc = current_services()
    thread_ids: list[str] = []
    while True:
        page = svc.store.search_threads(
            owner,
            metadata={"assistant_id": assistant_id},
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
        try:
            svc.runs.delete_thread(owner=owner, thread_id=thread_id)
        except ThreadNotFound:
            continue  # deleted meanwhile
        svc.state.delete_thread(thread_id)


@bp.post("/assistants/<assistant_id>/versions")
def versions(assistant_id: str) -> Response:
    """The assistant's versions, newest first (`metadata` containment, `limit`, `offset`)."""
    q = parse_body(AssistantVersionsQuery, allow_empty=True)
    found = current_services().assistants.versions(
        principal().user_id,
        assistant_id,
        metadata=q.metadata or {},
        limit=q.limit,
        offset=q.offset,
    )
    return json_response([assistant_version_json(v) for v in found])


@bp.post("/assistants/<assistant_id>/latest")
def set_latest(assistant_id: str) -> Response:
    """Make an existing version the current one."""
    body = parse_body(AssistantLatest)
    assistant = current_services().assistants.set_latest(
        principal().user_id, assistant_id, body.version
    )
    return json_response(assistant_json(assistant))


@bp.get("/assistants/<assistant_id>/graph")
def graph(assistant_id: str) -> Response:
    """The graph's nodes and edges (`xray`: true, false or a subgraph depth)."""
    q = parse_query(AssistantGraphQuery)
    _, compiled = current_services().assistants.compiled(principal().user_id, assistant_id)
    try:
        return json_response(graph_schemas.drawing(compiled, q.xray))
    except NotImplementedError:
        raise ValidationFailed("the graph does not support visualization") from None


@bp.get("/assistants/<assistant_id>/schemas")
def schemas(assistant_id: str) -> Response:
    """The input, output, state, config and context JSON Schemas of the graph."""
    assistant, compiled = current_services().assistants.compiled(principal().user_id, assistant_id)
    return json_response({"graph_id": assistant.graph_id, **graph_schemas.schemas(compiled)})


@bp.get("/assistants/<assistant_id>/subgraphs")
@bp.get("/assistants/<assistant_id>/subgraphs/<path:namespace>")
def subgraphs(assistant_id: str, namespace: str | None = None) -> Response:
    """`{namespace: schemas}` of the graph's subgraphs (`recurse` into theirs)."""
    q = parse_query(SubgraphsQuery)
    _, compiled = current_services().assistants.compiled(principal().user_id, assistant_id)
    try:
        return json_response(graph_schemas.subgraph_schemas(compiled, namespace, q.recurse))
    except NotImplementedError:
        raise ValidationFailed("the graph does not support visualization") from None
