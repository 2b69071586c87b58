"""langgraph.json's `http` section on the real web server (gunicorn, gevent worker, as
`make run` starts it) and a runs worker: a FastAPI and a Flask app as `http.app` (a route,
a middleware, a lifespan for FastAPI), custom-route authentication on and off, the
`disable_*` flags, `mount_prefix` with the official `langgraph_sdk` client, `cors` and
`logging_headers` (app/project_http/, app/cors.py, app/access_log.py)."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from websockets.sync.client import connect as ws_connect

from shared.settings import Settings
from shared.tools.testing import Cluster
from tests.conftest import private_settings
from tests.e2e.conftest import ALICE, e2e_cluster
from tests.e2e.test_browser import Page, browser  # noqa: F401 - the fixture

LEAD_AGENT = Path(__file__).resolve().parents[2] / "shared" / "agent" / "lead_agent.py"

FASTAPI_APP = """
import asyncio, os
from contextlib import asynccontextmanager
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

EVENTS = os.path.join(os.path.dirname(__file__), "events.txt")


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
    """The FastAPI project served by one web process and one runs worker."""
    with project_cluster(settings, redis_url, template_database, fastapi_folder, {}) as c:
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
