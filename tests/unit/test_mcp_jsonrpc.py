"""The MCP front end's JSON-RPC layer (app/protocols/mcp/jsonrpc.py), pure: what a POST body
is, which errors it answers with which code and HTTP status, and the shapes it sends, in the
`mcp` package's own types."""

from __future__ import annotations

from typing import Any

import mcp.types as types
import pytest
from mcp.types.jsonrpc import JSONRPCRequest, jsonrpc_message_adapter

from app.protocols.mcp import jsonrpc
from app.protocols.mcp.jsonrpc import RpcError
from shared import serde


def _error(raw: bytes) -> RpcError:
    with pytest.raises(RpcError) as caught:
        jsonrpc.parse_body(raw)
    return caught.value


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{", -32700),
        (b"", -32700),
        (b"[]", -32600),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', -32600),
        (b'"ping"', -32600),
        (b'{"id": 1, "method": "ping"}', -32600),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', -32600),
        (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', -32600),
    ],
)
def test_a_body_that_is_not_one_message_is_a_400(raw: bytes, code: int) -> None:
    """Not JSON: -32700; not one JSON-RPC 2.0 message (a batch, no version, a bad id): -32600;
    both at HTTP 400, the transport's answer."""
    err = _error(raw)
    assert (err.code, err.status) == (code, 400)


def test_messages_are_classified() -> None:
    """A request has an id and a method; a notification only a method; a response a result."""
    kinds = [
        jsonrpc.parse_body(serde.dumps(m)).kind
        for m in (
            {"jsonrpc": "2.0", "id": "a", "method": "ping"},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 1, "result": {}},
            {"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "m"}},
        )
    ]
    assert kinds == ["request", "notification", "response", "response"]


def _request(method: str, params: dict[str, Any] | None = None) -> JSONRPCRequest:
    return JSONRPCRequest(jsonrpc="2.0", id=1, method=method, params=params)


def test_unknown_and_unserved_methods_are_method_not_found() -> None:
    """A method MCP lacks, or one this server offers no capability for: -32601 at 200."""
    for method in ("tools/frobnicate", "resources/list", "prompts/list", "server/discover"):
        with pytest.raises(RpcError) as caught:
            jsonrpc.parse_request(_request(method), "2025-11-25")
        assert (caught.value.code, caught.value.status) == (-32601, 200)
        assert method in caught.value.message


def test_invalid_params_name_the_field() -> None:
    """tools/call without its name: -32602 naming `name`."""
    with pytest.raises(RpcError) as caught:
        jsonrpc.parse_request(_request("tools/call", {"arguments": {}}), "2025-11-25")
    assert caught.value.code == -32602
    assert caught.value.message == "Invalid params: name: Field required"


def test_requests_parse_into_the_package_models() -> None:
    """tools/call with a progress token and a thread in `_meta`."""
    params = {"name": "t", "arguments": {"a": 1}, "_meta": {"progressToken": 3, "thread_id": "x"}}
    parsed = jsonrpc.parse_request(_request("tools/call", params), "2025-06-18")
    assert isinstance(parsed, types.CallToolRequest)
    assert parsed.params.meta == {"progress_token": 3, "thread_id": "x"}


def test_version_negotiation() -> None:
    """The client's handshake revision when known, else the newest one."""
    assert jsonrpc.negotiate("2025-03-26") == "2025-03-26"
    assert jsonrpc.negotiate("2026-07-28") == "2025-11-25"  # no initialize in that revision
    assert jsonrpc.negotiate("1999-01-01") == "2025-11-25"


def test_results_are_shaped_for_the_version() -> None:
    """A tools/list result drops the 2026 cache fields on a 2025 session; the envelope is
    one the package's client reads back."""
    listed = types.ListToolsResult(tools=[types.Tool(name="a", input_schema={"type": "object"})])
    out = jsonrpc.result_message(9, "tools/list", "2025-11-25", listed)
    assert out == {
        "jsonrpc": "2.0",
        "id": 9,
        "result": {"tools": [listed.tools[0].model_dump(by_alias=True, exclude_none=True)]},
    }
    assert jsonrpc_message_adapter.validate_python(out).id == 9  # type: ignore[union-attr]


def test_errors_and_progress_on_the_wire() -> None:
    """An error object (null id when unknown) and a progress notification."""
    err = jsonrpc.error_message(None, RpcError(-32700, "Parse error"))
    assert err == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "Parse error"},
    }
    note = jsonrpc.progress("tok", 3, "ran agent")
    assert note == {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": "tok", "progress": 3.0, "message": "ran agent"},
    }
    frame = jsonrpc.sse_frame(note)
    assert frame.startswith(b"event: message\ndata: {") and frame.endswith(b"\n\n")
