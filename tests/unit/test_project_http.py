"""The pure parts of langgraph.json's `http` section: which rule each `disable_*` flag
removes, the header rules of the access log, the CORS policy, the mount prefix's path
moves, the refusals of a bad `http.app` (naming the key and the file), and which upgrades
are the ASGI app's WebSocket routes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from a2wsgi.asgi import build_scope
from flask import Flask, redirect

from app.access_log import filter_atoms, header_allowed
from app.cors import CorsPolicy
from app.project_http import ProjectHttp
from app.project_http.custom import FlaskApp, StarletteApp, load_custom_app
from app.project_http.routes import disabled_groups, remove_disabled, section_of
from app.project_http.websocket import is_upgrade, websocket_scope
from shared.project import HeaderRules, HttpSection, ProjectConfigError, parse_project
from shared.settings import Settings


@pytest.mark.parametrize(
    ("rule", "group"),
    [
        ("/assistants", "assistants"),
        ("/assistants/<assistant_id>/graph", "assistants"),
        ("/threads", "threads"),
        ("/threads/<thread_id>/state", "threads"),
        ("/threads/<thread_id>/stream", "threads"),
        ("/threads/<thread_id>/compact", "threads"),
        ("/threads/<thread_id>/runs", "runs"),
        ("/threads/<thread_id>/runs/<run_id>/join", "runs"),
        ("/threads/<thread_id>/runs/crons", "runs"),
        ("/runs/wait", "runs"),
        ("/runs/crons/search", "runs"),
        ("/ws", "runs"),
        ("/threads/<thread_id>/ws", "runs"),
        ("/store/items", "store"),
        ("/openapi.json", "meta"),
        ("/info", "meta"),
        ("/metrics", "meta"),
        ("/ok", None),
        ("/", "ui"),
        ("/ui/static/<path:filename>", "ui"),
        ("/ops/api/runs", None),
        ("/memory/facts", None),
        ("/storefront", None),
        ("/a2a/<assistant_id>", "a2a"),
        ("/a2a/<assistant_id>/.well-known/agent-card.json", "a2a"),
        ("/.well-known/agent-card.json", "a2a"),
    ],
)
def test_section_of(rule: str, group: str | None) -> None:
    """Each threadrun rule falls in the official group its `disable_*` flag removes."""
    assert section_of(rule) == group


def test_disabled_groups_and_removal() -> None:
    """The flags name groups; removing them rebuilds the url map without their rules."""
    http = HttpSection(disable_store=True, disable_meta=True, disable_mcp=True)
    groups = disabled_groups(http)
    assert groups == {"store", "meta", "mcp"}
    app = Flask(__name__)
    app.add_url_rule("/store/items", "store_items", lambda: "s")
    app.add_url_rule("/info", "info", lambda: "i")
    app.add_url_rule("/ok", "ok", lambda: "ok")
    app.add_url_rule("/ws", "ws", lambda: "ws", websocket=True)
    before = {r.rule: r for r in app.url_map.iter_rules()}
    assert sorted(remove_disabled(app, groups)) == ["/info", "/store/items"]
    client = app.test_client()
    assert client.get("/store/items").status_code == 404
    assert client.get("/ok").text == "ok"
    assert client.options("/ok").headers["Allow"]  # Flask's automatic OPTIONS is kept
    after = {r.rule: r for r in app.url_map.iter_rules()}
    for name in ("/ok", "/ws"):
        old, new = before[name], after[name]
        assert (new.websocket, new.methods, new.merge_slashes, new.strict_slashes) == (
            old.websocket,
            old.methods,
            old.merge_slashes,
            old.strict_slashes,
        )
        assert getattr(new, "provide_automatic_options", None) == getattr(
            old, "provide_automatic_options", None
        )


@pytest.mark.parametrize(
    ("name", "rules", "allowed"),
    [
        ("user-agent", None, True),
        ("X-Api-Key", None, False),  # credentials: never
        ("authorization", HeaderRules(includes=["*"]), False),
        ("user-agent", HeaderRules(excludes=["user-*"]), False),
        ("x-trace", HeaderRules(includes=["x-*"], excludes=["x-secret*"]), True),
        ("x-secret-token", HeaderRules(includes=["x-*"], excludes=["x-secret*"]), False),
        ("referer", HeaderRules(includes=["x-*"]), False),
    ],
)
def test_header_allowed(name: str, rules: HeaderRules | None, allowed: bool) -> None:
    """excludes first, then includes (all when unset), case-insensitive wildcards."""
    assert header_allowed(name, rules) is allowed


def test_filter_atoms() -> None:
    """gunicorn's header atoms (`a`, `f`, `{h}i`, `{http_h}e`) become "-" when refused."""
    atoms: dict[str, Any] = {
        "a": "curl",
        "f": "https://ref",
        "{x-trace}i": "t",
        "{x-api-key}i": "k",
        "{http_user_agent}e": "curl",
        "{path_info}e": "/x",
        "s": 200,
    }
    out = filter_atoms(atoms, HeaderRules(excludes=["user-agent"]))
    assert out == {**atoms, "a": "-", "{x-api-key}i": "-", "{http_user_agent}e": "-"}


def test_cors_policy_from_the_project_wins() -> None:
    """http.cors replaces THREADRUN_CORS_ORIGINS; the regex matches whole origins."""
    settings = Settings(cors_origins="https://env.example")
    assert CorsPolicy.build(settings, None).origins == ["https://env.example"]
    section = parse_cors(
        {"allow_origins": ["https://a.example/"], "allow_origin_regex": r"https://.*\.b\.example"}
    )
    policy = CorsPolicy.build(settings, section)
    assert policy.lists("https://a.example") and policy.lists("https://x.b.example")
    assert not policy.lists("https://env.example")
    assert not policy.lists("https://x.b.example.evil")
    assert policy.methods == ["GET"] and "Content-Type" in policy.headers
    assert "http.cors" in policy.source


def parse_cors(raw: dict[str, Any]) -> Any:
    """A CorsSection through the project model."""
    return HttpSection.model_validate({"cors": raw}).cors


def project_with(tmp_path: Path, spec: str, source: str) -> Path:
    """A langgraph.json whose http.app is `spec`, with `source` as app.py."""
    (tmp_path / "app_mod.py").write_text(source)
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"g": "./g.py:graph"}, "http": {"app": spec}}))
    return path


@pytest.mark.parametrize(
    ("spec", "source", "needle"),
    [
        ("./app_mod.py:app", "app = object()\n", "neither a Starlette/FastAPI (ASGI) nor a Flask"),
        ("./app_mod.py:app", "def app(environ, start_response):\n    return []\n", "neither"),
        ("./app_mod.py:nothing", "app = 1\n", "no variable 'nothing'"),
        ("./missing.py:app", "", "missing.py"),
    ],
)
def test_bad_http_app_stops_the_start(tmp_path: Path, spec: str, source: str, needle: str) -> None:
    """A `http.app` that is no app, or no variable, is a ProjectConfigError naming the key
    and the file."""
    path = project_with(tmp_path, spec, source)
    with pytest.raises(ProjectConfigError) as exc:
        load_custom_app(parse_project(path))
    message = str(exc.value)
    assert "'http.app'" in message and str(path) in message and needle in message


def test_apps_are_classified(tmp_path: Path) -> None:
    """A Flask app is WSGI, a FastAPI app ASGI."""
    flask_src = "from flask import Flask\napp = Flask('x')\n"
    assert isinstance(
        load_custom_app(parse_project(project_with(tmp_path, "./app_mod.py:app", flask_src))),
        FlaskApp,
    )
    fast_src = "from fastapi import FastAPI\napi = FastAPI()\n"
    (tmp_path / "fast_mod.py").write_text(fast_src)
    found = load_custom_app(parse_project(project_with(tmp_path, "./fast_mod.py:api", flask_src)))
    assert isinstance(found, StarletteApp)
    assert not [r for r in found.routes if getattr(r, "path", "") == "/openapi.json"]
    found.close()


def test_failed_lifespan_stops_the_start(tmp_path: Path) -> None:
    """A FastAPI app whose lifespan startup raises: ProjectConfigError naming the key,
    the file and the app's error."""
    src = (
        "from contextlib import asynccontextmanager\n"
        "from fastapi import FastAPI\n"
        "@asynccontextmanager\n"
        "async def lifespan(app):\n"
        "    raise RuntimeError('no database for the custom app')\n"
        "    yield\n"
        "app = FastAPI(lifespan=lifespan)\n"
    )
    path = project_with(tmp_path, "./app_mod.py:app", src)
    custom = load_custom_app(parse_project(path))
    assert custom is not None
    with pytest.raises(ProjectConfigError) as exc:
        custom.start()
    message = str(exc.value)
    assert "'http.app'" in message and str(path) in message and "no database" in message
    custom.close()


def test_mount_prefix_moves_the_path_and_relocates() -> None:
    """Under the prefix: SCRIPT_NAME gets it, relative Locations get it; outside: 404 but /ok."""
    app = Flask(__name__)
    app.add_url_rule("/ok", "ok", lambda: "ok")
    app.add_url_rule("/where", "where", lambda: __import__("flask").request.script_root)
    app.add_url_rule("/go", "go", lambda: redirect("/where"))
    app.wsgi_app = ProjectHttp(app, app.wsgi_app, HttpSection(mount_prefix="/api"), None)  # type: ignore[method-assign]
    client = app.test_client()
    assert client.get("/api/where").text == "/api"
    assert client.get("/api/go").headers["Location"] == "/api/where"
    assert client.get("/where").status_code == 404
    assert client.get("/ok").text == "ok" and client.get("/api/ok").text == "ok"
    assert re.search("under /api/", client.get("/nope").text)


def test_p4_websocket_routes_are_matched_as_websocket_scopes(tmp_path: Path) -> None:
    """P4: an upgrade is the ASGI app's when one of its WebSocket routes (or a Mount)
    matches it as a `websocket` scope; an HTTP route at that path does not take it. The
    scope carries the path under the prefix, root_path, query and offered subprotocols."""
    src = (
        "from fastapi import FastAPI, WebSocket\n"
        "app = FastAPI()\n"
        "@app.websocket('/live/{room}')\n"
        "async def live(websocket: WebSocket, room: str):\n"
        "    await websocket.close()\n"
        "@app.get('/plain')\n"
        "async def plain():\n"
        "    return {}\n"
    )
    custom = load_custom_app(parse_project(project_with(tmp_path, "./app_mod.py:app", src)))
    assert isinstance(custom, StarletteApp)
    try:
        environ = {
            "REQUEST_METHOD": "GET",
            "SCRIPT_NAME": "/api",
            "PATH_INFO": "/live/r1",
            "QUERY_STRING": "a=1",
            "SERVER_NAME": "localhost",
            "SERVER_PORT": "80",
            "wsgi.url_scheme": "https",
            "HTTP_UPGRADE": "websocket",
            "HTTP_SEC_WEBSOCKET_PROTOCOL": "one, two",
        }
        assert is_upgrade(environ)
        assert custom.matches_websocket(environ)
        assert not custom.matches_websocket({**environ, "PATH_INFO": "/plain"})
        assert not custom.matches_websocket({**environ, "PATH_INFO": "/other"})
        assert not is_upgrade({**environ, "HTTP_UPGRADE": "h2c"})
        assert not FlaskApp(Flask(__name__)).matches_websocket(environ)
        scope = websocket_scope(dict(build_scope(environ)))  # type: ignore[arg-type]
        assert scope["type"] == "websocket" and scope["scheme"] == "wss"
        assert (scope["path"], scope["root_path"]) == ("/api/live/r1", "/api")
        assert scope["query_string"] == b"a=1" and "method" not in scope
        assert scope["subprotocols"] == ["one", "two"]
        assert scope["extensions"] == {"websocket.http.response": {}}
    finally:
        custom.close()
