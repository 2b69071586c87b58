"""JSON-RPC 2.0 dispatch of A2A: the envelope and params validated (wire.py), each method
to its handler, every refusal an A2A error object (HTTP 200, as JSON-RPC answers).

A handler answers a result (one JSON body), or an iterator of `stream.Out` (an SSE body of
JSON-RPC responses). Refusals the REST API answers with an HTTP status of its own keep it
here too: 401/403 (authentication, the project's handlers), 429 and 422 of the per-user
limits, 415 for a body declared as something other than JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from flask import request
from pydantic import BaseModel, ValidationError

from app.errors import LimitExceeded
from app.protocols.a2a import mapping, stream, tasks
from app.protocols.a2a.mapping import StreamTranslator, TaskView
from app.protocols.a2a.wire import (
    METHODS,
    NOT_SUPPORTED,
    PARAMS,
    Code,
    Kind,
    Method,
    RpcError,
    RpcRequest,
    SendParams,
    TaskParams,
)
from app.services import current_services
from shared import serde
from shared.assistants.model import Assistant
from shared.errors import Conflict, NotFound, StreamCursorInvalid, ThreadrunError, ValidationFailed

RequestId = str | int | None


@dataclass(frozen=True, slots=True)
class Call:
    """One validated call: its id, method and params, and the assistant of the URL."""

    id: RequestId
    method: Method
    params: BaseModel
    assistant: Assistant

    def result(self, value: dict[str, Any]) -> dict[str, Any]:
        """A response carrying `value` (in 0.3's shape for a 0.3 method)."""
        return {
            "jsonrpc": "2.0",
            "id": self.id,
            "result": mapping.legacy(value) if self.method.legacy else value,
        }


Answer = dict[str, Any] | Iterator[bytes]
"""A JSON-RPC response object, or the bytes of a body that streams."""


def error(request_id: RequestId, exc: RpcError) -> dict[str, Any]:
    """A JSON-RPC error response."""
    return {"jsonrpc": "2.0", "id": request_id, "error": exc.payload()}


def _field(exc: ValidationError, prefix: str) -> tuple[str, str]:
    """(the first error's field path, a message naming every error's field)."""
    errors = exc.errors()
    paths = [
        ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in e["loc"]) for e in errors
    ]
    paths = [f"{prefix}.{p}".replace(".[", "[") if p else prefix for p in paths]
    text = "; ".join(f"{p}: {e['msg']}" for p, e in zip(paths, errors, strict=True))
    return paths[0], text


def parse(raw: bytes, assistant_id: str) -> Call:
    """The call a body makes; `Refused` (with the request's id once it is known) otherwise."""
    try:
        doc = serde.loads(raw)
    except ValueError as exc:
        raise Refused(
            None, RpcError(Code.PARSE_ERROR, f"the body is not valid JSON: {exc}")
        ) from exc
    if not isinstance(doc, dict):
        raise Refused(None, RpcError(Code.INVALID_REQUEST, "a JSON-RPC request must be an object"))
    request_id = (
        doc.get("id")
        if isinstance(doc.get("id"), str | int) and not isinstance(doc.get("id"), bool)
        else None
    )
    try:
        envelope = RpcRequest.model_validate(doc)
    except ValidationError as exc:
        field, text = _field(exc, "request")
        raise Refused(
            request_id,
            RpcError(Code.INVALID_REQUEST, f"invalid JSON-RPC request: {text}", field=field),
        ) from exc
    method = METHODS.get(envelope.method)
    if method is None:
        if envelope.method in NOT_SUPPORTED:
            raise Refused(
                request_id,
                RpcError(
                    Code.UNSUPPORTED_OPERATION,
                    f"{envelope.method} is not supported by this server",
                    field="method",
                ),
            )
        raise Refused(
            request_id,
            RpcError(
                Code.METHOD_NOT_FOUND, f"method not found: {envelope.method[:128]}", field="method"
            ),
        )
    try:
        params = PARAMS[method.kind].model_validate(envelope.params)
    except ValidationError as exc:
        field, text = _field(exc, "params")
        raise Refused(
            request_id, RpcError(Code.INVALID_PARAMS, f"invalid params: {text}", field=field)
        ) from exc
    try:
        assistant = tasks.agent(assistant_id)
    except RpcError as exc:
        raise Refused(request_id, exc) from exc
    return Call(request_id, method, params, assistant)


class Refused(ThreadrunError):
    """A call refused before its handler ran: its id and the error."""

    def __init__(self, request_id: RequestId, rpc: RpcError) -> None:
        super().__init__(rpc.message)
        self.request_id = request_id
        self.rpc = rpc


def handle(call: Call) -> Answer:
    """Run the call's handler; a refusal in it becomes the call's error response."""
    try:
        return HANDLERS[call.method.kind](call)
    except RpcError as exc:
        return error(call.id, exc)
    except LimitExceeded:
        raise  # 429 / 422 with its headers, as on the REST API
    except ValidationFailed as exc:
        return error(call.id, RpcError(Code.INVALID_PARAMS, str(exc), field=exc.field))
    except Conflict as exc:
        return error(call.id, RpcError(Code.UNSUPPORTED_OPERATION, str(exc)))
    except NotFound as exc:
        return error(call.id, RpcError(Code.INVALID_PARAMS, str(exc)))


def _send(call: Call) -> Answer:
    params = call.params
    assert isinstance(params, SendParams)
    admitted = tasks.send(params, call.assistant)
    history = params.configuration.history_length if params.configuration else None
    if params.immediate:
        return call.result({"task": mapping.task(tasks.submitted(admitted), history)})
    keepalive = current_services().settings.wait_keepalive_s
    views: list[TaskView] = []

    def final() -> TaskView:
        views.append(tasks.view(tasks.found_after(admitted, call.assistant)))
        return views[-1]

    translator = StreamTranslator(admitted.task_id, admitted.context_id)
    outs = stream.follow(admitted.run.run_id, translator, final, admitted=True)

    def body() -> Iterator[bytes]:
        try:
            yield from stream.waited(outs, keepalive)
            yield serde.dumps(call.result({"task": mapping.task(views[-1], history)}))
        except RpcError as exc:
            yield serde.dumps(error(call.id, exc))

    return body()


def _stream(call: Call) -> Answer:
    params = call.params
    assert isinstance(params, SendParams)
    admitted = tasks.send(params, call.assistant)
    first = mapping.task(tasks.submitted(admitted))
    translator = StreamTranslator(admitted.task_id, admitted.context_id)

    def final() -> TaskView:
        return tasks.view(tasks.found_after(admitted, call.assistant))

    outs = stream.follow(admitted.run.run_id, translator, final, admitted=True)
    return sse(call, first, outs)


def _get(call: Call) -> Answer:
    params = call.params
    assert isinstance(params, TaskParams)
    found = tasks.find(params.id, call.assistant)
    return call.result(mapping.task(tasks.view(found), params.history_length))


def _cancel(call: Call) -> Answer:
    params = call.params
    assert isinstance(params, TaskParams)
    found = tasks.find(params.id, call.assistant)
    tasks.cancel(found)
    return call.result(mapping.task(tasks.view(tasks.find(params.id, call.assistant))))


def _subscribe(call: Call) -> Answer:
    """Follow a task that is still going; `Last-Event-ID` resumes exactly after that event
    (also once the task has ended, while its run's stream is retained)."""
    params = call.params
    assert isinstance(params, TaskParams)
    found = tasks.find(params.id, call.assistant)
    now = tasks.view(found)
    last = request.headers.get("Last-Event-ID")
    if now.state in mapping.FINAL_STATES and not last:
        raise RpcError(
            Code.UNSUPPORTED_OPERATION,
            f"task {found.task_id} is {mapping.state_name(now.state)}: there is nothing to follow",
            field="id",
        )
    run_id = found.latest.run_id
    try:
        cursor = current_services().subscriber.check_cursor(run_id, last)
    except StreamCursorInvalid as exc:
        raise RpcError(Code.INVALID_PARAMS, str(exc), field="Last-Event-ID") from exc
    resumed = bool(last)
    translator = StreamTranslator(found.task_id, found.context_id, resumed, started=resumed)

    def final() -> TaskView:
        return tasks.view(tasks.find(params.id, call.assistant))

    return sse(call, mapping.task(now), stream.follow(run_id, translator, final, cursor=cursor))


HANDLERS: dict[Kind, Callable[[Call], Answer]] = {
    Kind.SEND: _send,
    Kind.STREAM: _stream,
    Kind.GET: _get,
    Kind.CANCEL: _cancel,
    Kind.SUBSCRIBE: _subscribe,
}

HEARTBEAT = b": heartbeat\n\n"


def sse(call: Call, first: dict[str, Any], outs: Iterator[stream.Out]) -> Iterator[bytes]:
    """The SSE body: the task as it is, then each answer as a JSON-RPC response (its run
    event's id as the SSE id); a failure after the first byte is the call's error."""

    def message(result: dict[str, Any], event_id: str | None) -> bytes:
        head = f"id: {event_id}\n".encode() if event_id else b""
        return head + b"data: " + serde.dumps(call.result(result)) + b"\n\n"

    yield message({"task": first}, None)
    try:
        for out in outs:
            yield HEARTBEAT if out.result is None else message(out.result, out.event_id)
    except (RpcError, ThreadrunError) as exc:
        rpc = exc if isinstance(exc, RpcError) else RpcError(Code.INTERNAL_ERROR, str(exc))
        yield b"event: error\ndata: " + serde.dumps(error(call.id, rpc)) + b"\n\n"
