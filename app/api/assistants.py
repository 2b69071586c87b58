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
from shared.assistants.store import AssistantFilter
from shared.errors import ThreadNotFound, ValidationFailed

bp = Blueprint("assistants", __name__)
THREAD_PAGE = 500
"""Threads listed per query when `delete_threads` removes an assistant's threads."""


@bp.post("/assistants")
@config_sized
@body(AssistantCreate)
def create(body: AssistantCreate) -> Response:
    """Create an assistant (`if_exists`: raise | do_nothing)."""
    assistant = current_services().assistants.create(principal().user_id, body.to_spec())
    return json_response(assistant_json(assistant))


@bp.post("/assistants/search")
@body(AssistantSearch, required=False)
def search(body: AssistantSearch) -> Response:
    """Visible assistants by graph, name substring and metadata; `X-Pagination-Next` when
    there are more."""
    found = current_services().assistants.search(
        principal().user_id,
        AssistantFilter(graph_id=body.graph_id, name=body.name, metadata=body.metadata),
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
    where = AssistantFilter(graph_id=body.graph_id, name=body.name, metadata=body.metadata)
    return json_response(current_services().assistants.count(principal().user_id, where))


@bp.get("/assistants/<assistant_id>")
def get(assistant_id: str) -> Response:
    """One assistant, by id or graph name."""
    return json_response(
        assistant_json(current_services().assistants.get(principal().user_id, assistant_id))
    )


@bp.patch("/assistants/<assistant_id>")
@config_sized
@body(AssistantUpdate, required=False)
def patch(assistant_id: str, body: AssistantUpdate) -> Response:
    """Write a new version (metadata merged, the rest replaced where given) and make it current."""
    assistant = current_services().assistants.patch(
        principal().user_id, assistant_id, body.to_patch()
    )
    return json_response(assistant_json(assistant))


@bp.delete("/assistants/<assistant_id>")
@answers(204, "deleted")
@query(AssistantDeleteQuery)
def delete(assistant_id: str, query: AssistantDeleteQuery) -> Response:
    """Delete the assistant and its versions; `delete_threads=true` also deletes the caller's
    threads whose metadata names it (their running runs are told to stop)."""
    svc = current_services()
    owner = principal().user_id
    deleted = svc.assistants.delete(owner, assistant_id)
    if query.delete_threads:
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
@body(AssistantVersionsQuery, required=False)
def versions(assistant_id: str, body: AssistantVersionsQuery) -> Response:
    """The assistant's versions, newest first (`metadata` containment, `limit`, `offset`)."""
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
    assistant = current_services().assistants.set_latest(
        principal().user_id, assistant_id, body.version
    )
    return json_response(assistant_json(assistant))


@bp.get("/assistants/<assistant_id>/graph")
@query(AssistantGraphQuery)
def graph(assistant_id: str, query: AssistantGraphQuery) -> Response:
    """The graph's nodes and edges (`xray`: true, false or a subgraph depth)."""
    _, compiled = current_services().assistants.compiled(principal().user_id, assistant_id)
    try:
        return json_response(graph_schemas.drawing(compiled, query.xray))
    except NotImplementedError:
        raise ValidationFailed("the graph does not support visualization") from None


@bp.get("/assistants/<assistant_id>/schemas")
def schemas(assistant_id: str) -> Response:
    """The input, output, state, config and context JSON Schemas of the graph."""
    assistant, compiled = current_services().assistants.compiled(principal().user_id, assistant_id)
    return json_response({"graph_id": assistant.graph_id, **graph_schemas.schemas(compiled)})


@bp.get("/assistants/<assistant_id>/subgraphs")
@bp.get("/assistants/<assistant_id>/subgraphs/<path:namespace>")
@query(SubgraphsQuery)
def subgraphs(
    assistant_id: str, namespace: str | None = None, *, query: SubgraphsQuery
) -> Response:
    """`{namespace: schemas}` of the graph's subgraphs (`recurse` into theirs)."""
    _, compiled = current_services().assistants.compiled(principal().user_id, assistant_id)
    try:
        return json_response(graph_schemas.subgraph_schemas(compiled, namespace, query.recurse))
    except NotImplementedError:
        raise ValidationFailed("the graph does not support visualization") from None
