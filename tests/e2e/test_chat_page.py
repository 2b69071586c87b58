"""The chat page as a product, in headless Chromium against real web + worker
processes: Markdown with code blocks, tool cards, artifact preview and download, thread
rename/delete/search with titles from the first message (SDK-made threads too), a composer
that works on first visit, the phone layout with its thread drawer, model errors in the
transcript with Retry, over-size input refused before sending (and the WebSocket's own
reason when it is sent anyway), and the debug footer only with `?debug=1`.

The cluster serves the built-in `lead_agent` and `markdown_chat` (tests/e2e/chat_graph.py:
fixed Markdown streamed token by token; a message containing "fail" fails its first time).
Every scenario saves screenshots as tests/output/chat-*.png (desktop and phone width).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.testing import Cluster
from tests.e2e.conftest import ALICE, BOB, ClusterFactory
from tests.e2e.test_browser import Page, browser  # noqa: F401 - the fixture

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GRAPH_FILE = Path(__file__).with_name("chat_graph.py")
CAROL = "key-carol"  # a user of this module's cluster only: first visit, no thread


@pytest.fixture(scope="module")
def chat(
    private_cluster: ClusterFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Web + one worker serving lead_agent and markdown_chat."""
    folder = tmp_path_factory.mktemp("chat-config")
    config = folder / "langgraph.json"
    graphs = {
        "lead_agent": f"{ROOT / 'shared/agent/lead_agent.py'}:graph",
        "markdown_chat": f"{GRAPH_FILE}:graph",
    }
    config.write_text(json.dumps({"graphs": graphs}))
    env = {
        "THREADRUN_CONFIG": str(config),
        "THREADRUN_API_KEYS": f"{ALICE}:alice,{BOB}:bob,{CAROL}:carol",
    }
    with private_cluster("chat-page", env) as c:
        c.start_web()
        c.start_worker()
        yield c


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:  # noqa: F811 - the imported fixture
    pages: list[Page] = []

    def opener(base: str, **kw: Any) -> Page:
        p = Page(browser, base, **kw)
        pages.append(p)
        return p

    yield opener
    for p in pages:
        p.close()


def api(base: str, key: str = ALICE) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"x-api-key": key}, timeout=30)


def shot(page: Page, name: str) -> Path:
    return page.screenshot(name, prefix="chat")


def pick(page: Page, assistant: str) -> None:
    page.wait(
        f"Array.from(document.querySelectorAll('#assistant option')).some(o => o.textContent === {assistant!r})",
        what="the assistants",
    )
    page.page.select_option("#assistant", label=assistant)


def send(page: Page, text: str) -> None:
    page.page.fill("#input", text)
    page.page.keyboard.press("Enter")


def sdk_thread(base: str, text: str, key: str = ALICE) -> str:
    """A thread made over HTTP like the SDK does (no title metadata), answered once."""
    with api(base, key) as c:
        tid = str(c.post("/threads", json={}).json()["thread_id"])
        body = {
            "assistant_id": "lead_agent",
            "input": {"messages": [{"role": "user", "content": text}]},
        }
        c.post(
            f"/threads/{tid}/runs/wait", json={**body, "config": {"configurable": {"tokens": 8}}}
        )
    return tid


# --- scenarios ---------------------------------------------------------------------------------


def test_first_visit_composer_streams_markdown_with_a_code_block(
    chat: Cluster, open_page: Any
) -> None:
    """A1: a first-time user types at once (no "+ New thread"); the first message makes
    the thread and titles it; the answer's Markdown renders progressively while it streams,
    with a code block (language, Copy) and nothing unsafe."""
    page = open_page(chat.url, key=CAROL)
    assert page.js("window.threadrunTest.threadId()") is None
    assert page.js("!document.querySelector('#welcome').hidden"), "no welcome on first visit"
    assert not page.js("document.querySelector('#input').disabled")
    assert not page.js("document.querySelector('#send').disabled")
    assert page.js("document.querySelector('#footer').hidden"), "the debug footer shows"
    shot(page, "1-first-visit-desktop")

    pick(page, "markdown_chat")
    send(page, "How should I cache prices?")
    page.wait_state("done")
    tid = page.js("window.threadrunTest.threadId()")
    assert tid, "the first message did not create a thread"
    stats = page.stats()
    assert stats["chunks"] > 20 and stats["liveRenders"] >= 2, stats
    assert page.js("document.querySelector('.msg-ai .md h2').textContent") == "Caching, briefly"
    assert page.js("document.querySelector('.msg-ai .code .code-lang').textContent") == "python"
    code = page.js("document.querySelector('.msg-ai .code pre').textContent")
    assert "@lru_cache(maxsize=1024)\ndef price(sku: str) -> int:" in code
    assert page.js("document.querySelectorAll('.msg-ai .md ol li').length") == 3
    assert page.js("document.querySelector('#thread-title').textContent") == (
        "How should I cache prices?"
    )
    with api(chat.url, CAROL) as c:
        assert c.get(f"/threads/{tid}").json()["metadata"]["title"] == "How should I cache prices?"
    shot(page, "2-markdown-desktop")

    # What the model writes is sanitized: no handler or script survives.
    pick(page, "lead_agent")
    send(page, 'look <img src="x" onerror="window.pwned=1"> and <script>window.pwned=2</script>')
    page.wait_state("done")
    assert page.js("document.querySelectorAll('.md [onerror], .md script').length") == 0
    assert page.js("window.pwned === undefined")


def test_tool_calls_and_results_are_cards_and_artifacts_open(chat: Cluster, open_page: Any) -> None:
    """A1: a tool call shows its name and arguments (not raw JSON); its result is a
    collapsed card that expands; the artifact opens in a preview (Markdown rendered) and
    downloads with its own bytes."""
    page = open_page(chat.url, tokens=12)
    page.new_thread()
    pick(page, "lead_agent")
    tid = page.send("please write a report")
    page.wait_state("done")
    call = page.js(
        "Array.from(document.querySelectorAll('.tool-call')).map(c => ({"
        "name: c.querySelector('.tc-name').textContent,"
        "keys: Array.from(c.querySelectorAll('dt')).map(d => d.textContent)}))"
    )
    assert call == [{"name": "write_artifact", "keys": ["filename", "content"]}]
    assert page.js("document.querySelector('.msg-tool details').open") is False
    page.page.click(".msg-tool summary")
    result = page.js("document.querySelector('.msg-tool .tc-result pre').textContent")
    assert json.loads(result)["path"] == "outputs/report.md"
    assert "\n" in result, "the result is not pretty-printed"
    shot(page, "3-tool-cards-desktop")

    with api(chat.url) as c:
        body = c.get(f"/threads/{tid}/artifacts/outputs/report.md").content
    page.page.click(".artifact-card .open-artifact")
    page.wait("!document.querySelector('#preview').hidden", what="the preview")
    page.wait("document.querySelector('#preview-body .md')", what="the rendered report")
    first_heading = body.decode().splitlines()[0].lstrip("# ").strip()
    assert first_heading in page.js("document.querySelector('#preview-body').textContent")
    shot(page, "4-artifact-preview-desktop")
    with page.page.expect_download() as dl:
        page.page.click("#preview-download")
    download = dl.value
    assert download.suggested_filename == "report.md"
    assert Path(download.path()).read_bytes() == body
    page.page.click("#preview-close")
    assert page.js("document.querySelector('#preview').hidden")


def test_threads_rename_delete_search_and_sdk_titles(chat: Cluster, open_page: Any) -> None:
    """A1: threads made through the API are titled by their first message; the list
    filters as you type; rename saves metadata.title; delete asks first, then removes."""
    apples = sdk_thread(chat.url, "Tell me about apples\nand pears", key=BOB)
    trains = sdk_thread(chat.url, "Timetable for night trains", key=BOB)
    page = open_page(chat.url, key=BOB)
    titles = page.js(
        "Array.from(document.querySelectorAll('#thread-list .t-title')).map(t => t.textContent)"
    )
    assert "Tell me about apples" in titles and "Timetable for night trains" in titles, titles

    page.page.fill("#thread-search", "APPLE")
    visible = page.js(
        "Array.from(document.querySelectorAll('#thread-list li')).map(li => li.dataset.threadId)"
    )
    assert visible == [apples]
    page.page.fill("#thread-search", "")

    item = f"#thread-list li[data-thread-id='{trains}']"
    page.page.hover(item)
    page.page.click(f"{item} .t-rename-btn")
    page.page.fill(f"{item} input.t-rename", "Night trains")
    page.page.keyboard.press("Enter")
    page.wait(f"document.querySelector(\"{item} .t-title\").textContent === 'Night trains'")
    with api(chat.url, BOB) as c:
        deadline = time.monotonic() + 10
        while c.get(f"/threads/{trains}").json()["metadata"].get("title") != "Night trains":
            assert time.monotonic() < deadline, "the rename was not saved"
            time.sleep(0.1)

    item = f"#thread-list li[data-thread-id='{apples}']"
    page.page.hover(item)
    page.page.click(f"{item} .t-delete")
    page.wait(f'document.querySelector("{item} .t-confirm")', what="the confirmation")
    shot(page, "5-threads-rename-delete-desktop")
    page.page.click(f"{item} .t-confirm-no")  # cancel keeps it
    assert page.js(f'!!document.querySelector("{item}")')
    page.page.hover(item)
    page.page.click(f"{item} .t-delete")
    page.page.click(f"{item} .t-confirm-yes")
    page.wait(f'!document.querySelector("{item}")', what="the thread to go")
    with api(chat.url, BOB) as c:
        assert c.get(f"/threads/{apples}").status_code == 404
        assert c.get(f"/threads/{trains}").status_code == 200


def test_model_error_is_a_bubble_in_the_transcript_with_retry(
    chat: Cluster, open_page: Any
) -> None:
    """A1: a failed model call shows in the transcript (what failed, not a bare
    "Connection error." pill), distinct from the page's connection status; Retry re-sends the
    last user input and the answer follows."""
    for phone in (False, True):
        page = open_page(chat.url, phone=phone)
        if phone:
            page.page.click("#menu")  # "New chat" lives in the drawer
        page.new_thread()
        pick(page, "markdown_chat")
        text = f"please fail ({'phone' if phone else 'desktop'})"
        send(page, text)
        page.wait("window.threadrunTest.notice()", what="the error bubble")
        notice = page.js("window.threadrunTest.notice()")
        assert notice["retry"] == text
        bubble = page.js("document.querySelector('#notices .notice').textContent")
        assert "500 Internal Server Error" in bubble and "127.0.0.1:9" in bubble, bubble
        assert page.state() != "error", "a model error is not the page's connection state"
        assert page.js("!!document.querySelector('#retry')")
        shot(page, f"6-model-error-{'phone' if phone else 'desktop'}")
        page.page.click("#retry")
        page.wait_state("done")
        assert page.js("window.threadrunTest.notice()") is None
        assert page.js("document.querySelector('.msg-ai .md h2').textContent") == "Caching, briefly"
        humans = [m for m in page.transcript() if m["type"] == "human"]
        assert [m["content"] for m in humans][-1] == text
        if not phone:
            shot(page, "6b-after-retry-desktop")


def test_oversize_input_is_refused_before_sending_naming_the_limit(
    chat: Cluster, open_page: Any
) -> None:
    """A1: a 300 KB message is refused in the composer with the server's limit named
    (from GET /info); sent anyway, the WebSocket's error frame gives the real reason, and
    the message does not become the thread's title."""
    with httpx.Client(base_url=chat.url) as c:
        limits = c.get("/info").json()["limits"]
    assert limits["max_input_bytes"] == 262144 and limits["ws_max_frame_bytes"] == 262144
    page = open_page(chat.url)
    page.new_thread()
    page.wait("window.threadrunTest.limits()", what="the limits")
    big = "x" * 300_000
    page.page.fill("#input", big)
    page.wait("document.querySelector('#composer-hint').classList.contains('over')")
    hint = page.js("document.querySelector('#composer-hint').textContent")
    assert "256 KB" in hint and "max_input_bytes" in hint, hint
    assert page.js("document.querySelector('#send').disabled")
    page.page.keyboard.press("Enter")
    time.sleep(0.5)
    assert page.js("window.threadrunTest.threadId()") is None, "a thread was created"
    assert page.js("window.threadrunTest.runId()") is None
    assert len(page.js("document.querySelector('#input').value")) == 300_000, "the text was lost"
    shot(page, "7-oversize-refused-desktop")

    # Sent anyway (a page that skipped the check): the server names its limit.
    page.js("window.threadrunTest.skipSizeCheck(true)")
    page.page.fill("#input", big + "!")
    page.page.keyboard.press("Enter")
    page.wait("window.threadrunTest.notice()", what="the refusal")
    notice = page.js("window.threadrunTest.notice()")
    assert "ws_max_frame_bytes" in notice["detail"], notice
    assert "connection closed" not in notice["detail"]
    tid = page.js("window.threadrunTest.threadId()")
    with api(chat.url) as c:
        assert "title" not in c.get(f"/threads/{tid}").json()["metadata"]
    shot(page, "7b-oversize-server-reason-desktop")


def test_phone_layout_has_a_thread_drawer(chat: Cluster, open_page: Any) -> None:
    """A1: below 720 px the thread list is a drawer behind a hamburger; picking a
    thread closes it; the conversation uses the full width."""
    sdk_thread(chat.url, "A thread to read on the phone", key=CAROL)
    page = open_page(chat.url, key=CAROL, phone=True)
    left = "document.querySelector('#sidebar').getBoundingClientRect().right"
    assert page.js(left) <= 0, "the thread list covers the chat on a phone"
    assert page.js("getComputedStyle(document.querySelector('#menu')).display") != "none"
    shot(page, "8-phone-chat")
    page.page.click("#menu")
    page.wait(f"{left} > 200", what="the drawer to open")
    time.sleep(0.3)  # the slide-in transition
    shot(page, "9-phone-drawer")
    page.page.click("#thread-list li:first-child")
    page.wait(f"{left} <= 0", what="the drawer to close")
    page.wait("document.querySelector('.msg-ai')", what="the conversation")
    width = page.js("document.querySelector('.msg-ai').getBoundingClientRect().width")
    assert width > 330, width


def test_debug_footer_only_with_debug_1(chat: Cluster, open_page: Any) -> None:
    """A1: the developer footer (transport, run and event ids) only with ?debug=1."""
    plain = open_page(chat.url)
    assert plain.js("document.querySelector('#footer').hidden")
    dbg = open_page(chat.url, debug=1)
    assert not dbg.js("document.querySelector('#footer').hidden")
    assert "transport: WebSocket" in dbg.js("document.querySelector('#footer').textContent")
