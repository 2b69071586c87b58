"""Generative UI (docs/genui.md) against real web + worker processes serving
tests/fixtures/genui_project/langgraph.json: its `genui` graph (tests/graphs/genui_graph.py)
pushes a progress card, deletes it, and pushes a weather card attached to its answer; its
`ui.genui` (ui/weather.tsx + weather.css) is bundled with esbuild at the web's start.

The official `langgraph-sdk` streams the run (the `custom` ui events, `values` with `ui`) and
replays it with Last-Event-ID; httpx checks the routes (`POST /ui/{graph}`, the bundle's
files, auth, content types, caching, 404s); the real `@langchain/langgraph-sdk` in Node takes
LoadExternalComponent's fetch path and renders the component with React; headless Chromium
shows the chat page drawing the pushed components (screenshot tests/output/genui-*.png).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient

from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, ClusterFactory, human, run_sdk
from tests.e2e.test_browser import Page, browser  # noqa: F401 - the fixture

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "genui.md"
PROJECT = ROOT / "tests" / "fixtures" / "genui_project"
CACHE = ROOT / ".threadrun" / "genui"
"""esbuild and the bundles, kept between runs (the npm install happens once)."""
NODE_CACHE = ROOT / ".threadrun" / "genui-node-e2e"
NODE_PACKAGES = ["@langchain/langgraph-sdk@1.15.0", "react@18.3.1", "react-dom@18.3.1"]


@pytest.fixture(scope="module")
def genui(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """Web + one worker serving the genui project."""
    env = {"THREADRUN_CONFIG": str(PROJECT / "langgraph.json"), "THREADRUN_GENUI_DIR": str(CACHE)}
    with private_cluster("genui", env) as c:
        c.side_by_side(c.start_web, c.start_worker)
        yield c


def ui_events(parts: list[Any]) -> list[dict[str, Any]]:
    """The `custom` parts that are UI messages (ui / remove-ui), in order."""
    return [
        p.data for p in parts if p.event == "custom" and p.data.get("type") in ("ui", "remove-ui")
    ]


def test_a1_run_streams_ui_custom_events_and_the_state_has_ui(genui: Cluster) -> None:
    """A1: `push_ui_message` / `delete_ui_message` reach the SDK as `custom` events (the UI
    message itself, as the official server sends them), `values` carries the reduced `ui`,
    and the thread's state keeps it: the weather card, attached to the answer."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        parts = [
            p
            async for p in c.runs.stream(
                tid, "genui", input=human("weather in oslo?"), stream_mode=["custom", "values"]
            )
        ]
        events = ui_events(parts)
        assert [(e["type"], e.get("name")) for e in events] == [
            ("ui", "progress"),
            ("remove-ui", None),
            ("ui", "weather"),
        ]
        progress, removed, weather = events
        assert removed["id"] == progress["id"]
        assert weather["props"] == {"city": "Oslo", "temp": 4}
        values = [p.data for p in parts if p.event == "values"]
        assert [u["id"] for u in values[1]["ui"]] == [progress["id"]]  # after `fetch`
        final = values[-1]
        assert final["ui"] == [weather]
        assert weather["metadata"]["message_id"] == final["messages"][-1]["id"]
        state = await c.threads.get_state(tid)
        assert isinstance(state["values"], dict) and state["values"]["ui"] == [weather]

    run_sdk(scenario, genui.url)


def test_b4_join_with_last_event_id_replays_the_ui_events(genui: Cluster) -> None:
    """B4: a join with Last-Event-ID gets the events after it again, the UI ones included,
    with the same ids and data; from the start (`-1`) it gets all three."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        modes: list[Any] = ["custom", "values"]
        parts = [
            p async for p in c.runs.stream(tid, "genui", input=human("lima"), stream_mode=modes)
        ]
        run_id = parts[0].data["run_id"]
        first_ui = next(i for i, p in enumerate(parts) if p.event == "custom")
        cursor = parts[first_ui].id
        assert cursor
        rest = [
            p
            async for p in c.runs.join_stream(tid, run_id, stream_mode=modes, last_event_id=cursor)
        ]
        after = [(p.id, p.event, p.data) for p in parts[first_ui + 1 :]]
        assert [(p.id, p.event, p.data) for p in rest] == after
        assert [e["type"] for e in ui_events(rest)] == ["remove-ui", "ui"]
        full = [
            p async for p in c.runs.join_stream(tid, run_id, stream_mode=modes, last_event_id="-1")
        ]
        assert ui_events(full) == ui_events(parts)

    run_sdk(scenario, genui.url)


def test_post_ui_answers_the_tags_and_serves_the_bundle_files(genui: Cluster) -> None:
    """`POST /ui/genui` (authenticated) answers the official tags: the stylesheet link and
    the script whose onload renders the asked component; the files are public, typed,
    ETagged (304 on a match), immutable when asked for with their digest; an unknown graph
    or file is a 404, a body without `name` a 422; the chat page at /ui still works."""
    with httpx.Client(base_url=genui.url, timeout=30) as http:
        assert http.post("/ui/genui", json={"name": "weather"}).status_code == 401
        auth = {"x-api-key": ALICE}
        resp = http.post("/ui/genui", json={"name": "weather"}, headers=auth)
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].startswith("text/html")
        tags = resp.text
        css = re.search(
            r'<link rel="stylesheet" href="(/ui/genui/entrypoint\.css\?v=\w+)" />', tags
        )
        js = re.search(r'<script src="(/ui/genui/entrypoint\.js\?v=\w+)" onload=\'([^\']+)\'', tags)
        assert css and js, tags
        assert js.group(2) == '__LGUI_genui.render(&quot;weather&quot;, "{{shadowRootId}}")'

        script = http.get(js.group(1))  # no key: a <script src> sends none
        assert script.status_code == 200
        assert script.headers["content-type"] == "text/javascript; charset=utf-8"
        assert script.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert script.headers["x-content-type-options"] == "nosniff"
        assert "var __LGUI_genui" in script.text and 'Symbol.for("LGUI_REQUIRE")' in script.text
        etag = script.headers["etag"]
        plain = http.get("/ui/genui/entrypoint.js")
        assert plain.headers["cache-control"] == "no-cache" and plain.text == script.text
        again = http.get("/ui/genui/entrypoint.js", headers={"If-None-Match": etag})
        assert again.status_code == 304 and not again.content
        style = http.get(css.group(1))
        assert style.headers["content-type"] == "text/css; charset=utf-8"
        assert ".weather-card" in style.text

        missing = http.post("/ui/nope", json={"name": "weather"}, headers=auth)
        assert missing.status_code == 404 and "nope" in missing.text
        assert http.get("/ui/genui/other.js").status_code == 404
        assert http.get("/ui/nope/entrypoint.js").status_code == 404
        bad = http.post("/ui/genui", json={}, headers=auth)
        assert bad.status_code == 422 and "name" in bad.text
        assert http.get("/ui").status_code == 200
        assert http.get("/ui/static/chat.js").status_code == 200
        react = http.get("/ui/static/vendor/react.production.min.js")
        assert react.status_code == 200
        post = http.get("/openapi.json").json()["paths"]["/ui/{graph_id}"]["post"]
        assert "text/html" in post["responses"]["200"]["content"]


def test_the_docs_snippet_runs(genui: Cluster) -> None:
    """docs/genui.md's SDK block, as written, against the fixture project."""
    text = DOC.read_text()
    block = text.split("<!-- genui-snippet -->\n```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, Any] = {}
    exec(compile(block, str(DOC), "exec"), scope)  # our own documentation
    pushed = scope["asyncio"].run(scope["main"](genui.url, ALICE))
    assert [(u["type"], u.get("name")) for u in pushed] == [
        ("ui", "progress"),
        ("remove-ui", None),
        ("ui", "weather"),
    ]


def node_packages() -> Path:
    """A folder with the real @langchain/langgraph-sdk, react and react-dom (installed once,
    kept between runs)."""
    marker = NODE_CACHE / "installed.json"
    if not marker.is_file() or json.loads(marker.read_text()) != NODE_PACKAGES:
        npm = shutil.which("npm")
        assert npm, "the Node.js check needs npm on the PATH"
        NODE_CACHE.mkdir(parents=True, exist_ok=True)
        cmd = [npm, "install", "--prefix", str(NODE_CACHE), "--no-save", "--no-audit"]
        cmd += ["--no-fund", "--no-package-lock", "--ignore-scripts", "--loglevel=error"]
        subprocess.run([*cmd, *NODE_PACKAGES], check=True, timeout=300, capture_output=True)
        marker.write_text(json.dumps(NODE_PACKAGES))
    shutil.copy(PROJECT / "load_component.mjs", NODE_CACHE / "load_component.mjs")
    return NODE_CACHE


def test_the_react_ui_package_loads_and_renders_the_component_in_node(genui: Cluster) -> None:
    """LoadExternalComponent's fetch path with the real `@langchain/langgraph-sdk`: its
    Client posts /ui/genui {name}, the bundle the tags name runs against the globals the
    react-ui entry installs, and the component it hands over renders with React."""
    folder = node_packages()
    props = {"city": "Paris", "temp": 21}
    args = [genui.url, ALICE, "genui", "weather", json.dumps(props)]
    done = subprocess.run(
        ["node", "load_component.mjs", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["type"] == "text/javascript; charset=utf-8"
    assert 'data-testid="weather-card"' in out["markup"]
    assert '<span class="city">Paris</span><span class="temp">21°C</span>' in out["markup"]


def test_the_chat_page_renders_the_pushed_components(genui: Cluster, browser: Any) -> None:  # noqa: F811
    """The chat page draws the thread's UI messages with the bundle: the weather card after
    the answer it is attached to (the deleted progress card gone), live and after a reload,
    inside its shadow root with the bundle's stylesheet, and interactive (React state)."""
    page = Page(browser, genui.url)
    console: list[str] = []
    page.page.on(
        "console", lambda m: console.append(f"{m.text} {m.location}") if m.type == "error" else None
    )
    try:
        page.wait(
            "Array.from(document.querySelectorAll('#assistant option'))"
            ".some(o => o.textContent === 'genui')",
            what="the assistants",
        )
        page.new_thread()  # the page opened the newest thread of the tests above
        page.page.select_option("#assistant", label="genui")
        page.page.fill("#input", "What is the weather in Paris?")
        page.page.keyboard.press("Enter")
        page.wait(
            "window.threadrunTest.genui().some(u => u.name === 'weather' && u.text.includes('21°C'))",
            what="the weather card",
        )
        page.wait_state("done")
        shown = page.js("window.threadrunTest.genui()")
        assert [(u["name"], u["error"]) for u in shown] == [("weather", None)], shown
        order = page.js(
            "Array.from(document.querySelectorAll('#transcript > li')).map(li =>"
            " li.classList.contains('genui') ? 'ui' : li.dataset.type)"
        )
        assert order == ["human", "ai", "ui"]
        color = page.js(
            "getComputedStyle(document.querySelector('li.genui .genui-host').shadowRoot"
            ".querySelector('.weather-card')).color"
        )
        assert color == "rgb(255, 255, 255)"  # weather.css, through the bundle's <link>
        page.page.locator("li.genui button").click()
        page.wait("window.threadrunTest.genui()[0].text.includes('70°F')", what="the unit toggled")
        page.screenshot("weather-card", prefix="genui")
        page.page.reload()
        page.wait("window.threadrunTest.ready()", what="the reloaded page")
        page.wait(
            "window.threadrunTest.genui().some(u => u.text.includes('Paris'))",
            what="the card from the thread's state",
        )
        assert console == [], console  # no CSP violation, no failed load
    finally:
        page.close()
