"""LangChain's thread streaming protocol end to end (app/protocols/thread_stream/), driven by
the official SDK's `client.threads.stream` (async and sync, over SSE and the WebSocket) and by
raw HTTP where a test must drop a connection at a chosen event: a run's messages, values and
output; an interrupt answered with `input.respond`; a reconnect after any seq resumes exactly
(B4: no duplicate, no loss, across runs); a cursor whose events are gone gets the protocol's
`resume_gap` error, never silence (B5); the state commands; bad input and another user's
thread refused (A4)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import simple_websocket
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import LangGraphClient

from shared.redis_keys import Keys
from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, BOB, ClusterFactory, human
from tests.e2e.conftest import run_sdk as run

pytestmark = pytest.mark.e2e

AUTH = {"x-api-key": ALICE}
"""The SDK's WebSocket handshake sends only the stream's own headers, not the client's."""


def knobs(tokens: int, delay_ms: float = 0) -> dict[str, Any]:
    return {"configurable": {"tokens": tokens, "token_delay_ms": delay_ms}}


def ai_text(values: dict[str, Any]) -> str:
    """The text of the last AI message of a state."""
    last = [m for m in values["messages"] if m["type"] == "ai"][-1]
    content = last["content"]
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content)


# --- the SDK ----------------------------------------------------------------------------------
@pytest.mark.parametrize("transport", ["sse", "websocket"])
def test_the_async_sdk_streams_a_run(graphs_cluster: Cluster, transport: str) -> None:
    """`threads.stream`: `run.start` on a new thread, the answer's text through
    `thread.messages` (LangGraph's content-block events), the final state as `output`.

    (One projection per run: a projection opened after the run ended waits for the next
    run, as the SDK's projections do on any server.)"""

    async def go(c: LangGraphClient) -> tuple[list[str], Any]:
        async with c.threads.stream(
            assistant_id="lead_agent",
            transport=transport,  # type: ignore[arg-type]
            headers=AUTH,
        ) as thread:
            await thread.run.start(input=human("hello"), config=knobs(5, 20))
            streams = [stream async for stream in thread.messages]
            texts = [await s.text for s in streams]  # each ended with its message-finish
            return texts, await thread.output

    texts, output = run(go, graphs_cluster.url)
    assert texts == [ai_text(output)]
    assert len(texts[0].split()) == 5  # the five tokens asked for


@pytest.mark.parametrize("transport", ["sse", "websocket"])
def test_the_sync_sdk_answers_an_interrupt(graphs_cluster: Cluster, transport: str) -> None:
    """The sync client: the `approval` graph's interrupt arrives as `input.requested`
    (`thread.interrupts`), `run.respond` answers it with `input.respond`, and the resumed
    run's output says what was approved."""
    client = get_sync_client(url=graphs_cluster.url, api_key=ALICE)
    try:
        with client.threads.stream(
            assistant_id="approval",
            headers=AUTH,
            transport=transport,  # type: ignore[arg-type]
        ) as thread:
            thread.run.start(input=human("may I?"))
            for _ in thread.values:
                pass  # ends when the run pauses
            assert thread.interrupted
            (pending,) = thread.interrupts
            assert pending["value"] == {"question": "approve?"} and pending["namespace"] == []
            thread.run.respond("yes")
            output = thread.output
    finally:
        client.http.client.close()
    assert ai_text(output) == "approved: yes"


def test_the_websocket_answers_an_interrupt(graphs_cluster: Cluster) -> None:
    """The same over the WebSocket transport (async), and `agent.getTree` and state reads
    on the thread afterwards."""

    async def go(c: LangGraphClient) -> tuple[Any, Any]:
        async with c.threads.stream(
            assistant_id="approval", transport="websocket", headers=AUTH
        ) as thread:
            await thread.run.start(input=human("may I?"))
            async for _ in thread.values:
                pass
            assert thread.interrupted and thread.interrupts[0]["value"] == {"question": "approve?"}
            await thread.run.respond("granted")
            return await thread.output, thread.thread_id

    output, thread_id = run(go, graphs_cluster.url)
    assert ai_text(output) == "approved: granted"
    with httpx.Client(base_url=graphs_cluster.url, headers=AUTH, timeout=10) as c:
        tree = command(c, thread_id, "agent.getTree", {})["result"]["tree"]
        assert (tree["namespace"], tree["status"], tree["graph_name"]) == (
            [],
            "completed",
            "approval",
        )


# --- raw HTTP: exact resume, gaps ------------------------------------------------------------
def chat(
    c: httpx.Client, thread_id: str, text: str, tokens: int, delay_ms: float = 0, cid: int = 1
) -> Any:
    """`run.start` of the built-in chat agent: `tokens` tokens, `delay_ms` apart."""
    params = {"assistant_id": "lead_agent", "input": human(text), "config": knobs(tokens, delay_ms)}
    return command(c, thread_id, "run.start", params, cid)


def command(c: httpx.Client, thread_id: str, method: str, params: Any, cid: int = 1) -> Any:
    r = c.post(
        f"/threads/{thread_id}/commands", json={"id": cid, "method": method, "params": params}
    )
    assert r.status_code == 200, r.text
    return r.json()


def sse(
    c: httpx.Client,
    thread_id: str,
    body: dict[str, Any],
    *,
    until: str | None = None,
    count: int | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event, data) of a protocol stream until a root `lifecycle` `until`, or `count` frames."""
    seen = 0
    with c.stream("POST", f"/threads/{thread_id}/stream/events", json=body) as s:
        assert s.status_code == 200, s.read()
        event = None
        for line in s.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event:
                data = json.loads(line[6:])
                yield event, data
                seen += 1
                if count is not None and seen >= count:
                    return
                if (
                    until
                    and event == "lifecycle"
                    and data["params"]["namespace"] == []
                    and data["params"]["data"]["event"] == until
                ):
                    return


ALL = ["values", "updates", "messages", "lifecycle", "input", "checkpoints", "tasks", "custom"]


def test_b4_a_reconnect_after_any_seq_resumes_exactly(graphs_cluster: Cluster) -> None:
    """B4: two runs on a thread; the stream dropped after every few events and reopened with
    `since` = the last seq received gives exactly the events of one uninterrupted read of
    both runs (same ids, same order, none twice), across the run boundary."""
    thread_id = str(uuid.uuid4())
    with httpx.Client(base_url=graphs_cluster.url, headers=AUTH, timeout=20) as c:
        first = chat(c, thread_id, "one", 12, 15)
        assert first["type"] == "success"
        pieces: list[dict[str, Any]] = []
        since = None
        second_started = False
        while True:
            body: dict[str, Any] = {"channels": ALL}
            if since is not None:
                body["since"] = since
            batch = [
                d for e, d in sse(c, thread_id, body, until="completed", count=7) if e != "error"
            ]
            pieces.extend(batch)
            since = batch[-1]["seq"] if batch else since
            done = [
                d
                for d in pieces
                if d["method"] == "lifecycle" and d["params"]["data"]["event"] == "completed"
            ]
            if len(done) == 1 and not second_started:
                chat(c, thread_id, "two", 6, 15, cid=2)
                second_started = True
            if len(done) == 2:
                break
        # One read of the whole thread from the first run's very first event.
        first_seq = pieces[0]["seq"]
        whole = [
            d
            for e, d in sse(
                c,
                thread_id,
                {"channels": ALL, "since": first_seq - 1},
                until=None,
                count=len(pieces),
            )
            if e != "error"
        ]
    ids = [d["event_id"] for d in pieces]
    assert len(ids) == len(set(ids)), "an event was delivered twice"
    assert ids == [d["event_id"] for d in whole]
    seqs = [d["seq"] for d in pieces]
    assert seqs == sorted(seqs)
    assert pieces[0]["params"]["data"] == {"event": "running", "graph_name": "lead_agent"}


def test_b5_a_cursor_whose_events_are_gone_gets_a_gap(graphs_cluster: Cluster) -> None:
    """B5: `since` in a run whose stream is gone (expired) is answered with the protocol's
    unsolicited `resume_gap` error naming the run and where to reload; later runs still
    stream after it."""
    thread_id = str(uuid.uuid4())
    with httpx.Client(base_url=graphs_cluster.url, headers=AUTH, timeout=20) as c:
        started = chat(c, thread_id, "x", 3)
        run_id = started["result"]["run_id"]
        got = list(sse(c, thread_id, {"channels": ["lifecycle", "values"]}, until="completed"))
        middle = got[1][1]["seq"]
        keys = Keys(graphs_cluster.settings.redis_prefix)
        r = redis.Redis.from_url(graphs_cluster.settings.redis_url)
        try:
            assert r.delete(keys.stream(run_id), keys.stream_meta(run_id)) == 2
        finally:
            r.close()
        chat(c, thread_id, "y", 2, cid=2)
        after = list(
            sse(c, thread_id, {"channels": ["lifecycle"], "since": middle}, until="completed")
        )
    event, gap = after[0]
    assert event == "error" and gap["type"] == "error" and gap["id"] is None
    assert gap["error"] == "resume_gap" and gap["run_id"] == run_id
    assert f"/threads/{thread_id}/state" in gap["message"]
    assert [d["params"]["data"]["event"] for _, d in after[1:]] == ["running", "completed"]


# --- commands, bad input, isolation -----------------------------------------------------------
def test_state_commands_and_a_fork(graphs_cluster: Cluster) -> None:
    """`state.get` (all keys, or some), `state.listCheckpoints` (newest first, paged with
    `before`), and `state.fork` from a checkpoint: a new run on the thread from there."""
    thread_id = str(uuid.uuid4())
    with httpx.Client(base_url=graphs_cluster.url, headers=AUTH, timeout=20) as c:
        chat(c, thread_id, "x", 2)
        list(sse(c, thread_id, {"channels": ["lifecycle"]}, until="completed"))
        state = command(c, thread_id, "state.get", {"namespace": [], "keys": ["messages"]})[
            "result"
        ]
        assert list(state["values"]) == ["messages"] and len(state["values"]["messages"]) == 2
        assert state["checkpoint"]["id"]
        listed = command(c, thread_id, "state.listCheckpoints", {"limit": 2})["result"][
            "checkpoints"
        ]
        assert len(listed) == 2 and listed[0]["id"] == state["checkpoint"]["id"]
        assert listed[0]["step"] > listed[1]["step"]
        older = command(
            c, thread_id, "state.listCheckpoints", {"limit": 1, "before": listed[1]["id"]}
        )
        assert older["result"]["checkpoints"][0]["step"] < listed[1]["step"]
        fork = command(c, thread_id, "state.fork", {"checkpoint_id": listed[1]["id"]})["result"]
        assert fork["thread_id"] == thread_id and fork["run_id"]
        missing = command(c, thread_id, "state.fork", {"checkpoint_id": str(uuid.uuid4())})
        assert missing["error"] == "no_such_checkpoint"


def test_bad_commands_get_clear_errors(graphs_cluster: Cluster) -> None:
    """A malformed envelope is a 422 naming the field; an unknown method, bad params (the
    field named), an interrupt the thread does not wait on, a subscription over HTTP and a
    subgraph namespace are the protocol's errors; a bad channel is a 422."""
    thread_id = str(uuid.uuid4())
    with httpx.Client(base_url=graphs_cluster.url, headers=AUTH, timeout=20) as c:
        r = c.post(f"/threads/{thread_id}/commands", json={"method": "run.start"})
        assert r.status_code == 422 and r.json()["field"] == "id"
        r = c.post(
            f"/threads/{thread_id}/commands",
            content=b"{",
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400
        assert command(c, thread_id, "run.stop", {})["error"] == "unknown_command"
        bad = command(c, thread_id, "run.start", {"input": {}})
        assert bad["error"] == "invalid_argument" and "assistant_id" in bad["message"]
        bad = command(c, thread_id, "state.listCheckpoints", {"limit": True})
        assert bad["error"] == "invalid_argument" and "limit" in bad["message"]
        chat(c, thread_id, "x", 1)
        list(sse(c, thread_id, {"channels": ["lifecycle"]}, until="completed"))
        nope = command(
            c, thread_id, "input.respond", {"namespace": [], "interrupt_id": "x", "response": 1}
        )
        assert nope["error"] == "no_such_interrupt"
        assert (
            command(c, thread_id, "subscription.subscribe", {"channels": ["values"]})["error"]
            == "not_supported"
        )
        assert (
            command(c, thread_id, "state.get", {"namespace": ["sub:1"]})["error"]
            == "no_such_namespace"
        )
        r = c.post(f"/threads/{thread_id}/stream/events", json={"channels": ["values", "debug"]})
        assert r.status_code == 422 and "debug" in r.text
        r = c.post(
            f"/threads/{thread_id}/stream/events", json={"channels": ["values"], "since": -1}
        )
        assert r.status_code == 422


def test_a4_another_users_thread_is_not_found(graphs_cluster: Cluster) -> None:
    """A4: bob's commands and streams on alice's thread are 404s; a stream without a key 401."""
    thread_id = str(uuid.uuid4())
    with httpx.Client(base_url=graphs_cluster.url, headers=AUTH, timeout=20) as c:
        chat(c, thread_id, "x", 1)
    with httpx.Client(base_url=graphs_cluster.url, headers={"x-api-key": BOB}, timeout=20) as c:
        r = c.post(f"/threads/{thread_id}/stream/events", json={"channels": ["values"]})
        assert r.status_code == 404
        r = c.post(
            f"/threads/{thread_id}/commands",
            json={"id": 1, "method": "state.get", "params": {"namespace": []}},
        )
        assert r.status_code == 404
    r = httpx.post(
        f"{graphs_cluster.url}/threads/{thread_id}/stream/events", json={"channels": ["values"]}
    )
    assert r.status_code == 401
    # The WebSocket: bob's upgrade is accepted (a browser cannot read a refused upgrade's
    # status), then closed with 4000 + 404 before any frame.
    ws_url = graphs_cluster.url.replace("http", "ws") + f"/threads/{thread_id}/stream/events"
    ws = simple_websocket.Client.connect(ws_url, headers={"x-api-key": BOB})
    try:
        with pytest.raises(simple_websocket.ConnectionClosed) as closed:
            ws.receive(timeout=10)
        assert closed.value.reason == 4404
    finally:
        with contextlib.suppress(simple_websocket.ConnectionClosed):
            ws.close()


PROTOCOL_PROJECT = Path(__file__).resolve().parents[1] / "fixtures" / "protocol_project"


def test_a_subgraph_streams_under_its_namespace(private_cluster: ClusterFactory) -> None:
    """A subgraph's events carry its namespace (`step:<task>`), its lifecycle `started` and
    `completed` there; a subscription to that namespace gets only them, one to the root
    with depth 0 none of them (the SDK's own `matches_subscription` on the server)."""
    config = {"THREADRUN_CONFIG": str(PROTOCOL_PROJECT / "langgraph.json")}
    with private_cluster("protocol-nested", config) as cluster:
        cluster.start()
        thread_id = str(uuid.uuid4())
        with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=20) as c:
            command(c, thread_id, "run.start", {"assistant_id": "nested", "input": human("hi")})
            everything = list(sse(c, thread_id, {"channels": ALL}, until="completed"))
            sub = list(
                sse(
                    c,
                    thread_id,
                    {"channels": ["messages", "lifecycle"], "namespaces": [["step"]]},
                    count=11,
                )
            )
            root = list(
                sse(
                    c,
                    thread_id,
                    {"channels": ["messages", "lifecycle"], "namespaces": [[]], "depth": 0},
                    until="completed",
                )
            )
    nested = [d for _, d in everything if d["params"]["namespace"]]
    (namespace,) = {tuple(d["params"]["namespace"]) for d in nested}
    assert len(namespace) == 1 and namespace[0].startswith("step:")
    lifecycles = [d["params"]["data"]["event"] for d in nested if d["method"] == "lifecycle"]
    assert lifecycles == ["started", "completed"]
    assert {d["method"] for _, d in sub} == {"messages", "lifecycle"}
    assert all(tuple(d["params"]["namespace"]) == namespace for _, d in sub)
    assert [d["params"]["data"]["event"] for _, d in root] == ["running", "completed"]
