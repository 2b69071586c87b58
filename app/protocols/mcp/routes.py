"""`/mcp`, the Streamable HTTP transport (MCP 2025-11-25 and the handshake revisions before
it): the edge that reads the HTTP request, finds the session, dispatches one JSON-RPC
message and writes the answer (JSON, or SSE for a call that asked for progress).

    POST   one message: a request gets its response; a notification or a response, 202
    DELETE ends the session named by `Mcp-Session-Id` (204)
    GET    405: this server opens no stream of its own (it has nothing to say unasked)

Authentication ran before the view (app/auth.py, as for every route: 401). Transport
errors are HTTP 4xx with a JSON-RPC error body (the client reads both): 400 for a body that
is not one JSON-RPC message, a missing `Mcp-Session-Id` or an unknown
`MCP-Protocol-Version`, 404 for a session that is not the caller's, 406 / 415 for the
media types. Errors of the REST API's own (limits, the project's auth, an unavailable
service) keep their status, with the REST error in the JSON-RPC error's `data`.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterator
from typing import Any

import mcp_types as types
from flask import Blueprint, Response, current_app, request, stream_with_context
from mcp_types.jsonrpc import JSONRPCNotification, JSONRPCRequest, RequestId
from mcp_types.version import LATEST_HANDSHAKE_VERSION

from app import authz, public_ids
from app.auth import principal
from app.errors import reply_for
from app.http import answers, require_json_content_type
from app.limits import ConnectionSlot, limiter
from app.protocols.mcp import calls, jsonrpc
from app.protocols.mcp.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, SERVER_ERROR, RpcError
from app.protocols.mcp.sessions import CallRecord, Session, SessionStore
from app.services import current_services
from shared import serde
from shared.runs.model import CancelAction, Run

bp = Blueprint("mcp", __name__)
log = logging.getLogger(__name__)

SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
SERVER_NAME = "threadrun"
PARAMS_STATUSES = frozenset({400, 404, 409, 413, 422})
"""REST statuses that mean the request's params were wrong: -32602 at 200."""


def sessions() -> SessionStore:
    """The session store of this app (app/protocols/mcp/__init__.py builds it)."""
    return current_app.extensions["threadrun_mcp"]  # type: ignore[no-any-return]


def _json(
    message: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(serde.dumps(message), status, mimetype="application/json", headers=headers)


def _answer_error(
    request_id: RequestId | None, err: RpcError, headers: dict[str, str] | None = None
) -> Response:
    return _json(jsonrpc.error_message(request_id, err), err.status, headers)


def _from_rest(exc: Exception, *, transport: bool) -> tuple[RpcError, dict[str, str] | None]:
    """A REST error (app/errors.py's reply) as a JSON-RPC error: a wrong param is -32602 at
    200 (`transport`: the request itself was wrong, its status kept), a limit, a refusal or
    an unavailable service keeps its HTTP status (and Retry-After)."""
    reply = reply_for(exc)
    message = str(reply.body.get("message") or reply.body.get("error") or "error")
    if reply.status in PARAMS_STATUSES and not transport:
        return RpcError(INVALID_PARAMS, f"Invalid params: {message}", data=reply.body), None
    code = jsonrpc.INTERNAL_ERROR if reply.status >= 500 and reply.status != 503 else SERVER_ERROR
    return RpcError(code, message, data=reply.body, status=reply.status), reply.headers


def _accepts(media: str) -> bool:
    """Whether the client takes `media` (no Accept header: anything)."""
    return not request.headers.get("Accept") or request.accept_mimetypes.quality(media) > 0


def _check_transport() -> None:
    """406 / 415 for the media types (the client must accept JSON or SSE and send JSON)."""
    if request.headers.get("Accept") and not (
        _accepts("application/json") or _accepts("text/event-stream")
    ):
        raise RpcError(
            INVALID_REQUEST,
            "Not Acceptable: the Accept header must include application/json and text/event-stream",
            status=406,
        )
    try:
        require_json_content_type()
    except Exception as exc:  # ValidationFailed (415)
        raise _from_rest(exc, transport=True)[0] from exc


def _session() -> Session:
    """The caller's session named by `Mcp-Session-Id` (400 without one, 404 for an unknown
    one or another caller's), its version checked against `MCP-Protocol-Version`."""
    session_id = request.headers.get(SESSION_HEADER)
    if not session_id:
        raise RpcError(
            INVALID_REQUEST, f"Bad Request: the {SESSION_HEADER} header is required", status=400
        )
    session = sessions().get(session_id, principal().subject)
    if session is None:
        raise RpcError(INVALID_REQUEST, "Session not found", status=404)
    version = request.headers.get(VERSION_HEADER)
    if version is not None and version != session.version:
        known = jsonrpc.known_version(version)
        why = "does not match the session's" if known else "is not supported"
        raise RpcError(
            INVALID_REQUEST,
            f"Bad Request: {VERSION_HEADER} {version[:40]!r} {why} ({session.version})",
            status=400,
        )
    return session


@bp.post("/mcp")
@answers(202, "a notification or a response of the client, accepted")
@answers(406, "the Accept header takes neither JSON nor SSE", json=True)
def post() -> Response:
    """One JSON-RPC message of the client."""
    try:
        _check_transport()
        incoming = jsonrpc.parse_body(request.get_data(cache=True))
    except RpcError as err:
        return _answer_error(None, err)
    try:
        if incoming.kind == "request" and incoming.method == "initialize":
            return _initialize(incoming.message)  # type: ignore[arg-type]
        session = _session()
        if incoming.kind == "notification":
            _notified(session, incoming.message)  # type: ignore[arg-type]
            return Response(status=202)
        if incoming.kind == "response":
            return Response(status=202)  # this server sends no requests: nothing to match
        return _requested(session, incoming.message)  # type: ignore[arg-type]
    except RpcError as err:
        return _answer_error(incoming.request_id, err)
    except Exception as exc:  # noqa: BLE001 - every error answers as JSON-RPC
        mapped, headers = _from_rest(exc, transport=incoming.kind != "request")
        return _answer_error(incoming.request_id, mapped, headers)


def _initialize(message: JSONRPCRequest) -> Response:
    """A new session at the negotiated version; its id in `Mcp-Session-Id`."""
    parsed = jsonrpc.parse_request(message, LATEST_HANDSHAKE_VERSION)
    assert isinstance(parsed, types.InitializeRequest)
    version = jsonrpc.negotiate(parsed.params.protocol_version)
    session = sessions().create(principal().subject, version)
    result = types.InitializeResult(
        protocol_version=version,
        capabilities=types.ServerCapabilities(tools=types.ToolsCapability(list_changed=False)),
        server_info=types.Implementation(name=SERVER_NAME, version=_version()),
        instructions="Each tool runs one assistant of this LangGraph server and answers its"
        " final output.",
    )
    body = jsonrpc.result_message(message.id, "initialize", version, result)
    return _json(body, headers={SESSION_HEADER: session.session_id})


def _version() -> str:
    try:
        return importlib.metadata.version("threadrun-server")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def _notified(session: Session, message: JSONRPCNotification) -> None:
    """`notifications/cancelled` ends the run of that request; the rest need nothing."""
    parsed = jsonrpc.parse_notification(message, session.version)
    if not isinstance(parsed, types.CancelledNotification):
        return
    request_id = parsed.params.request_id
    if request_id is None:
        return
    record = sessions().cancel_call(session, request_id)
    if record is not None:
        _cancel(record)


def _cancel(record: CallRecord) -> None:
    """Cancel a call's run as `POST /threads/{id}/runs/{run_id}/cancel` does (R5)."""
    if authz.active():
        public_ids.authorize_thread(
            record.thread_id,
            record.public_thread_id,
            "update",
            {"run_id": record.run_id, "action": CancelAction.INTERRUPT.value},
        )
    current_services().runs.cancel(
        owner=principal().user_id,
        thread_id=record.thread_id,
        run_id=record.run_id,
        action=CancelAction.INTERRUPT,
    )


def _requested(session: Session, message: JSONRPCRequest) -> Response:
    parsed = jsonrpc.parse_request(message, session.version)
    if isinstance(parsed, types.PingRequest):
        return _json(
            jsonrpc.result_message(message.id, "ping", session.version, types.EmptyResult())
        )
    if isinstance(parsed, types.ListToolsRequest):
        listed = calls.list_tools(parsed.params)
        return _json(jsonrpc.result_message(message.id, "tools/list", session.version, listed))
    assert isinstance(parsed, types.CallToolRequest)
    return _call(session, message.id, parsed.params)


def _call(session: Session, request_id: RequestId, params: types.CallToolRequestParams) -> Response:
    """Admit the tool's run, then answer once it ended: as SSE with progress notifications
    when the client gave a `progressToken` (and takes SSE), else as JSON."""
    token = (params.meta or {}).get("progress_token")
    sse = token is not None and _accepts("text/event-stream")
    slot = limiter().acquire_connection(principal().subject)  # held like /runs/wait's
    try:
        run = calls.admit_call(params, progress=sse)
        record = CallRecord(run.run_id, run.thread_id, public_ids.public_of(run.thread_id))
        if sessions().start_call(session, request_id, record):
            _cancel(record)  # its cancel overtook the admission
    except BaseException:
        slot.release()
        raise
    body = _call_body(session, request_id, run, slot, token if sse else None)
    media = "text/event-stream" if sse else "application/json"
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return Response(stream_with_context(body), mimetype=media, headers=headers)


def _call_body(
    session: Session,
    request_id: RequestId,
    run: Run,
    slot: ConnectionSlot,
    token: types.ProgressToken | None,
) -> Iterator[bytes]:
    """Progress (SSE) or keep-alive newlines (JSON) while the run lasts, then its result.
    A client that leaves does not cancel the run (the transport spec); its
    `notifications/cancelled` does."""
    svc = current_services()
    follow = calls.RunFollow(svc, run)
    try:
        for step in follow:
            slot.maybe_renew()
            if token is None:
                if step is None:
                    yield b"\n"  # JSON parsers skip leading whitespace, proxies see bytes
            elif step is None:
                yield b": keep-alive\n\n"
            else:
                yield jsonrpc.sse_frame(jsonrpc.progress(token, step.count, step.text))
        try:
            answer = jsonrpc.result_message(
                request_id, "tools/call", session.version, calls.result(svc, follow)
            )
        except Exception as exc:  # noqa: BLE001 - the status line is gone: answer in the body
            answer = jsonrpc.error_message(request_id, _from_rest(exc, transport=False)[0])
        yield jsonrpc.sse_frame(answer) if token is not None else serde.dumps(answer)
    finally:
        sessions().end_call(session, request_id)
        slot.release()


@bp.delete("/mcp")
@answers(204, "the session ended")
def delete() -> Response:
    """End the caller's session (204)."""
    try:
        session = _session()
    except RpcError as err:
        return _answer_error(None, err)
    sessions().delete(session)
    return Response(status=204)


@bp.get("/mcp")
@answers(405, "no server-initiated stream is offered", json=True)
def get() -> Response:
    """405: no server-initiated stream (the transport lets a server decline it)."""
    err = RpcError(
        INVALID_REQUEST,
        "Method Not Allowed: this server opens no SSE stream of its own",
        status=405,
    )
    return _answer_error(None, err, {"Allow": "POST, DELETE"})
