"""Thread state and history, through the one state accessor (S5)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, request
from langgraph.errors import InvalidUpdateError

from app.api.threads import graph_id_of, owned_thread
from app.http import body, validate
from app.limits import heavy_read
from app.responses import json_response
from app.schemas import CheckpointRef, HistoryRequest, StateAtCheckpoint, StateUpdate
from app.services import current_services
from shared.errors import Conflict, ValidationFailed
from shared.runs.model import ThreadStatus
from shared.state.message_values import check_messages

bp = Blueprint("state", __name__)


_graph_id = graph_id_of


@bp.get("/threads/<thread_id>/state")
def get_state(thread_id: str) -> Response:
    """The thread's current state."""
    thread = owned_thread(thread_id)
    with heavy_read():
        state = current_services().state.get(thread.thread_id, _graph_id(thread))
    return json_response(state)


@bp.get("/threads/<thread_id>/state/<checkpoint_id>")
def get_state_at(thread_id: str, checkpoint_id: str) -> Response:
    """The state at one checkpoint."""
    thread = owned_thread(thread_id)
    return json_response(
        current_services().state.get(
            thread.thread_id, _graph_id(thread), {"checkpoint_id": checkpoint_id}
        )
    )


@bp.post("/threads/<thread_id>/state/checkpoint")
@body(StateAtCheckpoint)
def post_state_at(thread_id: str, body: StateAtCheckpoint) -> Response:
    """The state at a checkpoint given in the body."""
    thread = owned_thread(thread_id)
    return json_response(
        current_services().state.get(thread.thread_id, _graph_id(thread), body.checkpoint.as_dict())
    )


@bp.post("/threads/<thread_id>/state")
@body(StateUpdate)
def update_state(thread_id: str, body: StateUpdate) -> Response:
    """Write values into the thread's state as a new checkpoint."""
    thread = owned_thread(thread_id, "update")
    graph_id = _graph_id(thread)
    if graph_id is None:  # a 400 as on the official server, which clients check for
        raise ValidationFailed(
            "the thread has no associated graph: start a run on it, or set its metadata"
            " graph_id, before updating its state",
            field="metadata.graph_id",
            status=400,
        )
    if thread.status is ThreadStatus.BUSY:
        raise Conflict("the thread has a run in progress; update its state when it is idle")
    check_messages(body.values)  # a malformed message is a 422 naming it, not a 500
    checkpoint = body.checkpoint.as_dict() if body.checkpoint else None
    if body.checkpoint_id:
        checkpoint = {"checkpoint_ns": "", "checkpoint_id": body.checkpoint_id}
    try:
        out = current_services().state.update(
            thread.thread_id,
            graph_id,
            body.values,
            as_node=body.as_node,
            checkpoint=checkpoint,
        )
    except (ValueError, KeyError, InvalidUpdateError) as exc:  # (the last found by the fuzzer)
        field = "as_node" if body.as_node and "does not exist" in str(exc) else "values"
        raise ValidationFailed(f"state update refused: {exc}", field=field) from exc
    return json_response(out)


def _history(thread_id: str, q: HistoryRequest) -> Response:
    thread = owned_thread(thread_id)
    before: dict[str, Any] | None = None
    if isinstance(q.before, CheckpointRef):
        before = q.before.as_dict()
    elif isinstance(q.before, str):
        before = {"checkpoint_ns": "", "checkpoint_id": q.before}
    svc = current_services()
    with heavy_read():
        page = svc.state.history(
            thread.thread_id,
            _graph_id(thread),
            limit=q.limit,
            before=before,
            metadata=q.metadata,
            checkpoint=q.checkpoint.as_dict() if q.checkpoint else None,
            max_bytes=svc.settings.history_max_bytes,
        )
    headers = {}
    if page.truncated and page.last_checkpoint_id:
        # Fewer states than asked for: the byte cap ended the page. The next one starts
        # `before` the last state sent (the SDK's `before=`).
        headers["X-Threadrun-Next-Before"] = page.last_checkpoint_id
    return Response(page.body(), mimetype="application/json", headers=headers)


@bp.post("/threads/<thread_id>/history")
@body(HistoryRequest, required=False)
def post_history(thread_id: str, body: HistoryRequest) -> Response:
    """Past states, newest first."""
    return _history(thread_id, body)


@bp.get("/threads/<thread_id>/history")
def get_history(thread_id: str) -> Response:
    """Past states, newest first (query-string form: `limit` and `before` only)."""
    args: dict[str, Any] = {}
    if "limit" in request.args:
        args["limit"] = request.args["limit"]
    if "before" in request.args:
        args["before"] = request.args["before"]
    return _history(thread_id, validate(HistoryRequest, args))
