"""JSON-RPC 2.0 as MCP speaks it over Streamable HTTP, without IO: classify a POST body,
validate a request's params for the session's protocol version, and shape results, errors
and notifications on the wire. Every shape is the `mcp-types` package's own (`mcp_types`, whose
per-version maps gate methods and drop fields an older revision does not know).

Errors are `RpcError` values carrying their JSON-RPC code and the HTTP status they go out
with: a body that is not a JSON-RPC message is the transport's 400; a request the server
reads but cannot serve (unknown method, invalid params, unknown tool) is a JSON-RPC error
at 200, as the protocol has it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import mcp_types as types
from mcp_types import methods
from mcp_types.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    RequestId,
    jsonrpc_message_adapter,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from pydantic import BaseModel, ValidationError

from shared import serde
from shared.errors import ThreadrunError

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "SERVER_ERROR",
    "Incoming",
    "RpcError",
    "error_message",
    "negotiate",
    "notification_message",
    "parse_body",
    "parse_notification",
    "parse_request",
    "result_message",
    "sse_frame",
]

SERVED_METHODS = frozenset({"initialize", "ping", "tools/list", "tools/call"})
"""The requests this server answers; any other method is -32601 (no prompts, resources,
completions or logging capability is offered)."""
SERVER_ERROR = -32000
"""An implementation-defined error (JSON-RPC's -32000..-32099): a per-user limit, a
refusal of the project's auth, an unavailable service (`data` carries the REST error)."""
VERSION_WITHOUT_HEADER = "2025-03-26"
"""The revision a request without `MCP-Protocol-Version` is read as, when nothing else says
(the 2025-06-18 transport spec); a session's negotiated version says otherwise."""


class RpcError(ThreadrunError):
    """A JSON-RPC error to answer, with the HTTP status it is sent with."""

    # A JSON-RPC error code, where the root's `code` is a string: this family answers on
    # its own protocol, never through the HTTP error map.
    code: int  # type: ignore[assignment]

    def __init__(self, code: int, message: str, *, data: Any = None, status: int = 200) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.status = status


Kind = Literal["request", "notification", "response"]


@dataclass(frozen=True, slots=True)
class Incoming:
    """One JSON-RPC message from the client, classified."""

    kind: Kind
    message: JSONRPCRequest | JSONRPCNotification | JSONRPCResponse | JSONRPCError

    @property
    def method(self) -> str | None:
        """The method of a request or notification (None for a response)."""
        msg = self.message
        return msg.method if isinstance(msg, JSONRPCRequest | JSONRPCNotification) else None

    @property
    def request_id(self) -> RequestId | None:
        """The id of a request (None otherwise)."""
        return self.message.id if isinstance(self.message, JSONRPCRequest) else None


def _invalid(message: str, request_id: RequestId | None = None) -> RpcError:
    return RpcError(INVALID_REQUEST, message, data={"id": request_id}, status=400)


def parse_body(raw: bytes) -> Incoming:
    """The message a POST carries; `RpcError` (HTTP 400) for a body that is not JSON (-32700)
    or not one JSON-RPC 2.0 message (-32600: batches are gone since 2025-06-18)."""
    try:
        data = serde.loads(raw)
    except ValueError as exc:
        raise RpcError(PARSE_ERROR, f"Parse error: {exc}", status=400) from exc
    if isinstance(data, list):
        raise _invalid("Invalid Request: JSON-RPC batches are not supported; send one message")
    if not isinstance(data, dict):
        raise _invalid("Invalid Request: the body must be one JSON-RPC message (a JSON object)")
    if data.get("jsonrpc") != "2.0":
        raise _invalid('Invalid Request: jsonrpc: must be "2.0"')
    if "id" in data and "method" in data and not _valid_id(data["id"]):
        raise _invalid("Invalid Request: id: must be a string or an integer")
    try:
        message = jsonrpc_message_adapter.validate_python(data, by_name=False)
    except ValidationError as exc:
        raise _invalid(f"Invalid Request: {_first_error(exc)}") from exc
    if isinstance(message, JSONRPCRequest):
        return Incoming("request", message)
    if isinstance(message, JSONRPCNotification):
        return Incoming("notification", message)
    return Incoming("response", message)


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _first_error(exc: ValidationError, skip: tuple[str, ...] = ()) -> str:
    """`field: message` of the first pydantic error (the field as the wire spells it)."""
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if str(p) not in skip]
    where = ".".join(loc)
    return f"{where}: {err.get('msg', 'invalid value')}" if where else str(err.get("msg"))


def negotiate(requested: str) -> str:
    """The protocol version of a new session: the client's when this server speaks it
    (every revision with the `initialize` handshake), else the newest of those."""
    return requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION


def known_version(version: str) -> bool:
    """Whether `version` is a revision this server speaks (the `MCP-Protocol-Version` rule)."""
    return version in HANDSHAKE_PROTOCOL_VERSIONS


def parse_request(message: JSONRPCRequest, version: str) -> types.Request[Any, Any]:
    """The request as its `mcp.types` model, validated for `version`; -32601 for a method
    this server does not serve, -32602 naming the field for invalid params."""
    if message.method not in SERVED_METHODS:
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {message.method[:200]}")
    try:
        return methods.parse_client_request(message.method, version, message.params)
    except KeyError:
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {message.method}") from None
    except ValidationError as exc:
        detail = _first_error(exc, skip=("params",))
        raise RpcError(INVALID_PARAMS, f"Invalid params: {detail}") from exc


def parse_notification(
    message: JSONRPCNotification, version: str
) -> types.Notification[Any, Any] | None:
    """The notification as its model, or None for one this server ignores (unknown, or
    invalid: a notification gets no answer, not even an error)."""
    try:
        return methods.parse_client_notification(message.method, version, message.params)
    except (KeyError, ValidationError):
        return None


def result_message(
    request_id: RequestId, method: str, version: str, result: types.Result
) -> dict[str, Any]:
    """The response to a request: `result` shaped for `version` (fields a revision does not
    know are dropped by the package's per-version model)."""
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    shaped = methods.serialize_server_result(method, version, dumped)
    return JSONRPCResponse(jsonrpc="2.0", id=request_id, result=shaped).model_dump(
        by_alias=True, mode="json"
    )


def error_message(request_id: RequestId | None, err: RpcError) -> dict[str, Any]:
    """The JSON-RPC error object answering `request_id` (null when it could not be read)."""
    error = ErrorData(code=err.code, message=err.message, data=err.data)
    out = JSONRPCError(jsonrpc="2.0", id=request_id, error=error).model_dump(
        by_alias=True, mode="json"
    )
    if err.data is None:
        out["error"].pop("data", None)
    return out


def notification_message(notification: types.Notification[Any, Any]) -> dict[str, Any]:
    """A server notification (`notifications/progress`) on the wire."""
    params = notification.params
    dumped = (
        params.model_dump(by_alias=True, mode="json", exclude_none=True)
        if isinstance(params, BaseModel)
        else params
    )
    return JSONRPCNotification(jsonrpc="2.0", method=notification.method, params=dumped).model_dump(
        by_alias=True, mode="json", exclude_none=True
    )


def progress(token: types.ProgressToken, count: int, text: str | None) -> dict[str, Any]:
    """`notifications/progress` for `token`: `count` events so far (no total: a run's length
    is not known ahead), `text` saying what the last one was."""
    return notification_message(
        types.ProgressNotification(
            params=types.ProgressNotificationParams(
                progress_token=token, progress=float(count), message=text
            )
        )
    )


def sse_frame(message: dict[str, Any]) -> bytes:
    """One SSE `message` event carrying a JSON-RPC message."""
    return b"event: message\ndata: " + serde.dumps(message) + b"\n\n"
