"""The chat page as a product, in headless Chromium against real web + worker
processes: Markdown with code blocks, tool cards, artifact preview and download, thread
rename/delete/search with titles from the first message (SDK-made threads too), a composer
that works on first visit, the phone layout with its thread drawer, model errors in the
transcript with Retry, over-size input refused before sending (and the WebSocket's own
reason when it is sent anyway), and the debug footer only with `?debug=1`.

The cluster serves the built-in `lead_agent` and `markdown_chat` (tests/e2e/chat_graph.py:
fixed Markdown streamed token by token; a message containing "fail" fails its first time).
Every scenario saves screenshots as tests/output/chat-*.png (desktop and phone width).
Stopped answers and the thread search by title (a server-side `query`) are here too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, BOB, ClusterFactory
from tests.e2e.test_browser import Page, browser, open_page  # noqa: F401 - the fixture

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GRAPH_FILE = Path(__file__).with_name("chat_graph.py")
CAROL = "key-carol"  # a user of this module's cluster only: first visit, no thread
DAVE = "key-dave"  # a user of this module's cluster only: more threads than the list loads


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
        "THREADRUN_API_KEYS": f"{ALICE}:alice,{BOB}:bob,{CAROL}:carol,{DAVE}:dave",
    }
    with private_cluster("chat-page", env) as c:
        c.side_by_side(c.start_web, c.start_worker)
        yield c


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
    chat: Cluster,
    open_page: Any,  # noqa: F811
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


def test_tool_calls_and_results_are_cards_and_artifacts_open(chat: Cluster, open_page: Any) -> None:  # noqa: F811
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


def test_threads_rename_delete_search_and_sdk_titles(chat: Cluster, open_page: Any) -> None:  # noqa: F811
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
    chat: Cluster,
    open_page: Any,  # noqa: F811
) -> None:
    """A1: a failed model call shows in the transcript (what failed, not a bare
    "Connection error." pill), distinct from the page's connection status; Retry re-runs the
    thread from its checkpoint with no new input, so the answer follows the user's message
    and the thread holds that message once (on the page and in the durable state)."""
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
        assert notice["retry"] == text and notice["resume"] is True, notice
        tid = page.js("window.threadrunTest.threadId()")
        bubble = page.js("document.querySelector('#notices .notice').textContent")
        assert "500 Internal Server Error" in bubble and "127.0.0.1:9" in bubble, bubble
        assert page.state() != "error", "a model error is not the page's connection state"
        assert page.js("!!document.querySelector('#retry')")
        shot(page, f"6-model-error-{'phone' if phone else 'desktop'}")
        if not phone:  # a reload finds the failed run; its Retry keeps that run's assistant
            page.page.reload()
            page.wait("window.threadrunTest.ready()", what="the page to load again")
            page.wait("window.threadrunTest.notice()", what="the error bubble after a reload")
            again = page.js("window.threadrunTest.notice()")
            assert again["retry"] == text and again["resume"] is True, again
        page.page.click("#retry")
        page.wait_state("done")
        assert page.js("window.threadrunTest.notice()") is None
        assert page.js("document.querySelector('.msg-ai .md h2').textContent") == "Caching, briefly"
        assert [(m["type"], m["content"]) for m in page.transcript()][0] == ("human", text)
        assert [m["type"] for m in page.transcript()] == ["human", "ai"]
        with api(chat.url) as c:
            state = c.get(f"/threads/{tid}/state").json()
            runs = c.get(f"/threads/{tid}/runs").json()
        assert [m["type"] for m in state["values"]["messages"]] == ["human", "ai"]
        assert state["values"]["messages"][0]["content"] == text
        assert sorted(r["status"] for r in runs) == ["error", "success"]
        if not phone:
            shot(page, "6b-after-retry-desktop")


def test_a1_a_run_with_no_input_retries_the_failed_model_node_from_the_checkpoint(
    chat: Cluster,
) -> None:
    """A1 (LangGraph semantics, what the page's Retry relies on): a run whose model node
    failed leaves the thread's head checkpoint with that node still to run (`next`), the user's
    message saved once; a run with no input continues from that checkpoint, re-runs the
    failed node only, and the thread holds one user message and one answer."""
    with api(chat.url) as c:
        tid = c.post("/threads", json={}).json()["thread_id"]
        ask = {"role": "user", "content": "please fail (api)"}
        body = {"assistant_id": "markdown_chat", "input": {"messages": [ask]}}
        failed = c.post(f"/threads/{tid}/runs/wait", json=body)
        assert "model call failed" in failed.text, failed.text
        state = c.get(f"/threads/{tid}/state").json()
        assert state["next"] == ["answer"], state
        assert [m["type"] for m in state["values"]["messages"]] == ["human"]
        human_id = state["values"]["messages"][0]["id"]

        retried = c.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "markdown_chat"})
        assert retried.status_code == 200, retried.text
        state = c.get(f"/threads/{tid}/state").json()
        messages = state["values"]["messages"]
        assert [m["type"] for m in messages] == ["human", "ai"], messages
        assert messages[0]["id"] == human_id and messages[0]["content"] == ask["content"]
        assert messages[1]["content"].startswith("## Caching, briefly")
        assert state["next"] == []
        runs = c.get(f"/threads/{tid}/runs").json()
        assert sorted(r["status"] for r in runs) == ["error", "success"]


def test_oversize_input_is_refused_before_sending_naming_the_limit(
    chat: Cluster,
    open_page: Any,  # noqa: F811
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


def test_phone_layout_has_a_thread_drawer(chat: Cluster, open_page: Any) -> None:  # noqa: F811
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


def test_debug_footer_only_with_debug_1(chat: Cluster, open_page: Any) -> None:  # noqa: F811
    """A1: the developer footer (transport, run and event ids) only with ?debug=1."""
    plain = open_page(chat.url)
    assert plain.js("document.querySelector('#footer').hidden")
    dbg = open_page(chat.url, debug=1)
    assert not dbg.js("document.querySelector('#footer').hidden")
    assert "transport: WebSocket" in dbg.js("document.querySelector('#footer').textContent")


def visible_threads(page: Page) -> list[str]:
    return list(
        page.js(
            "Array.from(document.querySelectorAll('#thread-list li'))"
            ".map(li => li.dataset.threadId)"
        )
    )


def test_r5_stopped_answer_stays_with_its_badge_across_a_reload_and_the_next_message_follows(
    chat: Cluster,
    open_page: Any,  # noqa: F811
) -> None:
    """R5, A1: Stop mid-answer keeps the partial answer in the transcript, marked "stopped"
    (what the server saved: `response_metadata.stopped`), on a desktop and on a phone; a
    reload shows the same; the next message and its answer follow the stopped one."""
    for phone in (False, True):
        name = "phone" if phone else "desktop"
        page = open_page(chat.url, phone=phone, tokens=400, delay=25)
        if phone:
            page.page.click("#menu")  # "New chat" lives in the drawer
        page.new_thread()
        pick(page, "lead_agent")
        tid = page.send(f"tell me a long story ({name})")
        page.wait("window.threadrunTest.stats().chunks >= 12", what="a dozen tokens")
        page.page.click("#stop")
        page.wait_state("cancelled", timeout=20)
        page.wait("document.querySelector('.msg-ai.stopped')", what="the stopped answer")

        def check(page: Page) -> str:
            items = page.transcript()
            assert [i["type"] for i in items] == ["human", "ai"], items
            partial = str(items[1]["content"])
            assert partial and len(partial.split(" ")) < 400, partial
            badge = page.js("document.querySelector('.msg-ai.stopped .role .badge').textContent")
            assert badge == "stopped"
            return partial

        partial = check(page)
        state = durable_state(chat.url, tid)
        last = state["values"]["messages"][-1]
        assert last["type"] == "ai" and last["response_metadata"]["stopped"] is True
        assert last["content"] == partial
        shot(page, f"10-stopped-answer-{name}")

        page.page.reload()
        page.wait("window.threadrunTest.ready()", what="the page to load again")
        page.wait(f"window.threadrunTest.threadId() === {tid!r}", what="the thread")
        page.wait("document.querySelector('.msg-ai.stopped')", what="the stopped answer")
        assert check(page) == partial
        shot(page, f"10b-stopped-after-reload-{name}")

        page.js("window.threadrunTest.setConfigurable({tokens: 6})")
        page.send("and now briefly")
        page.wait_state("done")
        items = page.transcript()
        assert [i["type"] for i in items] == ["human", "ai", "human", "ai"], items
        assert items[1]["content"] == partial and items[2]["content"] == "and now briefly"
        assert page.js("document.querySelectorAll('.msg-ai.stopped').length") == 1
        assert not page.js(
            "document.querySelector('.msg-ai:last-child').classList.contains('stopped')"
        )
        messages = durable_state(chat.url, tid)["values"]["messages"]
        assert [m["type"] for m in messages] == ["human", "ai", "human", "ai"]
        shot(page, f"10c-next-message-follows-{name}")


def durable_state(base: str, thread_id: str) -> dict[str, Any]:
    with api(base) as c:
        resp = c.get(f"/threads/{thread_id}/state")
    resp.raise_for_status()
    return dict(resp.json())


def test_a1_a3_thread_search_query_matches_titles_case_insensitively_and_validates(
    chat: Cluster,
) -> None:
    """A1, A3: POST /threads/search takes `query` (a threadrun extension): the caller's
    threads whose `metadata.title` contains it, case-insensitively, `%` and `_` taken
    literally, with the other filters and paging; a blank, over-long, control-character or
    non-string query is a 422 naming `query`."""
    with api(chat.url, DAVE) as c:
        made = {}
        for title in ("Quarterly Budget", "budget for the 100% plan", "snake_case names", "Other"):
            made[title] = c.post("/threads", json={"metadata": {"title": title}}).json()[
                "thread_id"
            ]
        c.post("/threads", json={"metadata": {}})  # no title: never matched by a query

        def found(**body: Any) -> set[str]:
            resp = c.post("/threads/search", json={"limit": 1000, **body})
            assert resp.status_code == 200, resp.text
            return {t["thread_id"] for t in resp.json()}

        assert found(query="BUDGET") == {made["Quarterly Budget"], made["budget for the 100% plan"]}
        assert found(query="  budget  ") == found(query="budget")
        assert found(query="100%") == {made["budget for the 100% plan"]}
        assert found(query="%") == {made["budget for the 100% plan"]}  # literal, not "all"
        assert found(query="e_c") == {made["snake_case names"]}
        assert found(query="e_c".replace("_", "x")) == set()
        assert found(query="budget", metadata={"title": "Quarterly Budget"}) == {
            made["Quarterly Budget"]
        }
        assert len(found(query="budget", limit=1)) == 1
    with api(chat.url, BOB) as c:  # another user's titles are never searched
        assert c.post("/threads/search", json={"query": "Quarterly"}).json() == []
        for bad in ("", "   ", "x" * 201, 5, ["budget"], "a\x00b"):
            resp = c.post("/threads/search", json={"query": bad})
            assert resp.status_code == 422, (bad, resp.text)
            assert resp.json()["field"] == "query", resp.text
        assert c.post("/threads/search", json={"query": "x" * 200}).status_code == 200


def test_a1_search_box_finds_a_thread_older_than_the_loaded_list_on_the_server(
    chat: Cluster,
    open_page: Any,  # noqa: F811
) -> None:
    """A1: the page loads the newest 100 chats; typing in the search box asks the server
    (`query`) and finds a chat older than those by its title, case-insensitively; clearing
    the box shows the newest again."""
    with api(chat.url, DAVE) as c:
        old = c.post("/threads", json={"metadata": {"title": "Lighthouse keeping notes"}})
        old_id = old.json()["thread_id"]
        for n in range(101):
            c.post("/threads", json={"metadata": {"title": f"Filler chat {n:03d}"}})
    page = open_page(chat.url, key=DAVE)
    page.wait("document.querySelectorAll('#thread-list li').length >= 100", what="the list")
    assert old_id not in visible_threads(page), "the old chat is among the newest 100"
    page.page.fill("#thread-search", "LIGHTHOUSE")
    page.wait("window.threadrunTest.searches().includes('LIGHTHOUSE')", what="the search")
    page.wait(f"document.querySelector(\"#thread-list li[data-thread-id='{old_id}']\")")
    assert visible_threads(page) == [old_id]
    shot(page, "11-search-server-desktop")
    page.page.click(f"#thread-list li[data-thread-id='{old_id}']")
    page.wait(f"window.threadrunTest.threadId() === {old_id!r}", what="the found chat")
    assert page.js("document.querySelector('#thread-title').textContent") == (
        "Lighthouse keeping notes"
    )
    page.page.fill("#thread-search", "no such chat anywhere")
    page.wait("window.threadrunTest.searches().includes('no such chat anywhere')")
    assert visible_threads(page) == []
    assert page.js("document.querySelector('#thread-empty').textContent") == "No chat matches."
    page.page.fill("#thread-search", "")
    page.wait("document.querySelectorAll('#thread-list li').length >= 100", what="the list")
