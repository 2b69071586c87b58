"""MCP at /mcp end to end, driven by clients nobody here wrote: the `mcp`
package's Streamable HTTP client and `ClientSession`, against
real web and worker processes (A1 runs and results, A3 limits, A4 isolation, R5 cancel).

The transport's rules (sessions, protocol-version header, 4xx answers, JSON-RPC error
codes) are checked with plain httpx where a client would hide them.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
import httpx
import httpx2
import mcp.types as types
import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import NotFoundError
from langgraph_sdk.schema import Config
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import RequestParamsMeta

from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ALICE, BOB, GRAPHS, ClusterFactory
from tests.e2e.conftest import run_sdk as sdk

pytestmark = pytest.mark.e2e

VERSION = "2025-11-25"
JSON_AND_SSE = {"Accept": "application/json, text/event-stream"}
SLOW: Config = {"configurable": {"tokens": 400, "token_delay_ms": 25}}
"""A run of ~10 s: long enough to be cancelled while it streams."""


@pytest.fixture(scope="module")
def url(graphs_cluster: Cluster) -> str:
    return f"{graphs_cluster.url}/mcp"


@pytest.fixture(scope="module")
def names(graphs_cluster: Cluster) -> dict[str, str]:
    """Alice's slow assistant and Bob's private one, by their tool names."""
    tag = uuid.uuid4().hex[:8]

    async def make(c: LangGraphClient, name: str, config: Config) -> None:
        await c.assistants.create("lead_agent", name=name, config=config)

    alice, bob = f"Alice slow {tag}", f"Bob private {tag}"
    sdk(lambda c: make(c, alice, SLOW), graphs_cluster.url, ALICE)
    sdk(lambda c: make(c, bob, {}), graphs_cluster.url, BOB)
    return {"alice": f"Alice_slow_{tag}", "bob": f"Bob_private_{tag}"}


@asynccontextmanager
async def mcp_session(url: str, key: str = ALICE) -> AsyncIterator[ClientSession]:
    """An initialized `ClientSession` of the `mcp` package over its Streamable HTTP client."""
    timeout = httpx2.Timeout(30, read=60)
    async with (
        httpx2.AsyncClient(headers={"x-api-key": key}, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(scenario())  # type: ignore[arg-type]


def rpc(
    url: str,
    body: Any,
    *,
    key: str = ALICE,
    session: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """One raw POST /mcp."""
    sent = {"x-api-key": key, **JSON_AND_SSE, **(headers or {})}
    if session is not None:
        sent["Mcp-Session-Id"] = session
    if isinstance(body, bytes):
        return httpx.post(url, content=body, headers={**sent, "content-type": "application/json"})
    return httpx.post(url, json=body, headers=sent, timeout=60)


def initialize(url: str, key: str = ALICE) -> str:
    """A new session's id (raw)."""
    res = rpc(
        url,
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": VERSION,
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"},
            },
        },
        key=key,
    )
    assert res.status_code == 200, res.text
    return res.headers["Mcp-Session-Id"]


def test_initialize_and_list_tools(url: str, names: dict[str, str]) -> None:
    """initialize answers serverInfo and the tools capability; tools/list has one tool per
    assistant Alice may see: hers and each graph's system one, never Bob's (A4)."""

    async def scenario() -> tuple[types.InitializeResult | None, types.ListToolsResult]:
        async with mcp_session(url) as s:
            return s.initialize_result, await s.list_tools()

    init, listed = run(scenario)
    assert init is not None and init.server_info.name == "threadrun"
    assert init.protocol_version == VERSION
    assert init.capabilities.tools is not None
    tools = {t.name: t for t in listed.tools}
    assert {"lead_agent", "approval", names["alice"]} <= set(tools)
    assert names["bob"] not in tools
    schema = tools[names["alice"]].input_schema
    assert schema["type"] == "object"
    assert schema["properties"]["messages"]["type"] == "string"  # a message, for a model


def test_call_tool_answers_the_agent(url: str) -> None:
    """tools/call runs the assistant without a thread and answers the text of its last AI
    message, with the output values as structuredContent (A1)."""

    async def scenario() -> types.CallToolResult:
        async with mcp_session(url) as s:
            return await s.call_tool("lead_agent", {"messages": "hello over MCP"})

    result = run(scenario)
    assert not result.is_error, result
    text = result.content[0]
    assert isinstance(text, types.TextContent) and text.text
    assert isinstance(result.structured_content, dict)
    messages = result.structured_content["messages"]
    assert messages[0]["content"] == "hello over MCP"
    assert messages[-1]["type"] == "ai" and messages[-1]["content"] == text.text


def test_progress_notifications(url: str, names: dict[str, str]) -> None:
    """A call with a progressToken is answered as SSE: progress notifications while the
    run streams, then the result."""
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    async def scenario() -> types.CallToolResult:
        async with mcp_session(url) as s:
            return await s.call_tool(
                "lead_agent",
                {"messages": "stream to me"},
                progress_callback=on_progress,
            )

    result = run(scenario)
    assert not result.is_error
    assert len(seen) >= 2
    counts = [p for p, _ in seen]
    assert counts == sorted(counts) and counts[0] >= 1


def ended_statuses(base: str, thread_id: str) -> list[str] | None:
    """The thread's run statuses once its newest run is no longer running (else None)."""
    statuses = run_statuses(base, thread_id)
    return statuses if statuses and statuses[0] != "running" else None


def run_statuses(base: str, thread_id: str) -> list[str]:
    async def go(c: LangGraphClient) -> list[str]:
        return [r["status"] for r in await c.runs.list(thread_id)]

    result: list[str] = sdk(go, base)
    return result


def test_cancellation_ends_the_run(
    url: str, graphs_cluster: Cluster, names: dict[str, str]
) -> None:
    """Cancelling a call (the client sends notifications/cancelled) interrupts its run, as
    the REST API shows afterwards (R5); the call ran on the thread named in `_meta`."""
    thread_id = str(uuid.uuid4())
    started = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        started.set()

    def ended() -> list[str]:
        return wait_for(
            lambda: ended_statuses(graphs_cluster.url, thread_id),
            timeout=30,
            what="the cancelled run to end",
        )

    async def scenario() -> list[str]:
        async with mcp_session(url) as s:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    await s.call_tool(
                        names["alice"],
                        {"messages": "a long answer please"},
                        progress_callback=on_progress,
                        meta=cast(RequestParamsMeta, {"thread_id": thread_id}),
                    )

                tg.start_soon(call)
                await started.wait()
                tg.cancel_scope.cancel()  # the call only: the session stays open meanwhile
            return await anyio.to_thread.run_sync(ended)

    statuses = run(scenario)
    assert statuses == ["interrupted"]


def test_session_of_another_key_is_refused(url: str) -> None:
    """A session id used with another user's key is not found (404, A4); DELETE ends a
    session, after which its id is not found either."""
    sid = initialize(url)
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    assert rpc(url, listing, session=sid).status_code == 200
    refused = rpc(url, listing, key=BOB, session=sid)
    assert refused.status_code == 404
    assert refused.json()["error"]["message"] == "Session not found"
    headers = {"x-api-key": BOB, "Mcp-Session-Id": sid}
    assert httpx.delete(url, headers=headers).status_code == 404
    headers["x-api-key"] = ALICE
    assert httpx.delete(url, headers=headers).status_code == 204
    assert rpc(url, listing, session=sid).status_code == 404


def test_a_session_is_served_by_any_web_process(private_cluster: ClusterFactory) -> None:
    """A session made on one web process serves on another, and a notifications/cancelled
    sent to the second ends the call waiting on the first."""
    with private_cluster("mcp-two-webs", {"THREADRUN_CONFIG": str(GRAPHS)}) as c:
        c.start(webs=2)
        first, second = (f"{u}/mcp" for u in c.urls)
        sid = initialize(first)
        listed = rpc(second, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, session=sid)
        assert listed.status_code == 200
        assert "lead_agent" in {t["name"] for t in listed.json()["result"]["tools"]}

        thread_id = str(uuid.uuid4())
        call = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {
                "name": "lead_agent",
                "arguments": {"messages": "hi"},
                "_meta": {"thread_id": thread_id, "progressToken": "p"},
            },
        }
        # The slow knobs come from an assistant of Alice's: create one on this cluster.
        sdk(lambda cl: cl.assistants.create("lead_agent", name="slow", config=SLOW), c.url)
        call["params"]["name"] = "slow"  # type: ignore[index]
        answered: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: answered.append(rpc(first, call, session=sid)))
        waiter.start()
        wait_for(
            lambda: run_statuses(c.url, thread_id) == ["running"],
            timeout=30,
            what="the call's run to start",
            retry_on=(NotFoundError,),  # its thread is made by the run
        )
        cancel = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": 7, "reason": "test"},
        }
        assert rpc(second, cancel, session=sid).status_code == 202
        waiter.join(timeout=60)
        assert not waiter.is_alive()
        statuses = wait_for(
            lambda: ended_statuses(c.url, thread_id),
            timeout=30,
            what="the cancelled run to end",
        )
        assert statuses == ["interrupted"]
        assert answered and "the run ended interrupted" in answered[0].text


# --- bad input ----------------------------------------------------------------------------


def test_malformed_json_is_a_parse_error(url: str) -> None:
    """A body that is not JSON: 400 with JSON-RPC -32700."""
    res = rpc(url, b'{"jsonrpc": "2.0", "id": 1, "method": ')
    assert res.status_code == 400
    assert res.json()["error"]["code"] == -32700 and res.json()["id"] is None


def test_not_a_message_is_an_invalid_request(url: str) -> None:
    """A batch, or a message without `jsonrpc: "2.0"`: 400 with -32600."""
    sid = initialize(url)
    for body in ([{"jsonrpc": "2.0", "id": 1, "method": "ping"}], {"id": 1, "method": "ping"}):
        res = rpc(url, body, session=sid)
        assert res.status_code == 400
        assert res.json()["error"]["code"] == -32600


def test_unknown_method(url: str) -> None:
    """An unknown method: -32601 naming it."""
    sid = initialize(url)
    res = rpc(url, {"jsonrpc": "2.0", "id": 3, "method": "tools/frobnicate"}, session=sid)
    assert res.status_code == 200
    err = res.json()["error"]
    assert err["code"] == -32601 and "tools/frobnicate" in err["message"]
    assert res.json()["id"] == 3


def test_invalid_params_name_the_field(url: str) -> None:
    """tools/call without a name: -32602 naming `name`; a thread id that is no UUID too."""
    sid = initialize(url)
    res = rpc(url, {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {}}, session=sid)
    err = res.json()["error"]
    assert err["code"] == -32602 and "name" in err["message"], err
    bad_thread = {
        "jsonrpc": "2.0",
        "id": 5,
        "method": "tools/call",
        "params": {"name": "lead_agent", "arguments": {}, "_meta": {"thread_id": "nope"}},
    }
    err = rpc(url, bad_thread, session=sid).json()["error"]
    assert err["code"] == -32602, err


def test_unknown_tool(url: str, names: dict[str, str]) -> None:
    """A tool the caller has not (Bob's assistant for Alice): -32602 Unknown tool."""
    sid = initialize(url)
    for name in ("no_such_tool", names["bob"]):
        body = {"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": name}}
        err = rpc(url, body, session=sid).json()["error"]
        assert err["code"] == -32602 and err["message"] == f"Unknown tool: {name}"


def test_transport_rules(url: str) -> None:
    """No session header: 400; an unknown protocol version: 400; GET: 405; no key: 401;
    a body that is not JSON by its type: 415."""
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert rpc(url, ping).status_code == 400
    sid = initialize(url)
    assert rpc(url, ping, session=sid).json()["result"] == {}
    wrong = rpc(url, ping, session=sid, headers={"MCP-Protocol-Version": "1999-01-01"})
    assert wrong.status_code == 400
    got = httpx.get(url, headers={"x-api-key": ALICE, "Accept": "text/event-stream"})
    assert got.status_code == 405
    assert httpx.post(url, json=ping).status_code == 401
    typed = httpx.post(
        url,
        content=b"{}",
        headers={"x-api-key": ALICE, "content-type": "text/plain", "Mcp-Session-Id": sid},
    )
    assert typed.status_code == 415
