"""Threads: create, get, patch, delete, search, count (A1, A4)."""

from __future__ import annotations

from flask import Blueprint, Response

from app.api.shapes import thread_json
from app.auth import principal
from app.http import checked_thread_id, json_response, parse_body
from app.schemas import ThreadCount, ThreadCreate, ThreadPatch, ThreadSearch
from app.services import current_services
from shared.runs.model import Thread

bp = Blueprint("threads", __name__)


def owned_thread(thread_id: str) -> Thread:
    """The caller's thread or 404."""
    return current_services().store.get_thread(checked_thread_id(thread_id), principal().user_id)


@bp.post("/threads")
def create() -> Response:
    """Create a thread (`if_exists`: raise | do_nothing)."""
    body = parse_body(ThreadCreate, allow_empty=True)
    thread = current_services().store.create_thread(
        str(body.thread_id) if body.thread_id else None,
        principal().user_id,
        body.metadata,
        body.if_exists,
    )
    return json_response(thread_json(thread))


@bp.get("/threads/<thread_id>")
def get(thread_id: str) -> Response:
    """One thread."""
    return json_response(thread_json(owned_thread(thread_id)))


@bp.patch("/threads/<thread_id>")
def patch(thread_id: str) -> Response:
    """Merge metadata."""
    body = parse_body(ThreadPatch)
    tid = checked_thread_id(thread_id)
    return json_response(
        thread_json(current_services().store.patch_thread(tid, principal().user_id, body.metadata))
    )


@bp.delete("/threads/<thread_id>")
def delete(thread_id: str) -> Response:
    """Delete the thread, its runs and its checkpoints; running runs are told to stop."""
    svc = current_services()
    tid = checked_thread_id(thread_id)
    svc.runs.delete_thread(owner=principal().user_id, thread_id=tid)
    svc.state.delete_thread(tid)
    return Response(status=204)


@bp.post("/threads/search")
def search() -> Response:
    """Threads of the caller filtered by metadata and status."""
    q = parse_body(ThreadSearch, allow_empty=True)
    threads = current_services().store.search_threads(
        principal().user_id,
        metadata=q.metadata,
        status=q.status,
        ids=[str(i) for i in q.ids] if q.ids is not None else None,
        limit=q.limit,
        offset=q.offset,
        sort_by=q.sort_by,
        sort_order=q.sort_order,
    )
    return json_response([thread_json(t) for t in threads])


@bp.post("/threads/count")
def count() -> Response:
    """How many threads match."""
    q = parse_body(ThreadCount, allow_empty=True)
    return json_response(
        current_services().store.count_threads(
            principal().user_id, metadata=q.metadata, status=q.status
        )
    )
