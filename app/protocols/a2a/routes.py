"""The HTTP edge of A2A: `POST /a2a/{assistant_id}` (JSON-RPC, JSON or SSE answers) and
the agent cards (`GET /a2a/{assistant_id}`, `.../.well-known/agent-card.json` and
`agent.json` under it, and `/.well-known/agent-card.json?assistant_id=` at the root)."""

from __future__ import annotations

from flask import Blueprint, Response, request, stream_with_context

from app.api.meta import VERSION
from app.auth import principal, project_authorizer
from app.http import holds_connection, require_json_content_type
from app.protocols.a2a import cards, dispatch, tasks
from app.protocols.a2a.wire import RpcError
from app.responses import json_response
from app.services import current_services

bp = Blueprint("a2a", __name__)
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


@bp.post("/a2a/<assistant_id>")
@bp.post("/a2a/<assistant_id>/")
@holds_connection
def rpc(assistant_id: str) -> Response:
    """One A2A JSON-RPC call on the assistant (SendMessage, SendStreamingMessage, GetTask,
    CancelTask, SubscribeToTask, and 0.3's message/send, message/stream, tasks/get,
    tasks/cancel, tasks/resubscribe)."""
    require_json_content_type()
    try:
        call = dispatch.parse(request.get_data(cache=True), assistant_id)
    except dispatch.Refused as refused:
        return json_response(dispatch.error(refused.request_id, refused.rpc))
    answer = dispatch.handle(call)
    if isinstance(answer, dict):
        return json_response(answer)
    if call.method.streams:
        return Response(
            stream_with_context(answer), mimetype="text/event-stream", headers=SSE_HEADERS
        )
    return Response(stream_with_context(answer), mimetype="application/json")


def _card(id_or_graph: str) -> Response:
    """The agent card of an assistant; 404 naming it when the caller has no such one."""
    try:
        assistant = tasks.agent(id_or_graph)
    except RpcError as exc:
        return json_response({"error": "NotFound", "message": exc.message}, status=404)
    keyed = not principal().local and project_authorizer() is None
    body = cards.card(assistant, request.url_root, version=VERSION, keyed=keyed)
    return json_response(body)


@bp.get("/a2a/<assistant_id>")
@bp.get("/a2a/<assistant_id>/.well-known/agent-card.json")
@bp.get("/a2a/<assistant_id>/.well-known/agent.json")
def assistant_card(assistant_id: str) -> Response:
    """The assistant's agent card (where an A2A client looks for it under its URL)."""
    return _card(assistant_id)


@bp.get("/.well-known/agent-card.json")
def root_card() -> Response:
    """The card of `?assistant_id=` (an id or a graph id; as the official server), else of
    THREADRUN_A2A_DEFAULT_ASSISTANT, else of the project's first graph."""
    wanted = request.args.get("assistant_id") or current_services().settings.a2a_default_assistant
    if not wanted:
        graphs = current_services().registry.ids()
        if not graphs:
            return json_response(
                {"error": "NotFound", "message": "this server serves no graph"}, status=404
            )
        wanted = graphs[0]
    return _card(wanted)
