"""The web chat page (/ui) in headless Chromium against real gunicorn + Celery processes.

Driven by the `playwright` Python package with the system Chromium (`/usr/bin/chromium`;
Playwright's own browser download is never used). The page talks the WebSocket protocol of
A2 and recovers like SPEC B9 says; `window.threadrunTest` (app/static/chat.js) lets a test
drop the socket and read what the page applied. Every scenario saves a screenshot under
tests/output/.

Knobs of the built-in model reach the page as debug query parameters (`?tokens=&delay=`,
sent as `config.configurable`). The built-in model numbers its filler tokens (`t0005`…), so
a duplicated or missing token is visible in the text. The gap scenarios use a second
cluster with `THREADRUN_STREAM_MAXLEN=5`.

The page is tested under its own Content-Security-Policy (no `bypass_csp`): waits poll with
`page.evaluate`, which CSP does not restrict, instead of `wait_for_function`, which it does.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, ClusterFactory

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OUTPUT = Path(__file__).resolve().parents[1] / "output"
TINY = {
    "THREADRUN_STREAM_MAXLEN": "5",
    "THREADRUN_STREAM_HEARTBEAT_S": "1",
    "THREADRUN_SHUTDOWN_GRACE_S": "1",
}
FILLER = re.compile(r"^t(\d{4})$")


# --- the browser -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless system Chromium. Missing Chromium or playwright fails loudly, never skips."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the browser tests need the `playwright` package (dev extra): "
            ".venv/bin/pip install -e '.[dev]'",
            pytrace=False,
        )
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"the browser tests need Chromium at {CHROMIUM}: run `apt-get install -y chromium` "
            "as root (make test-e2e does it when root and apt-get are available)",
            pytrace=False,
        )
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def tiny(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """Web + one worker keeping 5 events per run (B3), on its own database and Redis prefix."""
    with private_cluster("ui-tiny", TINY) as c:
        yield c.start(workers=["ui-tiny"])


class Page:
    """One chat page in a fresh browser context (its own localStorage)."""

    def __init__(
        self,
        browser: Any,
        base: str,
        *,
        key: str = ALICE,
        phone: bool = False,
        **params: Any,
    ) -> None:
        self.base = base
        if phone:  # a phone's width (390x844 CSS pixels), touch, 2x pixels
            self.context = browser.new_context(
                viewport={"width": 390, "height": 844},
                device_scale_factor=2,
                is_mobile=True,
                has_touch=True,
            )
        else:
            self.context = browser.new_context(viewport={"width": 1280, "height": 860})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        query = urlencode({"api_key": key, **params})
        self.page.goto(f"{base}/?{query}")  # / redirects to /ui, keeping the query
        self.wait("window.threadrunTest && window.threadrunTest.ready()", what="the page to load")

    def js(self, expr: str) -> Any:
        return self.page.evaluate(expr)

    def wait(self, expr: str, timeout: float = 30, what: str = "") -> Any:
        """Poll a JS expression until it is truthy (evaluate works under the page's CSP)."""
        end = time.monotonic() + timeout
        while True:
            value = self.js(expr)
            if value:
                return value
            if time.monotonic() > end:
                status = self.js("window.threadrunTest && window.threadrunTest.status()")
                raise AssertionError(f"timed out waiting for {what or expr}; page status {status}")
            time.sleep(0.03)

    def state(self) -> str:
        return str(self.js("window.threadrunTest.status().state"))

    def stats(self) -> dict[str, Any]:
        return dict(self.js("window.threadrunTest.stats()"))

    def new_thread(self) -> None:
        """A new chat: no thread until its first message is sent."""
        self.page.click("#new-thread")
        self.wait("window.threadrunTest.threadId() === null", what="a new chat")
        self.wait("!document.querySelector('#send').disabled", what="the composer")

    def send(self, text: str) -> str:
        """Send `text`; the thread id (created by the first message of a new chat)."""
        self.page.fill("#input", text)
        self.page.keyboard.press("Enter")
        self.wait("window.threadrunTest.runId()", what="run.created")
        return str(self.js("window.threadrunTest.threadId()"))

    def wait_state(self, state: str, timeout: float = 45) -> None:
        self.wait(f"window.threadrunTest.status().state === {state!r}", timeout, f"state {state}")

    def transcript(self) -> list[dict[str, Any]]:
        return list(self.js("window.threadrunTest.transcript()"))

    def screenshot(self, name: str, prefix: str = "browser") -> Path:
        OUTPUT.mkdir(parents=True, exist_ok=True)
        path = OUTPUT / f"{prefix}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        self.context.close()
        assert not self.errors, f"uncaught errors in the page: {self.errors}"


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    pages: list[Page] = []

    def opener(base: str, **params: Any) -> Page:
        p = Page(browser, base, **params)
        pages.append(p)
        return p

    yield opener
    for p in pages:
        p.close()


# --- helpers -----------------------------------------------------------------------------------


def api(base: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"x-api-key": ALICE}, timeout=30)


def durable(base: str, thread_id: str) -> list[dict[str, Any]]:
    with api(base) as c:
        resp = c.get(f"/threads/{thread_id}/state")
    resp.raise_for_status()
    return list(resp.json()["values"]["messages"])


def shown(messages: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(id, type, text) of what the page should show for these state messages."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = "".join(b.get("text", "") for b in content if isinstance(b, dict))
        out.append((m["id"], m["type"], content))
    return out


def rendered(page: Page) -> list[tuple[str, str, str]]:
    items = page.transcript()
    assert not any(i["live"] for i in items), "a partial message is still on screen"
    return [(i["id"], i["type"], i["content"]) for i in items]


def run_status(base: str, thread_id: str, run_id: str) -> str:
    with api(base) as c:
        return str(c.get(f"/threads/{thread_id}/runs/{run_id}").json()["status"])


def id_key(event_id: str) -> tuple[int, int]:
    ms, seq = event_id.split("-")
    return int(ms), int(seq)


def assert_exact_stream(page: Page) -> dict[str, Any]:
    """B4 as the page saw it: event ids strictly increasing, nothing dropped as a duplicate."""
    stats = page.stats()
    ids = stats["eventIds"]
    assert stats["duplicates"] == [], f"the server re-sent events: {stats['duplicates']}"
    assert [id_key(i) for i in ids] == sorted({id_key(i) for i in ids}), "ids not increasing"
    return stats


def assert_numbered_reply(text: str, tokens: int) -> None:
    """The built-in reply has exactly `tokens` words; its filler t0005… is gapless."""
    words = text.split(" ")
    assert len(words) == tokens, f"{len(words)} words instead of {tokens}: {text!r}"
    filler = [int(m.group(1)) for w in words if (m := FILLER.match(w))]
    assert filler, text
    assert filler == list(range(filler[0], tokens)), f"missing or repeated tokens: {text!r}"


# --- scenarios ---------------------------------------------------------------------------------


def test_b4_b9_dropped_socket_resumes_with_no_duplicate_or_missing_token(
    cluster: Cluster, open_page: Any
) -> None:
    """B4, B9, A2: the socket dies mid-reply; the page shows "reconnecting…", reconnects with
    back-off and run.join(last_event_id); every token arrives exactly once."""
    tokens = 60
    page = open_page(cluster.url, tokens=tokens, delay=25)
    page.new_thread()
    tid = page.send("hello from the browser")
    page.wait("window.threadrunTest.stats().chunks >= 12", what="a dozen tokens")
    at_drop = page.stats()["chunks"]
    last_before = page.js("window.threadrunTest.lastEventId()")
    assert page.js("window.threadrunTest.dropSocket({holdMs: 700})")
    page.wait_state("reconnecting", timeout=5)
    page.screenshot("1-reconnecting")
    page.wait_state("done")
    page.screenshot("1-resumed-done")

    stats = assert_exact_stream(page)
    assert stats["opens"] >= 2, "the page never reconnected"
    assert at_drop < tokens, "the run had already finished when the socket dropped"
    assert stats["chunks"] == tokens, "tokens were lost or repeated across the reconnect"
    assert last_before in stats["eventIds"]
    assert stats["statuses"][-3:] == ["reconnecting", "streaming", "done"]
    assert stats["gaps"] == 0
    messages = durable(cluster.url, tid)
    reply = messages[-1]
    assert reply["type"] == "ai"
    streamed = page.js("window.threadrunTest.streamed()")
    assert streamed[reply["id"]] == reply["content"], "the streamed text differs from the state"
    assert_numbered_reply(streamed[reply["id"]], tokens)
    assert rendered(page) == shown(messages)


def test_b5_b9_gap_drops_partial_text_reloads_state_and_finishes(
    tiny: Cluster, open_page: Any
) -> None:
    """B5, B9: the page misses more events than the stream retains (5); the rejoin gets a
    `gap`; the page drops its partial text, reloads GET /threads/{id}/state, shows
    "view incomplete — reloaded", rejoins after latest_available_event_id and the run ends."""
    tokens = 80
    page = open_page(tiny.url, tokens=tokens, delay=50)
    page.new_thread()
    tid = page.send("hello gap")
    page.wait("window.threadrunTest.stats().chunks >= 5", what="first tokens")
    assert page.js("window.threadrunTest.dropSocket({holdMs: 1000})")
    page.wait_state("incomplete", timeout=15)
    assert page.js("window.threadrunTest.following()"), "the run ended before the gap test"
    # The partial reply was dropped: what streams now starts mid-reply, never at "(turn 1)".
    assert not any(i["live"] and "(turn" in i["content"] for i in page.transcript())
    label = page.js("document.querySelector('#run-status').textContent")
    assert label == "view incomplete — reloaded"
    page.screenshot("2-view-incomplete")
    page.wait_state("done")
    page.screenshot("2-gap-then-done")

    stats = assert_exact_stream(page)
    assert stats["gaps"] >= 1 and "incomplete" in stats["statuses"]
    assert stats["statuses"][-1] == "done"
    assert stats["chunks"] < tokens, "no event was missed: the gap was not provoked"
    messages = durable(tiny.url, tid)
    assert rendered(page) == shown(messages)
    assert_numbered_reply(messages[-1]["content"], tokens)


def test_b9_three_consecutive_gaps_show_an_error_and_the_page_stays_usable(
    tiny: Cluster, open_page: Any
) -> None:
    """B9: every rejoin misses events again; after 3 consecutive gaps the page says "error"
    (not "cancelled"), the run still succeeds, the transcript reloads when it ends, and the
    composer works for the next message."""
    page = open_page(tiny.url, tokens=100, delay=40)
    page.new_thread()
    page.js("window.threadrunTest.holdRejoins(700)")  # ~17 events per hold; 5 are kept
    tid = page.send("hello three gaps")
    page.wait("window.threadrunTest.stats().chunks >= 5", what="first tokens")
    run_id = page.js("window.threadrunTest.runId()")
    assert page.js("window.threadrunTest.dropSocket({holdMs: 700})")
    page.wait_state("error", timeout=20)
    assert page.stats()["gaps"] == 3
    detail = page.js("window.threadrunTest.status().detail")
    assert "3 times in a row" in detail
    assert run_status(tiny.url, tid, run_id) == "running", "the run must keep going"
    assert not page.js("document.querySelector('#send').disabled"), "the composer is locked"
    page.screenshot("2b-three-gaps-error")
    # The run ends on the server; the page reloads the durable transcript by itself.
    page.wait("window.threadrunTest.status().detail.includes('ended with status success')")
    assert page.state() == "error"
    assert rendered(page) == shown(durable(tiny.url, tid))
    # And the page is still usable: the next message streams (then we stop it).
    page.js("window.threadrunTest.holdRejoins(0)")
    before = page.stats()["chunks"]
    page.send("and again")
    page.wait(f"window.threadrunTest.stats().chunks > {before}", what="the next reply")
    assert page.state() == "streaming"
    page.page.click("#stop")
    page.wait_state("cancelled")
    messages = durable(tiny.url, tid)
    assert [m["type"] for m in messages][:3] == ["human", "ai", "human"]
    assert rendered(page) == shown(messages)


def test_a2_b9_final_transcript_equals_durable_state_with_tool_calls_and_artifacts(
    cluster: Cluster, open_page: Any
) -> None:
    """A2, B9: tool calls and tool results show while the run streams; after `end` the page
    renders GET /threads/{id}/state, and what it shows equals the state's messages."""
    page = open_page(cluster.url, tokens=30, delay=20)
    page.new_thread()
    tid = page.send("please write a report")
    # While streaming: the tool call by name, then its result with the artifact.
    page.wait(
        "window.threadrunTest.transcript().some(m => m.type === 'tool')",
        what="the tool result",
    )
    assert page.js("window.threadrunTest.following()"), "the run ended before the tool showed"
    calls = [c for m in page.transcript() for c in m["toolCalls"]]
    assert any("write_artifact" in c for c in calls)
    page.wait_state("done")
    page.send("thanks")
    page.wait_state("done")
    page.screenshot("3-final-transcript")

    messages = durable(cluster.url, tid)
    assert [m["type"] for m in messages] == ["human", "ai", "tool", "ai", "human", "ai"]
    assert rendered(page) == shown(messages)
    assert page.js("document.querySelector('.artifact-card .a-name').textContent") == (
        "outputs/report.md"
    )
    assert page.js("document.querySelector('#artifacts .open-artifact').dataset.path") == (
        "outputs/report.md"
    )
    assert_exact_stream(page)
    # The thread list shows the thread under its first message.
    assert "please write a report" in page.js(
        f"document.querySelector('[data-thread-id=\"{tid}\"]').textContent"
    )


def test_r5_stop_button_cancels_the_run(cluster: Cluster, open_page: Any) -> None:
    """R5, B9: the stop button interrupts the run; the page shows "cancelled" (a different
    state from "view incomplete") and the durable transcript."""
    page = open_page(cluster.url, tokens=400, delay=25)
    page.new_thread()
    tid = page.send("a long answer please")
    page.wait("window.threadrunTest.stats().chunks >= 5", what="first tokens")
    run_id = page.js("window.threadrunTest.runId()")
    page.page.click("#stop")
    page.wait_state("cancelled", timeout=20)
    page.screenshot("4-cancelled")
    assert run_status(cluster.url, tid, run_id) == "interrupted"
    assert "incomplete" not in page.stats()["statuses"]
    assert page.js("document.querySelector('#stop').hidden")
    assert rendered(page) == shown(durable(cluster.url, tid))


def test_b4_sse_fallback_resumes_with_last_event_id(cluster: Cluster, open_page: Any) -> None:
    """A1, B4: the SSE transport (the page's fallback when no socket opens) resumes a dropped
    stream with Last-Event-ID, exactly."""
    tokens = 50
    page = open_page(cluster.url, tokens=tokens, delay=25, transport="sse")
    page.new_thread()
    tid = page.send("hello over sse")
    page.wait("window.threadrunTest.stats().chunks >= 10", what="first tokens")
    assert page.js("window.threadrunTest.dropSocket({holdMs: 300})")
    page.wait_state("done")
    page.screenshot("5-sse-resumed")
    stats = assert_exact_stream(page)
    assert page.js("window.threadrunTest.transport()") == "sse"
    assert stats["opens"] >= 2 and "reconnecting" in stats["statuses"]
    assert stats["chunks"] == tokens
    messages = durable(cluster.url, tid)
    assert rendered(page) == shown(messages)
    assert_numbered_reply(messages[-1]["content"], tokens)


def test_a4_the_page_asks_for_a_key_and_shows_only_its_users_threads(
    cluster: Cluster, open_page: Any
) -> None:
    """A4: a wrong key gets a visible prompt, not a broken page; the page serves no data."""
    page = open_page(cluster.url)
    page.page.goto(f"{cluster.url}/ui?api_key=wrong")
    page.wait("!document.querySelector('#banner').hidden", what="the key prompt")
    assert "API key" in page.js("document.querySelector('#banner').textContent")
    assert page.js("document.querySelectorAll('#thread-list li').length") == 0
    with httpx.Client(base_url=cluster.url) as c:
        resp = c.get("/ui")
        assert (
            resp.status_code == 200
            and "script-src 'self'" in resp.headers["content-security-policy"]
        )
        assert c.get("/ui/static/chat.js").status_code == 200
        assert c.get("/ui/static/%2e%2e/__init__.py").status_code == 404
        assert c.get("/ui/static/index.html").status_code == 200
