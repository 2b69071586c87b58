"""langgraph.json's `http` section on the real web server (gunicorn, gevent worker, as
`make run` starts it) and a runs worker: a FastAPI and a Flask app as `http.app` (a route,
a middleware, a lifespan for FastAPI), custom-route authentication on and off, the
`disable_*` flags, `mount_prefix` with the official `langgraph_sdk` client, `cors` and
`logging_headers`, and the FastAPI app's WebSocket routes (app/project_http/, app/cors.py,
app/access_log.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import textwrap
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Response
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from shared.auth.keys import ApiKeyStore
from shared.db import make_pool
from shared.settings import Settings
from shared.tools.testing import Cluster
from shared.tools.testing.polling import wait_for
from tests.conftest import private_settings
from tests.e2e.conftest import ALICE, BOB, e2e_cluster
from tests.e2e.test_browser import Page, browser  # noqa: F401 - the fixture

LEAD_AGENT = Path(__file__).resolve().parents[2] / "shared" / "agent" / "lead_agent.py"
SLOTS = 4
KEY_TTL_S = 1.0  # the FastAPI cluster's key cache: a revoked key is noticed within it
RATE, BURST = 20, 10  # its sockets' frame rate and burst
"""max_connections_per_user of the FastAPI project's cluster."""

FASTAPI_APP = """
import asyncio, os
from contextlib import asynccontextmanager
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, StreamingResponse

EVENTS = os.path.join(os.path.dirname(__file__), "events.txt")
WS_EVENTS = os.path.join(os.path.dirname(__file__), "ws_events.txt")


def note(what):
    with open(EVENTS, "a") as f:
        f.write(f"{what} {os.getpid()}\\n")


@asynccontextmanager
async def lifespan(app):
    note("startup")
    yield {"greeting": "hello from the lifespan"}
    note("shutdown")


app = FastAPI(lifespan=lifespan)


@app.middleware("http")
async def tag(request: Request, call_next):
    response = await call_next(request)
    response.headers["x-custom-middleware"] = "fastapi"
    return response


@app.get("/custom/hello")
async def hello(request: Request):
    await asyncio.sleep(0.01)
    user = request.scope.get("user")
    return {
        "greeting": request.state.greeting,
        "user": getattr(user, "identity", None),
        "root_path": request.scope.get("root_path"),
    }


@app.get("/custom/stream")
async def stream():
    async def chunks():
        for i in range(3):
            yield f"data: {i}\\n\\n"
            await asyncio.sleep(0.3)
    return StreamingResponse(chunks(), media_type="text/event-stream")


@app.post("/threads/count")
async def count_override():
    return {"overridden": True}


def ws_note(what):
    with open(WS_EVENTS, "a") as f:
        f.write(what + "\\n")


@app.websocket("/custom/echo")
async def echo(websocket: WebSocket):
    offered = websocket.scope["subprotocols"]
    await websocket.accept(
        subprotocol="echo.v1" if "echo.v1" in offered else None,
        headers=[(b"x-custom-accept", b"yes")],
    )
    user = websocket.scope.get("user")
    await websocket.send_json({
        "user": getattr(user, "identity", None),
        "root_path": websocket.scope["root_path"],
        "path": websocket.url.path,
        "greeting": websocket.state.greeting,
        "tag": websocket.query_params.get("tag"),
        "offered": offered,
    })
    tag = websocket.query_params.get("tag")
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            ws_note(f"disconnect {tag} {message['code']} {message.get('reason') or '-'}")
            return
        if message.get("text") == "close-me":
            await websocket.close(code=4321, reason="asked to")
            ws_note(f"closed {tag}")
            return
        if message.get("text") is not None:
            await websocket.send_text("echo:" + message["text"])
        else:
            await websocket.send_bytes(b"echo:" + message["bytes"])


@app.websocket("/custom/refuse")
async def refuse(websocket: WebSocket):
    await websocket.close(code=1008)


@app.websocket("/custom/broken")
async def broken(websocket: WebSocket):
    raise RuntimeError("the custom app fails before accepting")


@app.websocket("/custom/deny")
async def deny(websocket: WebSocket):
    await websocket.send_denial_response(JSONResponse({"denied": True}, status_code=418))


@app.websocket("/custom/flood")
async def flood(websocket: WebSocket):
    await websocket.accept()
    chunk, sent = "y" * 65536, 0
    try:
        while True:  # to a client that does not read: waits in send() once the pipe is full
            await websocket.send_text(chunk)
            sent += 1
            if sent % 32 == 0:
                ws_note(f"flood {sent}")
    except WebSocketDisconnect:
        ws_note("flood ended")


@app.websocket("/custom/forever")
async def forever(websocket: WebSocket):
    await websocket.accept()
    tag = websocket.query_params.get("tag")
    try:
        await asyncio.sleep(3600)  # never reads: only a cancellation ends it
    except asyncio.CancelledError:
        ws_note(f"cancelled {tag}")
        raise
"""

FLASK_APP = """
import os
from flask import Flask, g, request

EVENTS = os.path.join(os.path.dirname(__file__), "events.txt")
with open(EVENTS, "a") as f:  # Flask has no lifespan: module code runs once per process
    f.write(f"import {os.getpid()}\\n")

app = Flask(__name__)


@app.after_request
def tag(response):
    response.headers["x-custom-middleware"] = "flask"
    return response


@app.get("/custom/hello")
def hello():
    return {"user": request.environ.get("REMOTE_USER"), "root": request.script_root}


@app.get("/info")
def info_override():
    return {"custom": "info"}
"""


def write_project(folder: Path, http: dict[str, Any], app_source: str | None) -> Path:
    """A langgraph.json serving the lead agent, with `http` and the custom app beside it."""
    if app_source is not None:
        (folder / "custom_app.py").write_text(textwrap.dedent(app_source))
    config = {"graphs": {"lead_agent": f"{LEAD_AGENT}:graph"}, "http": http}
    path = folder / "langgraph.json"
    path.write_text(json.dumps(config))
    return path


def events(folder: Path) -> list[str]:
    """The custom app's lifespan notes, `what pid` per line."""
    file = folder / "events.txt"
    return file.read_text().split("\n")[:-1] if file.exists() else []


@contextmanager
def project_cluster(
    settings: Settings, redis_url: str, template: str, folder: Path, env: dict[str, str]
) -> Iterator[Cluster]:
    """A web process (and a runs worker) on a database of their own, serving `folder`'s
    langgraph.json, with the suite's API keys."""
    with (
        private_settings(settings, redis_url, template) as s,
        e2e_cluster(s, folder, {"THREADRUN_CONFIG": str(folder / "langgraph.json"), **env}) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def fastapi_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FastAPI app under /api, its routes authenticated, the store turned off."""
    folder = tmp_path_factory.mktemp("fastapi-project")
    http = {
        "app": "./custom_app.py:app",
        "mount_prefix": "/api",
        "enable_custom_route_auth": True,
        "disable_store": True,
        "middleware_order": "auth_first",
    }
    write_project(folder, http, FASTAPI_APP)
    return folder


@pytest.fixture(scope="module")
def fastapi_cluster(
    settings: Settings, redis_url: str, template_database: str, fastapi_folder: Path
) -> Iterator[Cluster]:
    """The FastAPI project served by one web process and one runs worker, with a few
    connection slots per user (the WebSocket slot test fills BOB's)."""
    env = {
        "THREADRUN_MAX_CONNECTIONS_PER_USER": str(SLOTS),
        "THREADRUN_API_KEY_CACHE_TTL_S": str(KEY_TTL_S),
        "THREADRUN_WS_FRAMES_PER_SECOND": str(RATE),
        "THREADRUN_WS_FRAME_BURST": str(BURST),
    }
    with project_cluster(settings, redis_url, template_database, fastapi_folder, env) as c:
        c.side_by_side(c.start_web, c.start_worker)
        yield c


def test_asgi_route_lifespan_state_and_middleware(fastapi_cluster: Cluster) -> None:
    """A FastAPI route answers under the prefix through its own middleware, sees its
    lifespan's state, and its caller; the lifespan started once in the web process."""
    res = httpx.get(f"{fastapi_cluster.url}/api/custom/hello", headers={"x-api-key": ALICE})
    assert res.status_code == 200, res.text
    assert res.json() == {
        "greeting": "hello from the lifespan",
        "user": "alice",
        "root_path": "/api",
    }
    assert res.headers["x-custom-middleware"] == "fastapi"
    builtin = httpx.get(f"{fastapi_cluster.url}/api/info")
    assert builtin.status_code == 200 and "x-custom-middleware" not in builtin.headers
    assert [e.split()[0] for e in events(fastapi_cluster.logs)] == ["startup"]


def test_custom_route_auth_on(fastapi_cluster: Cluster) -> None:
    """enable_custom_route_auth: a custom route without a valid key is 401 JSON, like the
    API's routes."""
    for headers in ({}, {"x-api-key": "wrong"}):
        res = httpx.get(f"{fastapi_cluster.url}/api/custom/hello", headers=headers)
        assert res.status_code == 401, res.text
        assert res.json()["error"] == "unauthorized"


def test_streaming_asgi_response(fastapi_cluster: Cluster) -> None:
    """A streaming FastAPI response arrives chunk by chunk under the gevent worker."""
    seen: list[tuple[float, str]] = []
    start = time.monotonic()
    with httpx.stream(
        "GET", f"{fastapi_cluster.url}/api/custom/stream", headers={"x-api-key": ALICE}
    ) as res:
        assert res.status_code == 200
        for line in res.iter_lines():
            if line:
                seen.append((time.monotonic() - start, line))
    assert [line for _, line in seen] == ["data: 0", "data: 1", "data: 2"]
    assert seen[-1][0] - seen[0][0] >= 0.5  # not buffered into one body


def test_custom_routes_win_over_builtin(fastapi_cluster: Cluster) -> None:
    """POST /threads/count is the custom app's; POST /threads/search stays threadrun's."""
    url, key = fastapi_cluster.url, {"x-api-key": ALICE}
    res = httpx.post(f"{url}/api/threads/count", json={}, headers=key)
    assert res.json() == {"overridden": True}
    assert httpx.post(f"{url}/api/threads/search", json={}, headers=key).status_code == 200


def test_mount_prefix_with_the_official_sdk(fastapi_cluster: Cluster) -> None:
    """Under mount_prefix the official client works with url=<server>/api: threads.create,
    runs.wait, runs.stream; the prefix-less paths are 404, but /ok (probes)."""

    async def scenario() -> None:
        client = get_client(url=f"{fastapi_cluster.url}/api", api_key=ALICE)
        try:
            thread = await client.threads.create()
            msg: dict[str, Any] = {"messages": [{"role": "user", "content": "hello"}]}
            final = await client.runs.wait(thread["thread_id"], "lead_agent", input=msg)
            assert isinstance(final, dict) and final["messages"]
            events = [
                part.event
                async for part in client.runs.stream(
                    thread["thread_id"], "lead_agent", input=msg, stream_mode="values"
                )
            ]
            assert events[0] == "metadata" and "values" in events
        finally:
            await client.http.client.aclose()

    asyncio.run(scenario())
    url = fastapi_cluster.url
    outside = httpx.post(f"{url}/threads", json={}, headers={"x-api-key": ALICE})
    assert outside.status_code == 404
    assert httpx.get(f"{url}/ok").json() == {"ok": True}
    assert httpx.get(f"{url}/api/ok").json() == {"ok": True}


def test_mount_prefix_locations_and_chat_page(fastapi_cluster: Cluster) -> None:
    """Location / Content-Location name the prefixed path; the WebSocket answers under the
    prefix; the chat page's links and the / redirect carry the prefix."""
    url, key = fastapi_cluster.url, {"x-api-key": ALICE}
    thread = httpx.post(f"{url}/api/threads", json={}, headers=key).json()
    run = httpx.post(
        f"{url}/api/threads/{thread['thread_id']}/runs",
        json={"assistant_id": "lead_agent", "input": {"messages": []}},
        headers=key,
    )
    assert run.status_code == 200, run.text
    assert run.headers["Content-Location"].startswith(f"/api/threads/{thread['thread_id']}/runs/")
    with ws_connect(f"{url.replace('http', 'ws', 1)}/api/ws?api_key={ALICE}") as sock:
        assert sock.response is not None and sock.response.status_code == 101
    page = httpx.get(f"{url}/api/ui")
    assert page.status_code == 200
    assert (
        'src="/api/ui/static/chat.js"' in page.text
        and 'href="/api/ui/static/chat.css"' in page.text
    )
    assert httpx.get(f"{url}/api/ui/static/chat.js").status_code == 200
    assert httpx.get(f"{url}/api/").headers["location"] == "/api/ui"


def test_chat_page_works_under_the_prefix(fastapi_cluster: Cluster, browser: Any) -> None:  # noqa: F811 - the imported fixture
    """In headless Chromium: <server>/api/ redirects to the chat page, whose files, HTTP
    calls and WebSocket all go through the prefix; a message gets its streamed answer."""
    page = Page(browser, f"{fastapi_cluster.url}/api")
    try:
        assert page.page.url.startswith(f"{fastapi_cluster.url}/api/ui")
        page.new_thread()
        page.send("hello through the prefix")
        page.wait_state("done")
        kinds = [m.get("type") or m.get("role") for m in page.transcript()]
        assert len(kinds) >= 2, page.transcript()
    finally:
        page.close()


def test_disable_store(fastapi_cluster: Cluster) -> None:
    """disable_store: the store's routes are 404 (and gone from /openapi.json)."""
    url, key = fastapi_cluster.url, {"x-api-key": ALICE}
    res = httpx.get(f"{url}/api/store/items", params={"namespace": "a", "key": "b"}, headers=key)
    assert res.status_code == 404
    paths = httpx.get(f"{url}/api/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/store")] and "/threads" in paths


# --- the FastAPI app's WebSocket routes (app/project_http/websocket.py) -----------------


def ws_url(cluster: Cluster, path: str) -> str:
    return cluster.url.replace("http", "ws", 1) + path


def ws_events(folder: Path) -> list[str]:
    """The WebSocket routes' notes, one per line."""
    file = folder / "ws_events.txt"
    return file.read_text().split("\n")[:-1] if file.exists() else []


def refused(url: str, **kwargs: Any) -> Response:
    """The HTTP response of a handshake the server refuses."""
    with pytest.raises(InvalidStatus) as info:
        ws_connect(url, proxy=None, **kwargs)
    return info.value.response


def hello_frame(sock: ClientConnection) -> dict[str, Any]:
    frame = sock.recv(timeout=10)
    assert isinstance(frame, str)
    parsed: dict[str, Any] = json.loads(frame)
    return parsed


def test_p4_asgi_websocket_echo_under_prefix(fastapi_cluster: Cluster) -> None:
    """P4: a FastAPI WebSocket route under mount_prefix: accepted with the app's subprotocol
    and headers; its scope has the caller, root_path, the lifespan's state and the query;
    text and bytes echo both ways."""
    url = ws_url(fastapi_cluster, f"/api/custom/echo?tag=echo&api_key={ALICE}")
    with ws_connect(url, proxy=None, subprotocols=["other", "echo.v1"]) as sock:  # type: ignore[list-item]
        assert sock.response is not None and sock.response.status_code == 101
        assert sock.subprotocol == "echo.v1"
        assert sock.response.headers["x-custom-accept"] == "yes"
        assert hello_frame(sock) == {
            "user": "alice",
            "root_path": "/api",
            "path": "/api/custom/echo",
            "greeting": "hello from the lifespan",
            "tag": "echo",
            "offered": ["other", "echo.v1"],
        }
        sock.send("hello")
        assert sock.recv(timeout=10) == "echo:hello"
        sock.send(b"\x00\x01binary")
        assert sock.recv(timeout=10) == b"echo:\x00\x01binary"
        big = "x" * 100_000
        sock.send(big)
        assert sock.recv(timeout=10) == "echo:" + big
    # The built-in socket still answers beside it, under the prefix.
    with ws_connect(ws_url(fastapi_cluster, f"/api/ws?api_key={ALICE}"), proxy=None) as sock:
        sock.send(json.dumps({"type": "ping", "request_id": 1}))
        assert json.loads(sock.recv(timeout=10)) == {"type": "pong", "request_id": 1}


def test_p4_asgi_websocket_custom_route_auth_on(fastapi_cluster: Cluster) -> None:
    """P4, A4: enable_custom_route_auth: an upgrade without a valid key is refused with the
    API's 401 JSON before the socket exists; the key works in `x-api-key` and `?api_key=`,
    as on threadrun's own sockets."""
    for url in (
        ws_url(fastapi_cluster, "/api/custom/echo"),
        ws_url(fastapi_cluster, "/api/custom/echo?api_key=wrong"),
    ):
        res = refused(url)
        assert res.status_code == 401
        assert json.loads(res.body)["error"] == "unauthorized"
    url = ws_url(fastapi_cluster, "/api/custom/echo")
    with ws_connect(url, proxy=None, additional_headers={"x-api-key": BOB}) as sock:
        assert hello_frame(sock)["user"] == "bob"


def test_p4_asgi_websocket_close_before_accept_is_403(fastapi_cluster: Cluster) -> None:
    """P4: an app that closes before accepting refuses the handshake with 403 (the ASGI
    spec); one that sends a denial response has it answered as it is; one that fails before
    accepting is a 500; an upgrade without a version 13 handshake is a 400 (the app never
    runs)."""
    res = refused(ws_url(fastapi_cluster, f"/api/custom/refuse?api_key={ALICE}"))
    assert res.status_code == 403
    denied = refused(ws_url(fastapi_cluster, f"/api/custom/deny?api_key={ALICE}"))
    assert denied.status_code == 418 and json.loads(denied.body) == {"denied": True}
    failed = refused(ws_url(fastapi_cluster, f"/api/custom/broken?api_key={ALICE}"))
    assert failed.status_code == 500
    upgrade = {"Upgrade": "websocket", "Connection": "Upgrade", "x-api-key": ALICE}
    no_key = httpx.get(f"{fastapi_cluster.url}/api/custom/echo", headers=upgrade)
    assert no_key.status_code == 400 and "version 13" in no_key.text


def test_p4_asgi_websocket_close_codes_both_ways(
    fastapi_cluster: Cluster, fastapi_folder: Path
) -> None:
    """P4: the app's close code and reason reach the client; the client's close reaches the
    app as `websocket.disconnect` with its code and reason."""
    url = ws_url(fastapi_cluster, f"/api/custom/echo?tag=server-close&api_key={ALICE}")
    with ws_connect(url, proxy=None) as sock:
        hello_frame(sock)
        sock.send("close-me")
        with pytest.raises(ConnectionClosed):
            sock.recv(timeout=10)
        assert (sock.close_code, sock.close_reason) == (4321, "asked to")
    wait_for(lambda: "closed server-close" in ws_events(fastapi_folder), what="the app's close")

    url = ws_url(fastapi_cluster, f"/api/custom/echo?tag=client-close&api_key={ALICE}")
    with ws_connect(url, proxy=None) as sock:
        hello_frame(sock)
        sock.close(code=4000, reason="bye")
    wait_for(
        lambda: "disconnect client-close 4000 bye" in ws_events(fastapi_folder),
        what="websocket.disconnect in the app",
        detail=lambda: "\n".join(ws_events(fastapi_folder)),
    )


def test_p4_asgi_websocket_vanished_client_ends_the_task(
    fastapi_cluster: Cluster, fastapi_folder: Path
) -> None:
    """P4: a client that vanishes without a close frame ends the app's task, even one that
    never reads (it is cancelled after the disconnect grace); one that reads hears
    `websocket.disconnect`."""
    for path in ("forever?tag=vanish", "echo?tag=vanish"):
        url = ws_url(fastapi_cluster, f"/api/custom/{path}&api_key={ALICE}")
        with ws_connect(url, proxy=None, close_timeout=1) as sock:
            sock.socket.shutdown(socket.SHUT_RDWR)  # no close frame: the TCP connection ends
    wait_for(
        lambda: {"cancelled vanish", "disconnect vanish 1005 -"} <= set(ws_events(fastapi_folder)),
        timeout=30,
        what="both tasks to end",
        detail=lambda: "\n".join(ws_events(fastapi_folder)),
    )


def test_p4_asgi_websocket_stalled_client_blocks_nothing_else(
    fastapi_cluster: Cluster, fastapi_folder: Path
) -> None:
    """P4: an app sending to a client that does not read waits in its own `send()` (the
    greenlet's write waits for TCP): the loop's other sockets and the custom HTTP routes
    answer meanwhile; once that client goes, the app's `send()` fails and its task ends."""
    url = ws_url(fastapi_cluster, f"/api/custom/flood?api_key={ALICE}")
    with ws_connect(url, proxy=None, max_queue=1, close_timeout=2, compression=None):
        wait_for(lambda: "flood 64" in ws_events(fastapi_folder), what="64 frames sent")
        echo = ws_url(fastapi_cluster, f"/api/custom/echo?tag=beside&api_key={ALICE}")
        with ws_connect(echo, proxy=None) as sock:
            hello_frame(sock)
            sock.send("still here")
            assert sock.recv(timeout=10) == "echo:still here"
        res = httpx.get(f"{fastapi_cluster.url}/api/custom/hello", headers={"x-api-key": ALICE})
        assert res.status_code == 200
    wait_for(
        lambda: "flood ended" in ws_events(fastapi_folder),
        timeout=30,
        what="the flooding task to end",
        detail=lambda: "\n".join(ws_events(fastapi_folder)[-5:]),
    )
    notes = [e.split() for e in ws_events(fastapi_folder) if e.startswith("flood ")]
    sent = [int(n[1]) for n in notes if n[1].isdigit()]
    assert max(sent) < 1000, max(sent)  # held back: not 64 MB into the pipe's buffers


def test_p4_asgi_websocket_holds_a_connection_slot(fastapi_cluster: Cluster) -> None:
    """A3, P4: under custom-route auth each custom socket holds one of the caller's
    connection slots, the same ones threadrun's sockets count in: over
    max_connections_per_user the next upgrade (custom or built-in) is 429; closing one frees
    its slot."""
    url = ws_url(fastapi_cluster, "/api/custom/echo")
    key = {"x-api-key": BOB}
    with ExitStack() as stack:
        held: list[ClientConnection] = []
        res: Response | None = None
        for _ in range(SLOTS + 1):
            try:
                sock = stack.enter_context(ws_connect(url, proxy=None, additional_headers=key))
            except InvalidStatus as exc:
                res = exc.response
                break
            held.append(sock)
            hello_frame(sock)
        assert res is not None and res.status_code == 429, len(held)
        assert json.loads(res.body)["limit"] == "max_connections_per_user"
        builtin = refused(ws_url(fastapi_cluster, "/api/ws"), additional_headers=key)
        assert builtin.status_code == 429
        held.pop().close()

        def opens() -> bool:
            try:
                stack.enter_context(ws_connect(url, proxy=None, additional_headers=key))
            except InvalidStatus:
                return False
            return True

        wait_for(opens, what="the freed slot")


def test_a4_p4_asgi_websocket_closes_when_its_key_is_revoked(
    fastapi_cluster: Cluster, fastapi_folder: Path
) -> None:
    """A4, P4: a custom socket opened under custom-route auth re-checks its credential once
    per key-cache TTL, as threadrun's own sockets do: revoked while open, the socket closes
    with 4401 and the app hears `websocket.disconnect` 4401."""
    pool = make_pool(fastapi_cluster.settings, name="test-keys", max_size=1)
    try:
        keys = ApiKeyStore(pool)
        record, secret = keys.create("dora")
        url = ws_url(fastapi_cluster, "/api/custom/echo?tag=revoked")
        with ws_connect(url, proxy=None, additional_headers={"x-api-key": secret}) as sock:
            assert hello_frame(sock)["user"] == "dora"
            sock.send("still here")
            assert sock.recv(timeout=10) == "echo:still here"
            keys.revoke(str(record.key_id))
            with pytest.raises(ConnectionClosed) as closed:
                while True:  # echoes of nothing: only the close ends this
                    sock.recv(timeout=10 * KEY_TTL_S + 5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
        wait_for(
            lambda: any(e.startswith("disconnect revoked 4401") for e in ws_events(fastapi_folder)),
            what="the app to hear the 4401",
        )
    finally:
        pool.close()


def test_a3_p4_asgi_websocket_frames_are_paced_not_dropped(fastapi_cluster: Cluster) -> None:
    """A3, P4: a client sending faster than ws_frames_per_second (after its burst) to a custom
    socket under custom-route auth is read more slowly: every frame reaches the app, in
    order, none is dropped (the app's protocol has no threadrun error frame), and the ones
    past the burst arrive at the rate."""
    n = BURST + 20
    url = ws_url(fastapi_cluster, f"/api/custom/echo?tag=paced&api_key={ALICE}")
    with ws_connect(url, proxy=None) as sock:
        hello_frame(sock)
        started = time.monotonic()
        for i in range(n):
            sock.send(f"f{i}")
        echoes = [sock.recv(timeout=30) for _ in range(n)]
        took = time.monotonic() - started
    assert echoes == [f"echo:f{i}" for i in range(n)]
    # 20 frames past the burst at RATE per second: at least about 20 / RATE seconds. A lower
    # bound only (a slow machine makes it longer), so it cannot flake.
    assert took >= 0.8 * (n - BURST) / RATE, took


@pytest.fixture(scope="module")
def public_ws_cluster(
    settings: Settings,
    redis_url: str,
    template_database: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    """The FastAPI app at the root, custom routes public, one connection per user."""
    folder = tmp_path_factory.mktemp("fastapi-public")
    write_project(folder, {"app": "./custom_app.py:app"}, FASTAPI_APP)
    env = {"THREADRUN_MAX_CONNECTIONS_PER_USER": "1"}
    with project_cluster(settings, redis_url, template_database, folder, env) as c:
        c.start_web()
        yield c


def test_p4_asgi_websocket_custom_route_auth_off(public_ws_cluster: Cluster) -> None:
    """P4: without enable_custom_route_auth a custom WebSocket route is public (no caller in
    its scope, root_path empty) and counts in no one's connection slots."""
    url = ws_url(public_ws_cluster, "/custom/echo?tag=public")
    with ws_connect(url, proxy=None) as one, ws_connect(url, proxy=None) as two:
        first = hello_frame(one)
        assert (
            first["user"] is None and first["root_path"] == "" and first["path"] == "/custom/echo"
        )
        assert hello_frame(two)["user"] is None
        one.send("a")
        two.send(b"b")
        assert (one.recv(timeout=10), two.recv(timeout=10)) == ("echo:a", b"echo:b")
    # threadrun's own socket still needs a key there.
    assert refused(ws_url(public_ws_cluster, "/ws")).status_code == 401


def test_lifespan_shutdown_on_stop(
    settings: Settings, redis_url: str, template_database: str, tmp_path: Path
) -> None:
    """The lifespan's shutdown runs when the web process stops (gunicorn's worker_exit),
    after one startup in that process."""
    write_project(tmp_path, {"app": "./custom_app.py:app"}, FASTAPI_APP)
    with project_cluster(settings, redis_url, template_database, tmp_path, {}) as c:
        c.start_web()
        assert httpx.get(f"{c.url}/custom/hello").status_code == 200  # auth off: public
        c.stop()
    notes = events(tmp_path)
    assert [n.split()[0] for n in notes] == ["startup", "shutdown"]
    assert notes[0].split()[1] == notes[1].split()[1]  # the same (web worker) process


@pytest.fixture(scope="module")
def flask_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Flask app, public custom routes, most built-in groups off, CORS and log rules."""
    folder = tmp_path_factory.mktemp("flask-project")
    http = {
        "app": "./custom_app.py:app",
        "disable_assistants": True,
        "disable_threads": True,
        "disable_runs": True,
        "disable_meta": True,
        "disable_ui": True,
        "disable_mcp": True,
        "disable_a2a": True,
        "disable_webhooks": True,
        "middleware_order": "middleware_first",
        "cors": {
            "allow_origins": ["https://app.example"],
            "allow_origin_regex": r"https://.*\.preview\.example",
            "allow_methods": ["GET", "POST"],
            "allow_headers": ["x-api-key"],
            "allow_credentials": True,
            "expose_headers": ["x-trace"],
            "max_age": 77,
        },
        "logging_headers": {"excludes": ["user-agent", "x-secret-*"]},
    }
    write_project(folder, http, FLASK_APP)
    return folder


@pytest.fixture(scope="module")
def flask_cluster(
    settings: Settings, redis_url: str, template_database: str, flask_folder: Path
) -> Iterator[Cluster]:
    """The Flask project on one web process with gunicorn's access log on."""
    access = {
        "GUNICORN_CMD_ARGS": "--access-logfile - --access-logformat"
        " '%(r)s %(s)s ua=%(a)s trace=%({x-trace}i)s secret=%({x-secret-token}i)s'"
    }
    with project_cluster(settings, redis_url, template_database, flask_folder, {}) as c:
        c.start_web(access)
        yield c


def test_wsgi_route_public_without_custom_route_auth(flask_cluster: Cluster) -> None:
    """A Flask app's route answers without credentials (custom-route auth off), through
    its own after_request; it overrides a built-in path (/info, here also disabled)."""
    res = httpx.get(f"{flask_cluster.url}/custom/hello")
    assert res.status_code == 200, res.text
    assert res.json() == {"user": None, "root": ""}
    assert res.headers["x-custom-middleware"] == "flask"
    assert httpx.get(f"{flask_cluster.url}/info").json() == {"custom": "info"}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/assistants/search"),
        ("POST", "/threads"),
        ("GET", "/threads/t1/state"),
        ("POST", "/runs/wait"),
        ("POST", "/threads/t1/runs"),
        ("POST", "/runs/crons"),
        ("GET", "/openapi.json"),
        ("GET", "/metrics"),
        ("GET", "/ui"),
        ("GET", "/ui/static/chat.js"),
    ],
)
def test_disabled_groups_are_404(flask_cluster: Cluster, method: str, path: str) -> None:
    """disable_assistants|threads|runs|meta|ui: their routes are 404 with or without a key."""
    for headers in ({}, {"x-api-key": ALICE}):
        res = httpx.request(method, f"{flask_cluster.url}{path}", json={}, headers=headers)
        assert res.status_code == 404, (path, res.status_code, res.text)


def test_disable_meta_keeps_ok(flask_cluster: Cluster) -> None:
    """disable_meta: /ok still answers {"ok": true}; the store (not disabled) still works."""
    assert httpx.get(f"{flask_cluster.url}/ok").json() == {"ok": True}
    res = httpx.post(f"{flask_cluster.url}/store/namespaces", json={}, headers={"x-api-key": ALICE})
    assert res.status_code == 200, res.text


def test_project_cors(flask_cluster: Cluster) -> None:
    """http.cors wins over THREADRUN_CORS_ORIGINS: origins, regex, methods, headers,
    credentials, exposed headers and max age as the section says."""
    url = f"{flask_cluster.url}/store/namespaces"
    for origin in ("https://app.example", "https://pr-7.preview.example"):
        pre = httpx.options(
            url,
            headers={
                "Origin": origin,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "x-api-key, content-type",
            },
        )
        assert pre.headers["access-control-allow-origin"] == origin
        assert pre.headers["access-control-allow-credentials"] == "true"
        assert pre.headers["access-control-max-age"] == "77"
        assert "POST" in pre.headers["access-control-allow-methods"]
        allowed = pre.headers["access-control-allow-headers"].lower()
        assert "x-api-key" in allowed and "content-type" in allowed
        res = httpx.post(url, json={}, headers={"Origin": origin, "x-api-key": ALICE})
        assert res.status_code == 200
        assert res.headers["access-control-expose-headers"].lower() == "x-trace"
    evil = httpx.post(url, json={}, headers={"Origin": "https://evil.example", "x-api-key": ALICE})
    assert evil.status_code == 403 and "http.cors" in evil.json()["message"]


def test_project_cors_covers_custom_routes(flask_cluster: Cluster) -> None:
    """The custom app's routes get the same CORS answers: a preflight (unauthenticated)
    and the headers of an allowed origin's response; a refused preflight is 400."""
    url = f"{flask_cluster.url}/custom/hello"
    ask = {"Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "x-api-key"}
    pre = httpx.options(url, headers={"Origin": "https://app.example", **ask})
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == "https://app.example"
    assert pre.headers["access-control-max-age"] == "77"
    refused = httpx.options(url, headers={"Origin": "https://evil.example", **ask})
    assert refused.status_code == 400
    res = httpx.get(url, headers={"Origin": "https://pr-1.preview.example"})
    assert res.headers["access-control-allow-origin"] == "https://pr-1.preview.example"
    assert res.headers["access-control-allow-credentials"] == "true"
    assert "access-control-allow-origin" not in httpx.get(url).headers


def test_logging_headers_in_the_access_log(flask_cluster: Cluster) -> None:
    """logging_headers.excludes: the excluded headers print as "-" in gunicorn's access log;
    the others print."""
    httpx.get(
        f"{flask_cluster.url}/custom/hello",
        headers={"User-Agent": "secret-agent", "x-trace": "t-123", "x-secret-token": "s3"},
    )
    web = next(p for p in flask_cluster.procs if p.role == "web")
    deadline = time.monotonic() + 5
    while "trace=t-123" not in web.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    line = [ln for ln in web.output().splitlines() if "GET /custom/hello" in ln][-1]
    assert "ua=- trace=t-123 secret=-" in line, line
    assert "secret-agent" not in web.output() and "s3 " not in line
