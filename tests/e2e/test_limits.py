"""A3/A4 limits against real processes, one test per limit, on a cluster with tiny limits.

Each test uses its own user so that the per-user counters do not interfere.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import simple_websocket
from simple_websocket import ConnectionClosed

from shared.tools.testing import Cluster
from tests.e2e.conftest import ClusterFactory

pytestmark = pytest.mark.e2e

USERS = ("rate", "active", "conn", "size", "ws", "fps", "cors", "reserved", "ckpt", "msgs")
KEYS = {u: f"key-{u}" for u in USERS}
LIMITS = {
    "THREADRUN_API_KEYS": ",".join(f"{k}:{u}" for u, k in KEYS.items()),
    "THREADRUN_RUNS_PER_MINUTE": "5",
    "THREADRUN_MAX_ACTIVE_RUNS": "2",
    "THREADRUN_ACTIVE_RUNS_RETRY_AFTER_S": "3",
    "THREADRUN_MAX_CONNECTIONS_PER_USER": "2",
    "THREADRUN_MAX_INPUT_BYTES": "1024",
    "THREADRUN_MAX_STREAM_MODES": "3",
    "THREADRUN_MAX_METADATA_BYTES": "256",
    "THREADRUN_MAX_BODY_BYTES": "65536",
    "THREADRUN_WS_MAX_FRAME_BYTES": "4096",
    "THREADRUN_WS_FRAMES_PER_SECOND": "2",
    "THREADRUN_WS_FRAME_BURST": "3",
    "THREADRUN_STREAM_HEARTBEAT_S": "1",
    "THREADRUN_CORS_ORIGINS": "http://app.example",
    "THREADRUN_WS_ORIGINS": "http://app.example",
}
HUMAN = {"messages": [{"role": "user", "content": "hi"}]}
SLOW = {"configurable": {"tokens": 400, "token_delay_ms": 100}}  # ~40 s unless cancelled


@pytest.fixture(scope="module")
def lim(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """Web + one worker with tiny limits, own database and prefix."""
    with private_cluster("limits", LIMITS) as c:
        yield c.start(workers=["limits"], concurrency=4)


def h(user: str, **extra: str) -> dict[str, str]:
    return {"x-api-key": KEYS[user], **extra}


def new_thread(c: Cluster, user: str) -> str:
    r = httpx.post(f"{c.url}/threads", json={}, headers=h(user), timeout=30)
    assert r.status_code == 200, r.text
    return str(r.json()["thread_id"])


def run_body(**extra: Any) -> dict[str, Any]:
    return {"assistant_id": "lead_agent", "input": HUMAN, **extra}


def assert_limit(
    r: httpx.Response, status: int, limit: str, field: str | None = None
) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["error"] == "limit_exceeded" and body["limit"] == limit, body
    if field is not None:
        assert body["field"] == field and field in body["message"], body
    if status == 429:
        assert int(r.headers["Retry-After"]) >= 1
    return dict(body)


def ws_url(c: Cluster, path: str = "/ws") -> str:
    return c.url.replace("http://", "ws://") + path


def upgrade_headers(user: str, **extra: str) -> dict[str, str]:
    return {
        **h(user),
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        **extra,
    }


def test_a4_runs_per_minute(lim: Cluster) -> None:
    """A4: the 6th run within a minute (limit 5) is 429 with Retry-After, naming the limit."""
    tid = new_thread(lim, "rate")
    body = run_body(config={"configurable": {"tokens": 1}})
    for _ in range(5):
        r = httpx.post(
            f"{lim.url}/threads/{tid}/runs/wait", json=body, headers=h("rate"), timeout=60
        )
        assert r.status_code == 200, r.text
    r = httpx.post(f"{lim.url}/threads/{tid}/runs", json=body, headers=h("rate"), timeout=30)
    assert_limit(r, 429, "runs_per_minute")
    # An invalid request is refused by validation and spends nothing.
    r = httpx.post(
        f"{lim.url}/threads/{tid}/runs", json={"input": 1}, headers=h("rate"), timeout=30
    )
    assert r.status_code == 422 and r.json()["field"] == "assistant_id"


def test_a4_active_runs_per_user(lim: Cluster) -> None:
    """A4: a 3rd pending/running run (limit 2) is 429; once one ends, a new one is admitted."""
    tids = [new_thread(lim, "active") for _ in range(3)]
    run_ids = []
    for tid in tids[:2]:
        r = httpx.post(
            f"{lim.url}/threads/{tid}/runs",
            json=run_body(config=SLOW),
            headers=h("active"),
            timeout=30,
        )
        assert r.status_code == 200, r.text
        run_ids.append(r.json()["run_id"])
    r = httpx.post(
        f"{lim.url}/threads/{tids[2]}/runs", json=run_body(), headers=h("active"), timeout=30
    )
    body = assert_limit(r, 429, "max_active_runs")
    assert r.headers["Retry-After"] == "3" and body["retry_after"] == 3
    # Over the WebSocket too: the same per-user limit, as an error frame.
    ws = simple_websocket.Client.connect(ws_url(lim), headers=h("active"))
    try:
        ws.send(json.dumps({"type": "run.create", "thread_id": tids[2], **run_body()}))
        frame = json.loads(ws.receive(timeout=15))
        assert frame["type"] == "error" and frame["limit"] == "max_active_runs", frame
    finally:
        ws.close()
    r = httpx.post(
        f"{lim.url}/threads/{tids[0]}/runs/{run_ids[0]}/cancel?wait=1",
        headers=h("active"),
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["status"] == "interrupted", r.text
    r = httpx.post(
        f"{lim.url}/threads/{tids[2]}/runs", json=run_body(), headers=h("active"), timeout=30
    )
    assert r.status_code == 200, r.text
    httpx.post(
        f"{lim.url}/threads/{tids[1]}/runs/{run_ids[1]}/cancel", headers=h("active"), timeout=30
    )


def test_a3_input_message_size(lim: Cluster) -> None:
    """A3: an input above max_input_bytes is 422 naming `input` and the limit (HTTP and WS)."""
    tid = new_thread(lim, "size")
    big = {"messages": [{"role": "user", "content": "x" * 2000}]}
    r = httpx.post(
        f"{lim.url}/threads/{tid}/runs", json=run_body(input=big), headers=h("size"), timeout=30
    )
    assert_limit(r, 422, "max_input_bytes", "input")
    ws = simple_websocket.Client.connect(ws_url(lim), headers=h("size"))
    try:
        ws.send(json.dumps({"type": "run.create", "thread_id": tid, **run_body(input=big)}))
        frame = json.loads(ws.receive(timeout=15))
        assert frame["type"] == "error" and frame["limit"] == "max_input_bytes", frame
        assert frame["field"] == "input"
    finally:
        ws.close()


def test_a3_stream_mode_list_length(lim: Cluster) -> None:
    """A3: a stream_mode list longer than max_stream_modes is 422 naming the field."""
    tid = new_thread(lim, "size")
    body = run_body(stream_mode=["values"] * 4)
    r = httpx.post(f"{lim.url}/threads/{tid}/runs", json=body, headers=h("size"), timeout=30)
    assert_limit(r, 422, "max_stream_modes", "stream_mode")


def test_a3_metadata_size(lim: Cluster) -> None:
    """A3: thread and run metadata above max_metadata_bytes are 422 naming `metadata`."""
    meta = {"k": "v" * 300}
    r = httpx.post(f"{lim.url}/threads", json={"metadata": meta}, headers=h("size"), timeout=30)
    assert_limit(r, 422, "max_metadata_bytes", "metadata")
    tid = new_thread(lim, "size")
    r = httpx.patch(
        f"{lim.url}/threads/{tid}", json={"metadata": meta}, headers=h("size"), timeout=30
    )
    assert_limit(r, 422, "max_metadata_bytes", "metadata")
    r = httpx.post(
        f"{lim.url}/threads/{tid}/runs", json=run_body(metadata=meta), headers=h("size"), timeout=30
    )
    assert_limit(r, 422, "max_metadata_bytes", "metadata")


def test_a3_request_body_size(lim: Cluster) -> None:
    """A3: a body above max_body_bytes is 413 with a JSON error."""
    tid = new_thread(lim, "size")
    raw = json.dumps(run_body(input={"blob": "x" * 70_000})).encode()
    r = httpx.post(
        f"{lim.url}/threads/{tid}/runs",
        content=raw,
        headers=h("size", **{"content-type": "application/json"}),
        timeout=30,
    )
    assert r.status_code == 413 and r.json()["error"] == "request_entity_too_large", r.text


def test_a4_open_connections_per_user(lim: Cluster) -> None:
    """A4: a 3rd open stream (limit 2, SSE + WebSocket) is 429; closing one frees its slot."""
    tid = new_thread(lim, "conn")
    r = httpx.post(
        f"{lim.url}/threads/{tid}/runs", json=run_body(config=SLOW), headers=h("conn"), timeout=30
    )
    assert r.status_code == 200, r.text
    rid = r.json()["run_id"]
    stream_url = f"{lim.url}/threads/{tid}/runs/{rid}/stream"
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(httpx.Client(timeout=30))
        first = stack.enter_context(client.stream("GET", stream_url, headers=h("conn")))
        assert first.status_code == 200
        ws = simple_websocket.Client.connect(ws_url(lim), headers=h("conn"))
        stack.callback(ws.close)
        third = httpx.get(stream_url, headers=h("conn"), timeout=30)
        assert_limit(third, 429, "max_connections_per_user")
        join = httpx.get(f"{lim.url}/threads/{tid}/runs/{rid}/join", headers=h("conn"), timeout=30)
        assert_limit(join, 429, "max_connections_per_user")  # /join holds a connection too
        refused = httpx.get(f"{lim.url}/ws", headers=upgrade_headers("conn"), timeout=30)
        assert_limit(refused, 429, "max_connections_per_user")
        # Another user is not affected.
        other = simple_websocket.Client.connect(ws_url(lim), headers=h("cors"))
        other.close()
    # Both closed: the server notices at its next write (1 s heartbeat) and frees the slots.
    deadline = time.monotonic() + 15
    while True:
        with (
            httpx.Client(timeout=30) as client,
            client.stream("GET", stream_url, headers=h("conn")) as again,
        ):
            if again.status_code == 200:
                break
        assert time.monotonic() < deadline, "the slots were never released"
        time.sleep(0.5)
    httpx.post(f"{lim.url}/threads/{tid}/runs/{rid}/cancel", headers=h("conn"), timeout=30)


def test_a3_websocket_frame_size(lim: Cluster) -> None:
    """A3: a frame above ws_max_frame_bytes gets an `error` frame naming the limit,
    then the socket closes with 1009 and a reason naming the size; the server serves on."""
    ws = simple_websocket.Client.connect(ws_url(lim), headers=h("ws"))
    ws.send(json.dumps({"type": "ping", "pad": "x" * 5000}))
    frames = []
    with pytest.raises(ConnectionClosed) as closed:
        for _ in range(5):
            frames.append(json.loads(ws.receive(timeout=10)))
    assert closed.value.reason == 1009
    assert "ws_max_frame_bytes" in closed.value.message
    [error] = frames
    assert error["type"] == "error" and error["code"] == "limit_exceeded", error
    assert error["limit"] == "ws_max_frame_bytes" and error["max_bytes"] > 0, error
    assert str(error["max_bytes"]) in error["message"]
    ws2 = simple_websocket.Client.connect(ws_url(lim), headers=h("ws"))
    try:
        ws2.send(json.dumps({"type": "ping", "request_id": 1}))
        assert json.loads(ws2.receive(timeout=10)) == {"type": "pong", "request_id": 1}
    finally:
        ws2.close()


def test_a4_websocket_frames_per_second(lim: Cluster) -> None:
    """A4: frames beyond the burst (3) at 2/s are dropped with one `error` frame naming the
    limit; the socket stays open and serves again once the rate allows."""
    ws = simple_websocket.Client.connect(ws_url(lim), headers=h("fps"))
    try:
        for i in range(10):
            ws.send(json.dumps({"type": "ping", "request_id": i}))
        frames = []
        while (msg := ws.receive(timeout=1.5)) is not None:
            frames.append(json.loads(msg))
        pongs = [f for f in frames if f["type"] == "pong"]
        errors = [f for f in frames if f["type"] == "error"]
        assert 3 <= len(pongs) <= 5, frames
        assert len(errors) == 1 and errors[0]["limit"] == "ws_frames_per_second", frames
        time.sleep(1)
        ws.send(json.dumps({"type": "ping", "request_id": "again"}))
        assert json.loads(ws.receive(timeout=10)) == {"type": "pong", "request_id": "again"}
    finally:
        ws.close()


def test_a4_cors_allow_list_and_preflight(lim: Cluster) -> None:
    """A4: a preflight from an allowed origin is answered; other origins get no CORS headers."""
    pre = {
        "Origin": "http://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "x-api-key, content-type",
    }
    r = httpx.options(f"{lim.url}/threads", headers=pre, timeout=30)
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == "http://app.example"
    assert "x-api-key" in r.headers["Access-Control-Allow-Headers"].lower()
    r = httpx.options(
        f"{lim.url}/threads", headers={**pre, "Origin": "http://evil.example"}, timeout=30
    )
    assert "Access-Control-Allow-Origin" not in r.headers
    r = httpx.post(
        f"{lim.url}/threads/count",
        json={},
        headers=h("cors", Origin="http://app.example"),
        timeout=30,
    )
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://app.example"


def test_a4_websocket_origin_allow_list(lim: Cluster) -> None:
    """A4: a WebSocket from a foreign Origin is refused (403) before the upgrade; the allowed
    origin, the server's own origin and clients without Origin connect."""
    r = httpx.get(
        f"{lim.url}/ws", headers=upgrade_headers("cors", Origin="http://evil.example"), timeout=30
    )
    assert r.status_code == 403 and "origin" in r.json()["message"].lower()
    # The server's own origin (a browser sends Host with the port, as httpx does).
    own = httpx.get(f"{lim.url}/ws", headers=upgrade_headers("cors", Origin=lim.url), timeout=30)
    assert own.status_code == 101
    for origin in ("http://app.example", None):
        headers = h("cors", **({"Origin": origin} if origin else {}))
        try:
            ws = simple_websocket.Client.connect(ws_url(lim), headers=headers)
        except simple_websocket.ConnectionError as exc:
            raise AssertionError(f"origin {origin}: {exc}") from exc
        try:
            ws.send(json.dumps({"type": "ping"}))
            assert json.loads(ws.receive(timeout=10))["type"] == "pong"
        finally:
            ws.close()


# --- A3: hostile bodies that were accepted or answered 500 ---------------------------------------


def assert_invalid(r: httpx.Response, field: str, *words: str) -> None:
    """A 422 naming the field (and `words`, e.g. the offending key) in its message."""
    assert r.status_code == 422, (r.status_code, r.text)
    body = r.json()
    assert body["field"] == field or body["field"].startswith(field), body
    for word in words:
        assert word in body["message"], body


RESERVED_KEYS = ("__pregel_checkpointer", "__pregel_send", "__anything", "checkpoint_ns")


def test_a3_reserved_config_keys_are_refused_everywhere(lim: Cluster) -> None:
    """A3: `config.configurable.__pregel_checkpointer` (and LangGraph's other
    reserved keys) switched checkpointing off or crashed the run; every path that takes a
    config answers 422 naming the key, and creates nothing."""
    tid = new_thread(lim, "reserved")
    hdr = h("reserved")
    for key in RESERVED_KEYS:
        config = {"configurable": {key: "x", "tokens": 3}}
        for path in (
            f"/threads/{tid}/runs",
            f"/threads/{tid}/runs/stream",
            f"/threads/{tid}/runs/wait",
            "/runs",
            "/runs/stream",
            "/runs/wait",
        ):
            r = httpx.post(
                f"{lim.url}{path}", json=run_body(config=config), headers=hdr, timeout=30
            )
            assert_invalid(r, "config.configurable", key)
        batch = [run_body(), run_body(config=config)]
        r = httpx.post(f"{lim.url}/runs/batch", json=batch, headers=hdr, timeout=30)
        assert_invalid(r, "[1].config.configurable", key)
        for body in ({"config": config}, {"context": {key: "x"}}):
            r = httpx.post(
                f"{lim.url}/assistants", json={"graph_id": "lead_agent", **body}, headers=hdr
            )
            assert_invalid(r, next(iter(body)), key)
    r = httpx.post(f"{lim.url}/assistants", json={"graph_id": "lead_agent"}, headers=hdr)
    assert r.status_code == 200, r.text
    aid = r.json()["assistant_id"]
    r = httpx.patch(
        f"{lim.url}/assistants/{aid}",
        json={"config": {"configurable": {"__pregel_checkpointer": None}}},
        headers=hdr,
    )
    assert_invalid(r, "config.configurable", "__pregel_checkpointer")
    runs = httpx.get(f"{lim.url}/threads/{tid}/runs", headers=hdr, timeout=30).json()
    assert runs == []
    # The server's own keys a client commonly repeats stay accepted (the server's value wins).
    ok = run_body(config={"configurable": {"thread_id": tid, "tokens": 3}})
    r = httpx.post(f"{lim.url}/threads/{tid}/runs/wait", json=ok, headers=hdr, timeout=60)
    assert r.status_code == 200, r.text


def test_a3_unknown_checkpoint_is_404(lim: Cluster) -> None:
    """A3: a run from an unknown `checkpoint_id` silently started a new
    conversation, and the state at an unknown checkpoint answered 200 with empty values;
    both are 404 (and no run is created)."""
    tid = new_thread(lim, "ckpt")
    hdr = h("ckpt")
    body = run_body(config={"configurable": {"tokens": 3}})
    r = httpx.post(f"{lim.url}/threads/{tid}/runs/wait", json=body, headers=hdr, timeout=60)
    assert r.status_code == 200, r.text
    known = httpx.get(f"{lim.url}/threads/{tid}/state", headers=hdr).json()["checkpoint_id"]
    assert known
    unknown = "1f0c0000-0000-6000-8000-000000000000"
    for extra in ({"checkpoint_id": unknown}, {"checkpoint": {"checkpoint_id": unknown}}):
        r = httpx.post(
            f"{lim.url}/threads/{tid}/runs/wait", json={**body, **extra}, headers=hdr, timeout=60
        )
        assert r.status_code == 404, r.text
        assert unknown in r.json()["message"]
    r = httpx.post(
        f"{lim.url}/runs/batch",
        json=[{**body, "thread_id": tid, "checkpoint_id": unknown}],
        headers=hdr,
    )
    assert r.status_code == 404, r.text
    assert len(httpx.get(f"{lim.url}/threads/{tid}/runs", headers=hdr).json()) == 1
    assert httpx.get(f"{lim.url}/threads/{tid}/state/{unknown}", headers=hdr).status_code == 404
    r = httpx.post(
        f"{lim.url}/threads/{tid}/state/checkpoint",
        json={"checkpoint": {"checkpoint_id": unknown}},
        headers=hdr,
    )
    assert r.status_code == 404, r.text
    # A known checkpoint still answers, and a run from it still starts there.
    r = httpx.get(f"{lim.url}/threads/{tid}/state/{known}", headers=hdr)
    assert r.status_code == 200 and r.json()["checkpoint_id"] == known
    r = httpx.post(
        f"{lim.url}/threads/{tid}/runs/wait",
        json={**body, "checkpoint_id": known},
        headers=hdr,
        timeout=60,
    )
    assert r.status_code == 200, r.text


BAD_MESSAGES: list[Any] = [
    5,
    True,
    1.5,
    [5],
    [[1]],
    [["a", "b", "c"]],
    [None],
    [True],
    [{"role": "assistant", "content": "", "tool_calls": 5}],
    [{"role": "assistant", "content": "", "tool_calls": [5]}],
    [{"role": "assistant", "content": "", "tool_calls": [{"args": {}, "id": "c1"}]}],
    [{"type": "ai", "content": "", "tool_calls": [{"name": "f", "args": "x", "id": "c1"}]}],
]


def test_a3_malformed_state_messages_are_422(lim: Cluster) -> None:
    """A3: malformed `values.messages` on POST /threads/{id}/state answered 500
    with a traceback; each is a 422 naming the field, and the state is unchanged."""
    tid = new_thread(lim, "msgs")
    hdr = h("msgs")
    body = run_body(config={"configurable": {"tokens": 3}})
    r = httpx.post(f"{lim.url}/threads/{tid}/runs/wait", json=body, headers=hdr, timeout=60)
    assert r.status_code == 200, r.text
    before = httpx.get(f"{lim.url}/threads/{tid}/state", headers=hdr).json()
    for bad in BAD_MESSAGES:
        r = httpx.post(
            f"{lim.url}/threads/{tid}/state", json={"values": {"messages": bad}}, headers=hdr
        )
        assert_invalid(r, "values.messages")
    assert httpx.get(f"{lim.url}/threads/{tid}/state", headers=hdr).json() == before
    good = {"values": {"messages": [{"role": "user", "content": "still fine"}]}}
    r = httpx.post(f"{lim.url}/threads/{tid}/state", json=good, headers=hdr)
    assert r.status_code == 200, r.text
