"""Threads: create, get, patch, delete, search, count, copy, prune (A1, A4)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from flask import Blueprint, Response

from app import authz, public_ids
from app.api.shapes import thread_json, ttl_json
from app.auth import principal
from app.http import answers, body, non_empty_args, query
from app.ids import parsed_thread_id
from app.limits import config_sized
from app.responses import json_response
from app.schemas import (
    ThreadCopy,
    ThreadCount,
    ThreadCreate,
    ThreadGetQuery,
    ThreadPatch,
    ThreadPrune,
    ThreadSearch,
)
from app.services import current_services
from shared.errors import Conflict, ThreadNotFound
from shared.redis_keys import Keys
from shared.retention.removal import ThreadRemover
from shared.runs.model import PruneStrategy, Thread, ThreadStatus
from shared.state.accessor import ThreadHead

log = logging.getLogger(__name__)
bp = Blueprint("threads", __name__)


def owned_thread(
    thread_id: str, action: str = "read", value: dict[str, Any] | None = None
) -> Thread:
    """The caller's thread the client calls `thread_id` (its public id, A4), or 404; under
    the project's auth, one the caller may `action` (`threads.<action>`) and whose
    metadata passes the handler's filter (else 404, like a missing thread)."""
    store = current_services().store
    public = parsed_thread_id(thread_id)
    payload = value if value is not None else {}  # the handler may edit it: callers read it
    payload["thread_id"] = public
    decision = authz.authorize("threads", action, payload)
    thread = store.get_thread_by_public_id(public, principal().user_id)
    authz.require_visible(decision, thread.metadata, ThreadNotFound(f"thread {public} not found"))
    return public_ids.remember_thread(thread)


def graph_id_of(thread: Thread) -> str | None:
    """The registered graph the thread's runs use (its `graph_id` metadata), else None."""
    gid = thread.metadata.get("graph_id")
    return gid if isinstance(gid, str) and gid in current_services().registry.ids() else None


def thread_objects(
    threads: Sequence[Thread], select: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """The SDK's Thread objects with their head's `values` and `interrupts`: the heads of
    all of them in one checkpoint query (a thread that never ran has none). With `select`,
    only those fields, and no checkpoint read unless `values` or `interrupts` is one."""
    heads: dict[str, ThreadHead] = {}
    if select is None or {"values", "interrupts"} & set(select):
        state = current_services().state
        graphs = {t.thread_id: graph_id_of(t) for t in threads}
        heads = state.heads(graphs)
        # A thread of a graph this server does not serve (no longer, or not here): its
        # stored head copy, so a client still sees its messages (the chat page, read-only).
        unserved = [
            t.thread_id
            for t in threads
            if graphs[t.thread_id] is None and isinstance(t.metadata.get("graph_id"), str)
        ]
        heads.update(state.stored_heads(unserved))
    objects = [thread_json(t, heads.get(t.thread_id)) for t in threads]
    if select is None:
        return objects
    return [{k: v for k, v in o.items() if k in select} for o in objects]


def delete_owned(owner: str, thread_id: str) -> None:
    """Delete the owner's thread (404 otherwise): its runs, with running ones told to stop,
    its checkpoints, Redis keys and workspace files, and the audit record, in one
    transaction (shared/retention/removal.py: the expiry sweep's path too)."""
    svc = current_services()
    remover = ThreadRemover(
        svc.store, svc.redis, Keys(svc.settings.redis_prefix), svc.settings.workspace_dir
    )
    remover.delete_owned(svc.runs, owner, thread_id)


@bp.post("/threads")
@config_sized
@body(ThreadCreate, required=False)
def create(body: ThreadCreate) -> Response:
    """Create a thread (`if_exists`: raise | do_nothing); under the project's auth with the
    metadata as `threads.create` left it."""
    metadata = body.metadata
    decision = authz.authorize(
        "threads",
        "create",
        {"thread_id": body.thread_id, "metadata": dict(metadata), "if_exists": body.if_exists},
    )
    if decision is not None:
        metadata = decision.value.get("metadata") or {}
    thread = current_services().store.create_thread(
        str(body.thread_id) if body.thread_id else None,
        principal().user_id,
        metadata,
        body.if_exists,
        body.ttl.to_ttl() if body.ttl else None,
    )
    return json_response(thread_objects([thread])[0])


@bp.get("/threads/<thread_id>")
@query(ThreadGetQuery, args=lambda: non_empty_args(multi=("include",)))
def get(thread_id: str, query: ThreadGetQuery) -> Response:
    """One thread (`include=ttl`: with its `ttl`, as the official server shows it)."""
    thread = owned_thread(thread_id)
    out = thread_objects([thread])[0]
    if "ttl" in query.include:
        out["ttl"] = ttl_json(thread)
    return json_response(out)


@bp.patch("/threads/<thread_id>")
@config_sized
@body(ThreadPatch)
def patch(thread_id: str, body: ThreadPatch) -> Response:
    """Merge metadata (under the project's auth, as `threads.update` left it)."""
    value = {"metadata": dict(body.metadata)}
    tid = owned_thread(thread_id, "update", value).thread_id
    metadata = value.get("metadata") or {}  # as the handler left it
    thread = current_services().store.patch_thread(
        tid, principal().user_id, metadata, body.ttl.to_ttl() if body.ttl else None
    )
    return json_response(thread_objects([thread])[0])


@bp.delete("/threads/<thread_id>")
@answers(204, "deleted")
def delete(thread_id: str) -> Response:
    """Delete the thread, its runs and its checkpoints; running runs are told to stop."""
    delete_owned(principal().user_id, public_ids.resolve(thread_id, "delete"))
    return Response(status=204)


@bp.post("/threads/search")
@body(ThreadSearch, required=False)
def search(body: ThreadSearch) -> Response:
    """Threads of the caller filtered by metadata, status and (threadrun extensions) a text
    `query` on their title and messages, and `sort_by="activity"` (newest run first)."""
    decision = authz.authorize(
        "threads",
        "search",
        {
            "metadata": dict(body.metadata),
            "values": {},
            "status": body.status,
            "limit": body.limit,
            "offset": body.offset,
            "ids": body.ids,
            "thread_id": None,
        },
    )
    threads = current_services().store.search_threads(
        principal().user_id,
        metadata=authz.narrowed(decision, body.metadata),
        status=body.status,
        ids=[str(i) for i in body.ids] if body.ids is not None else None,
        limit=body.limit,
        offset=body.offset,
        sort_by=body.sort_by,
        sort_order=body.sort_order,
        query=body.query,
        scan_max=current_services().settings.thread_search_scan_threads,
    )
    return json_response(thread_objects(threads, body.select))


@bp.post("/threads/count")
@body(ThreadCount, required=False)
def count(body: ThreadCount) -> Response:
    """How many threads match."""
    decision = authz.authorize(
        "threads", "search", {"metadata": dict(body.metadata), "status": body.status}
    )
    return json_response(
        current_services().store.count_threads(
            principal().user_id,
            metadata=authz.narrowed(decision, body.metadata),
            status=body.status,
        )
    )


@bp.post("/threads/<thread_id>/copy")
@body(ThreadCopy, required=False)
def copy(thread_id: str, body: ThreadCopy) -> Response:
    """A new thread of the caller with the thread's metadata, state and whole history.

    The checkpoints are copied first, in one statement (a busy thread's committed state at
    that instant), then the thread row is made: until then the copy is invisible, so a
    failure in between leaves no half-made thread, only rows no thread id points to,
    which are removed on the way out.
    """
    source = owned_thread(thread_id)
    svc = current_services()
    target = str(uuid.uuid4())
    svc.state.copy_thread(source.thread_id, target)
    try:
        thread = svc.store.create_thread_copy(source, target)
    except BaseException:
        svc.state.delete_thread(target)
        raise
    svc.state.refresh_heads({target: graph_id_of(thread)})
    return json_response(thread_objects([thread])[0])


@bp.post("/threads/prune")
@body(ThreadPrune)
def prune(body: ThreadPrune) -> Response:
    """Delete threads, or keep only their latest checkpoint (`strategy`).

    Every id must be a thread of the caller, else 404 and nothing is touched (the
    official server's answer when its auth filters leave a thread out). `delete` goes the
    way of `DELETE /threads/{id}`; `keep_latest` refuses a busy thread (409): its running
    run's rollback point may be an older checkpoint.
    """
    owner = principal().user_id
    ids = list(dict.fromkeys(str(t) for t in body.thread_ids))
    if not ids:
        return json_response({"pruned_count": 0})
    svc = current_services()
    decision = authz.authorize("threads", "delete", {"thread_id": None, "ids": ids})
    threads = svc.store.search_threads(
        owner,
        metadata=authz.narrowed(decision, {}),
        status=None,
        ids=ids,
        limit=len(ids),
        offset=0,
        sort_by="thread_id",
        sort_order="asc",
    )
    missing = set(ids) - {t.client_id for t in threads}
    if missing:
        raise ThreadNotFound(f"thread {min(missing)} not found")
    for t in threads:
        public_ids.remember_thread(t)
    storage = {t.client_id: t.thread_id for t in threads}
    ids = [storage[i] for i in ids]  # the client's ids named them; storage ids from here on
    if body.strategy is PruneStrategy.DELETE:
        pruned = 0
        for tid in ids:
            try:
                delete_owned(owner, tid)
            except ThreadNotFound:  # deleted meanwhile by another request
                continue
            pruned += 1
        return json_response({"pruned_count": pruned})
    busy = sorted(t.thread_id for t in threads if t.status is ThreadStatus.BUSY)
    if busy:
        raise Conflict(f"thread {busy[0]} has a run in progress; prune it when it is idle")
    svc.state.keep_latest(ids)
    svc.state.refresh_heads({t.thread_id: graph_id_of(t) for t in threads})
    return json_response({"pruned_count": len(ids)})
