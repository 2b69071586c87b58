"""Threads: create, get, patch, delete, search, count (A1, A4)."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Blueprint, Response

from app.auth import principal
from app.http import json_response, parse_body
from app.schemas import ThreadCount, ThreadCreate, ThreadPatch, ThreadSearch
from app.services import current_services
from shared.errors import ThreadNotFound

bp = Blueprint("threads", __name__)


def thread_json(row: dict[str, Any]) -> dict[str, Any]:
    """The SDK's Thread shape."""
    return {
        "thread_id": str(row["thread_id"]),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "metadata": row["metadata"],
        "status": row["status"],
        "values": None,
        "interrupts": {},
    }


def checked_thread_id(thread_id: str) -> str:
    """A thread id that is not a UUID cannot exist: 404, exactly like a missing one."""
    try:
        return str(uuid.UUID(thread_id))
    except ValueError as exc:
        raise ThreadNotFound(f"thread {thread_id[:64]} not found") from exc


def owned_thread(thread_id: str) -> dict[str, Any]:
    """The caller's thread or 404."""
    return current_services().store.get_thread(checked_thread_id(thread_id), principal().user_id)


@bp.post("/threads")
def create() -> Response:
    """Create a thread (`if_exists`: raise | do_nothing)."""
    body = parse_body(ThreadCreate, allow_empty=True)
    row = current_services().store.create_thread(
        str(body.thread_id) if body.thread_id else None,
        principal().user_id,
        body.metadata,
        body.if_exists,
    )
    return json_response(thread_json(row))


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
    rows = current_services().store.search_threads(
        principal().user_id,
        metadata=q.metadata,
        status=q.status,
        ids=[str(i) for i in q.ids] if q.ids is not None else None,
        limit=q.limit,
        offset=q.offset,
        sort_by=q.sort_by,
        sort_order=q.sort_order,
    )
    return json_response([thread_json(r) for r in rows])


@bp.post("/threads/count")
def count() -> Response:
    """How many threads match."""
    q = parse_body(ThreadCount, allow_empty=True)
    return json_response(
        current_services().store.count_threads(
            principal().user_id, metadata=q.metadata, status=q.status
        )
    )
