"""The chat page's small things a new user trips on (H3), in headless Chromium against real
web + worker processes, desktop (1280x860) and phone (390x844):

- a first visit opens a new chat, not the newest old thread; a reload keeps the open one;
- after a reload the end of the last answer is in view, above the Files bar;
- the sidebar search finds a chat by a word only in one of its messages (POST
  /threads/search `query` reads the head copies' message text, a capped scan);
- renaming a chat does not move it to the top (the list is by activity, `sort_by=activity`);
- a chat whose graph is not served opens read-only, with a banner naming the graph and its
  messages from the thread's stored state;
- a stream that fails mid-answer keeps its partial text, marked "cut off".

The cluster serves lead_agent, markdown_chat (tests/e2e/chat_graph.py) and cutoff_chat
(tests/e2e/chat_ux_graph.py: a dozen words, then the stream breaks). Screenshots:
tests/output/chat-ux-*.png.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_sync_client

from shared.tools.testing import Cluster
from tests.e2e.chat_ux_graph import FAILURE, partial
from tests.e2e.conftest import ALICE, ClusterFactory
from tests.e2e.test_browser import Page, browser, open_page  # noqa: F401 - the fixtures
from tests.e2e.test_chat_page import api, pick, sdk_thread, send, visible_threads

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
FRANK = "key-frank"  # first visits (has old threads)
GRACE = "key-grace"  # the search's capped scan
HEIDI = "key-heidi"  # rename ordering
SCAN = 20  # THREADRUN_THREAD_SEARCH_SCAN_THREADS of this cluster


@pytest.fixture(scope="module")
def ux(
    private_cluster: ClusterFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Web + one worker serving lead_agent, markdown_chat and cutoff_chat."""
    folder = tmp_path_factory.mktemp("chat-ux-config")
    config = folder / "langgraph.json"
    graphs = {
        "lead_agent": f"{ROOT / 'shared/agent/lead_agent.py'}:graph",
        "markdown_chat": f"{Path(__file__).with_name('chat_graph.py')}:graph",
        "cutoff_chat": f"{Path(__file__).with_name('chat_ux_graph.py')}:graph",
    }
    config.write_text(json.dumps({"graphs": graphs}))
    env = {
        "THREADRUN_CONFIG": str(config),
        "THREADRUN_API_KEYS": f"{ALICE}:alice,{FRANK}:frank,{GRACE}:grace,{HEIDI}:heidi",
        "THREADRUN_THREAD_SEARCH_SCAN_THREADS": str(SCAN),
    }
    with private_cluster("chat-ux", env) as c:
        c.side_by_side(c.start_web, c.start_worker)
        yield c


def shot(page: Page, name: str) -> Path:
    return page.screenshot(name, prefix="chat-ux")


def reload(page: Page) -> None:
    page.page.reload()
    page.wait("window.threadrunTest && window.threadrunTest.ready()", what="the page again")


def name(phone: bool) -> str:
    return "phone" if phone else "desktop"


PHONE_DESKTOP = [pytest.param(False, id="desktop"), pytest.param(True, id="phone")]


@pytest.mark.parametrize("phone", PHONE_DESKTOP)
def test_h3_first_visit_opens_a_new_chat_and_a_reload_keeps_the_open_one(
    ux: Cluster,
    open_page: Any,  # noqa: F811 - the imported fixture
    phone: bool,
) -> None:
    """H3: a user with old chats opens the page: a new chat (no thread, the welcome), not
    the newest old one, which stays in the list; the first message makes a new thread; a
    reload of the page with that chat open shows it again (its `#thread=`)."""
    old = sdk_thread(ux.url, f"An old question ({name(phone)})", key=FRANK)
    page = open_page(ux.url, key=FRANK, phone=phone, tokens=6)
    assert page.js("window.threadrunTest.threadId()") is None, "an old thread was opened"
    assert page.js("!document.querySelector('#welcome').hidden")
    assert page.js("document.querySelector('#thread-title').textContent") == "New chat"
    assert old in visible_threads(page)
    shot(page, f"1-first-visit-{name(phone)}")

    pick(page, "lead_agent")  # (on a phone too: the drawer may stay closed)
    send(page, f"A fresh question ({name(phone)})")
    page.wait_state("done")
    tid = page.js("window.threadrunTest.threadId()")
    assert tid and tid != old, "the first message landed in an old thread"
    with api(ux.url, FRANK) as c:
        messages = c.get(f"/threads/{old}/state").json()["values"]["messages"]
    assert [m["content"] for m in messages if m["type"] == "human"] == [
        f"An old question ({name(phone)})"
    ]

    reload(page)
    page.wait(f"window.threadrunTest.threadId() === {tid!r}", what="the open chat")
    page.wait("document.querySelector('.msg-ai')", what="its answer")
    assert page.transcript()[0]["content"] == f"A fresh question ({name(phone)})"
    shot(page, f"1b-reload-keeps-the-chat-{name(phone)}")


@pytest.mark.parametrize("phone", PHONE_DESKTOP)
def test_h3_after_a_reload_the_end_of_the_last_answer_is_above_the_files_bar(
    ux: Cluster,
    open_page: Any,  # noqa: F811 - the imported fixture
    phone: bool,
) -> None:
    """H3: a chat longer than the screen with a file: after a reload the conversation is
    scrolled to its true bottom once the thread and the Files bar rendered, so the end of
    the last answer is in view, not under the bar."""
    page = open_page(ux.url, phone=phone, tokens=160)
    pick(page, "lead_agent")
    page.send("please write a report")
    page.wait_state("done")
    page.js("window.threadrunTest.setConfigurable({tokens: 220})")
    page.send("and a long summary after it")
    page.wait_state("done")
    tid = page.js("window.threadrunTest.threadId()")

    reload(page)
    page.wait(f"window.threadrunTest.threadId() === {tid!r}", what="the chat")
    page.wait("!document.querySelector('#artifacts').hidden", what="the Files bar")
    page.wait("document.querySelectorAll('.msg-ai').length >= 2", what="the answers")
    sc = "document.querySelector('#scroller')"
    assert page.js(f"{sc}.scrollHeight > 2 * {sc}.clientHeight"), "the chat fits the screen"
    page.wait(
        f"{sc}.scrollHeight - {sc}.scrollTop - {sc}.clientHeight <= 1", what="the true bottom"
    )
    last = page.js(
        "(() => { const ms = document.querySelectorAll('.msg-ai');"
        " return ms[ms.length - 1].getBoundingClientRect().bottom; })()"
    )
    bar_top = page.js("document.querySelector('#artifacts').getBoundingClientRect().top")
    view_bottom = page.js(f"{sc}.getBoundingClientRect().bottom")
    assert last <= view_bottom + 1 and last <= bar_top + 1, (last, view_bottom, bar_top)
    shot(page, f"2-reload-end-visible-{name(phone)}")

    # Scrolled up, the reader stays where they are when the page re-renders.
    page.js(f"{sc}.scrollTop = 0")
    page.wait(f"{sc}.scrollTop === 0")
    page.js("window.threadrunTest.transcript()")
    assert page.js(f"{sc}.scrollTop") == 0


def test_h3_search_finds_a_chat_by_a_word_only_in_its_messages_and_the_scan_is_capped(
    ux: Cluster,
    open_page: Any,  # noqa: F811 - the imported fixture
) -> None:
    """H3: POST /threads/search `query` matches a message's text, not only the title (the
    SDK's own fields still filter); only the newest THREADRUN_THREAD_SEARCH_SCAN_THREADS
    threads are read for message text, titles over all; the sidebar finds the chat by the
    word."""
    tid = sdk_thread(ux.url, "Plans for the trip\nwe could take the Zeppelin across", key=GRACE)
    with api(ux.url, GRACE) as c:
        c.patch(f"/threads/{tid}", json={"metadata": {"title": "Travel plans"}})

        def found(**body: Any) -> list[str]:
            resp = c.post("/threads/search", json={"limit": 100, **body})
            assert resp.status_code == 200, resp.text
            return [t["thread_id"] for t in resp.json()]

        assert found(query="zeppelin") == [tid]
        assert found(query="ZEPPELIN", metadata={"title": "Travel plans"}) == [tid]
        assert found(query="zeppelin", metadata={"title": "other"}) == []
        assert found(query="zeppelin", status="busy") == []
        assert found(query="travel") == [tid]  # titles as before

    # The official SDK's own search (sync client: Playwright's loop runs in this thread).
    sdk = get_sync_client(url=ux.url, api_key=GRACE)
    got = sdk.threads.search(metadata={"title": "Travel plans"}, limit=5)
    assert [str(t["thread_id"]) for t in got] == [tid]

    page = open_page(ux.url, key=GRACE)
    page.page.fill("#thread-search", "zeppelin")
    page.wait("window.threadrunTest.searches().includes('zeppelin')", what="the search")
    page.wait(f"document.querySelector(\"#thread-list li[data-thread-id='{tid}']\")")
    assert visible_threads(page) == [tid]
    shot(page, "3-search-by-message-desktop")

    # SCAN newer threads push it out of the message scan; its title is still found.
    with api(ux.url, GRACE) as c:
        for n in range(SCAN):
            c.post("/threads", json={"metadata": {"title": f"Newer {n}"}})
        assert found(query="zeppelin") == []
        assert found(query="travel") == [tid]


def test_h3_renaming_a_chat_does_not_move_it_to_the_top(
    ux: Cluster,
    open_page: Any,  # noqa: F811 - the imported fixture
) -> None:
    """H3: the list is by activity (the newest run): a rename (a metadata PATCH, which moves
    `updated_at`) leaves the chat where it was, on the page and after a reload; a new message
    in it moves it up."""
    older = sdk_thread(ux.url, "First chat of the day", key=HEIDI)
    newer = sdk_thread(ux.url, "Second chat of the day", key=HEIDI)
    page = open_page(ux.url, key=HEIDI, tokens=6)
    assert visible_threads(page)[:2] == [newer, older]
    item = f"#thread-list li[data-thread-id='{older}']"
    page.page.hover(item)
    page.page.click(f"{item} .t-rename-btn")
    page.page.fill(f"{item} input.t-rename", "Renamed morning chat")
    page.page.keyboard.press("Enter")
    page.wait(f"document.querySelector(\"{item} .t-title\").textContent === 'Renamed morning chat'")
    with api(ux.url, HEIDI) as c:
        deadline = time.monotonic() + 10  # the PATCH is sent after the list re-rendered
        while c.get(f"/threads/{older}").json()["metadata"].get("title") != "Renamed morning chat":
            assert time.monotonic() < deadline, "the rename was not saved"
            time.sleep(0.1)
        body = {"limit": 10, "sort_order": "desc"}
        by_update = [
            t["thread_id"]
            for t in c.post("/threads/search", json={**body, "sort_by": "updated_at"}).json()
        ]
        by_activity = [
            t["thread_id"]
            for t in c.post("/threads/search", json={**body, "sort_by": "activity"}).json()
        ]
    assert by_update[:2] == [older, newer], "the rename did not move updated_at (the cause)"
    assert by_activity[:2] == [newer, older]
    assert visible_threads(page)[:2] == [newer, older]
    reload(page)
    assert visible_threads(page)[:2] == [newer, older], "the rename moved the chat after a reload"
    shot(page, "4-rename-keeps-order-desktop")

    page.page.click(item)
    page.wait(f"window.threadrunTest.threadId() === {older!r}")
    pick(page, "lead_agent")
    page.send("one more thing")
    page.wait_state("done")
    page.wait(
        f"document.querySelector('#thread-list li').dataset.threadId === {older!r}",
        what="the chat with the new message on top",
    )


@pytest.mark.parametrize("phone", PHONE_DESKTOP)
def test_h3_a_chat_whose_graph_is_not_served_opens_read_only_naming_the_graph(
    ux: Cluster,
    open_page: Any,  # noqa: F811 - the imported fixture
    phone: bool,
) -> None:
    """H3: a thread whose `graph_id` is not a graph of this server is listed with its
    title and opens read-only: a banner names the graph, the composer is disabled, and its
    messages are shown from its stored state (the thread object's `values`)."""
    tid = sdk_thread(ux.url, f"A chat of a retired graph ({name(phone)})")
    with api(ux.url) as c:
        assert (
            c.patch(f"/threads/{tid}", json={"metadata": {"graph_id": "retired_graph"}}).status_code
            == 200
        )
        values = c.get(f"/threads/{tid}").json()["values"]
    assert [m["type"] for m in values["messages"]] == ["human", "ai"], values
    page = open_page(ux.url, phone=phone)
    item = f"#thread-list li[data-thread-id='{tid}']"
    page.wait(f'document.querySelector("{item}")', what="the chat in the list")
    assert page.js(f'document.querySelector("{item} .t-title").textContent') == (
        f"A chat of a retired graph ({name(phone)})"
    )
    if phone:
        page.page.click("#menu")
    page.page.click(item)
    page.wait("window.threadrunTest.readOnly() === 'retired_graph'", what="read-only")
    page.wait(
        "document.querySelector('#sidebar').getBoundingClientRect().right <= 0"
        " || !document.body.classList.contains('drawer-open') && window.innerWidth > 720",
        what="the drawer to close",
    )
    banner = page.js("document.querySelector('#readonly').textContent")
    assert "This chat used the graph retired_graph, which this server does not serve" in banner
    assert page.js("document.querySelector('#readonly code').textContent") == "retired_graph"
    assert page.js("document.querySelector('#input').disabled")
    assert page.js("document.querySelector('#send').disabled")
    page.wait("document.querySelectorAll('.msg').length === 2", what="its messages")
    assert [(m["type"], m["content"]) for m in page.transcript()] == [
        (m["type"], m["content"]) for m in values["messages"]
    ]
    shot(page, f"5-read-only-{name(phone)}")

    if phone:
        page.page.click("#menu")
    page.new_thread()  # a new chat is writable again
    assert page.js("document.querySelector('#readonly').hidden")
    assert not page.js("document.querySelector('#input').disabled")


@pytest.mark.parametrize("phone", PHONE_DESKTOP)
def test_h3_a_stream_that_fails_mid_answer_keeps_its_partial_text_cut_off(
    ux: Cluster,
    open_page: Any,  # noqa: F811 - the imported fixture
    phone: bool,
) -> None:
    """H3: the model's stream breaks after a dozen words: the words stay in the transcript,
    marked "cut off", above the error with its Retry; the durable state has no answer (the
    node failed), so the page keeps what it received; the next message clears it."""
    page = open_page(ux.url, phone=phone)
    pick(page, "cutoff_chat")  # (on a phone too: the drawer may stay closed)
    tid = page.send(f"when do the night trains leave? ({name(phone)})")
    page.wait("window.threadrunTest.notice()", what="the error")
    notice = page.js("window.threadrunTest.notice()")
    assert "stream broke" in notice["detail"], notice
    page.wait("document.querySelector('.msg-ai.cutoff')", what="the cut-off answer")
    items = page.transcript()
    assert [i["type"] for i in items] == ["human", "ai"], items
    assert items[1]["content"] == partial()
    assert page.js("document.querySelector('.msg-ai.cutoff .role .badge').textContent") == "cut off"
    with api(ux.url) as c:
        state = c.get(f"/threads/{tid}/state").json()
    assert [m["type"] for m in state["values"]["messages"]] == ["human"]
    assert FAILURE
    shot(page, f"6-cut-off-{name(phone)}")

    # A reload replays the failed run's retained stream: the same words, cut off, and the error.
    reload(page)
    page.wait(f"window.threadrunTest.threadId() === {tid!r}", what="the chat")
    page.wait("window.threadrunTest.notice()", what="the error after a reload")
    page.wait("document.querySelector('.msg-ai.cutoff')", what="the cut-off answer again")
    assert [(i["type"], i["content"]) for i in page.transcript()][1] == ("ai", partial())
    assert (
        page.js("window.threadrunTest.notice()")["retry"]
        == f"when do the night trains leave? ({name(phone)})"
    )
    shot(page, f"6b-cut-off-after-reload-{name(phone)}")

    page.js("window.threadrunTest.setConfigurable({tokens: 5})")
    pick(page, "lead_agent")  # (on a phone too: the drawer may stay closed)
    page.send("then briefly, please")
    page.wait_state("done")
    assert page.js("document.querySelectorAll('.msg-ai.cutoff').length") == 0
