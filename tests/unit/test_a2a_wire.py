"""app/protocols/a2a/wire.py and dispatch.parse: what a request may be, and the JSON-RPC
error (code and field) of each thing it must not be. What the SDK sends validates."""

from __future__ import annotations

from typing import Any

import pytest
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest
from google.protobuf import json_format
from pydantic import ValidationError

from app.protocols.a2a import dispatch
from app.protocols.a2a.wire import METHODS, Code, Kind, RpcError, SendParams, TaskParams
from shared import serde


def test_what_the_sdk_sends_validates() -> None:
    """the 1.x client's SendMessageRequest, as its transport writes it (MessageToDict)."""
    request = SendMessageRequest(
        message=Message(message_id="m", role=Role.ROLE_USER, parts=[Part(text="hi")])
    )
    request.configuration.return_immediately = True
    params = SendParams.model_validate(json_format.MessageToDict(request))
    assert params.message.role == "user" and params.message.parts[0].content == "text"
    assert params.immediate and params.message.context_id is None


def test_legacy_send_validates() -> None:
    """0.3's message with `kind`ed parts; `blocking: false` answers at once."""
    params = SendParams.model_validate(
        {
            "message": {
                "kind": "message",
                "messageId": "m",
                "role": "user",
                "parts": [{"kind": "text", "text": "a"}, {"kind": "data", "data": {"x": 1}}],
            },
            "configuration": {"blocking": False},
        }
    )
    assert [p.content for p in params.message.parts] == ["text", "data"]
    assert params.immediate


@pytest.mark.parametrize(
    ("message", "where"),
    [
        ({"role": "ROLE_USER", "parts": [{"text": "a"}]}, ("message", "messageId")),
        ({"messageId": "m", "role": "ROLE_USER", "parts": []}, ("message", "parts")),
        ({"messageId": "m", "role": "robot", "parts": [{"text": "a"}]}, ("message", "role")),
        ({"messageId": "m", "role": "user", "parts": [{}]}, ("message", "parts", 0)),
        (
            {"messageId": "m", "role": "user", "parts": [{"text": "a", "data": 1}]},
            ("message", "parts", 0),
        ),
    ],
)
def test_bad_messages_name_the_field(message: dict[str, Any], where: tuple[Any, ...]) -> None:
    """each refusal names where it is (the error's loc, camelCase as sent)."""
    with pytest.raises(ValidationError) as caught:
        SendParams.model_validate({"message": message})
    assert caught.value.errors()[0]["loc"][: len(where)] == where


def test_task_params() -> None:
    assert TaskParams.model_validate({"id": "c:r", "historyLength": 2}).history_length == 2
    with pytest.raises(ValidationError):
        TaskParams.model_validate({"id": ""})


def test_method_table() -> None:
    """1.0's names and 0.3's slash names; only the stream methods answer SSE."""
    assert METHODS["SendMessage"].kind is METHODS["message/send"].kind is Kind.SEND
    assert METHODS["message/send"].legacy and not METHODS["SendMessage"].legacy
    assert {m for m, v in METHODS.items() if v.streams} == {
        "SendStreamingMessage",
        "SubscribeToTask",
        "message/stream",
        "tasks/resubscribe",
    }


def refused(raw: bytes) -> dispatch.Refused:
    with pytest.raises(dispatch.Refused) as caught:
        dispatch.parse(raw, "lead_agent")
    return caught.value


@pytest.mark.parametrize(
    ("raw", "code", "field"),
    [
        (b"{nope", Code.PARSE_ERROR, None),
        (b"[1, 2]", Code.INVALID_REQUEST, None),
        (
            b'{"jsonrpc": "1.0", "id": 1, "method": "GetTask"}',
            Code.INVALID_REQUEST,
            "request.jsonrpc",
        ),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', Code.INVALID_REQUEST, "request.method"),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "Nope"}', Code.METHOD_NOT_FOUND, "method"),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ListTasks"}',
            Code.UNSUPPORTED_OPERATION,
            "method",
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {}}',
            Code.INVALID_PARAMS,
            "params.id",
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {}}}',
            Code.INVALID_PARAMS,
            "params.message.messageId",
        ),
    ],
)
def test_parse_refusals(raw: bytes, code: Code, field: str | None) -> None:
    """each malformed call is refused before any IO, with its code and field."""
    got = refused(raw)
    assert got.rpc.code is code and got.rpc.field == field


def test_refusal_keeps_the_request_id() -> None:
    """the id is echoed once it can be read (null for a parse error)."""
    assert refused(b'{"jsonrpc": "2.0", "id": "x", "method": "Nope"}').request_id == "x"
    assert refused(b'{"jsonrpc": "2.0", "id": true, "method": "Nope"}').request_id is None
    assert refused(b"{").request_id is None


def test_error_payload_is_what_the_sdk_reads() -> None:
    """code, message, and the google.rpc.ErrorInfo detail naming the field."""
    body = dispatch.error(4, RpcError(Code.TASK_NOT_FOUND, "gone", field="id"))
    assert serde.loads(serde.dumps(body)) == {
        "jsonrpc": "2.0",
        "id": 4,
        "error": {
            "code": -32001,
            "message": "gone",
            "data": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "TASK_NOT_FOUND",
                    "domain": "a2a-protocol.org",
                    "metadata": {"field": "id"},
                }
            ],
        },
    }
