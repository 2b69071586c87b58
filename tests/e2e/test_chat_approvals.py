"""H3 in the chat page, in headless Chromium against real web + worker processes: a pending
interrupt is a state of its own ("waiting for you", in the header and the sidebar, not
"stopped"), shown as a card from the thread's server state (so a reload and a second tab
show the same card), and answered with `Command(resume=...)` in the interrupt's own shape:
a text answer for a plain `interrupt("question")`, `{"decisions": [...]}` for a
HumanInTheLoopMiddleware tool review (approve, edit, reject). Typing while a plain
question is pending answers it; typing while a tool review is pending is refused with a
hint to use the card (docs/chat.md).

The cluster serves tests/e2e/approval_graphs.py. Screenshots: tests/output/approval-*.png.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, ClusterFactory
from tests.e2e.test_browser import Page, browser, open_page  # noqa: F401 - the fixtures
from tests.e2e.test_chat_page import pick

pytestmark = pytest.mark.e2e

GRAPHS = Path(__file__).with_name("approval_graphs.py")


@pytest.fixture(scope="module")
def cluster(
    private_cluster: ClusterFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Web + one worker serving ask_chat and review_chat."""
    config = tmp_path_factory.mktemp("approval-config") / "langgraph.json"
    graphs = {"ask_chat": f"{GRAPHS}:ask_chat", "review_chat": f"{GRAPHS}:review_chat"}
    config.write_text(json.dumps({"graphs": graphs}))
    with private_cluster("chat-approvals", {"THREADRUN_CONFIG": str(config)}) as c:
        c.side_by_side(c.start_web, c.start_worker)
        yield c


def new_chat(page: Page) -> None:
    """A new chat (the button is in the drawer on a phone: clicked from script)."""
    page.js("document.querySelector('#new-thread').click()")
    page.wait("window.threadrunTest.threadId() === null", what="a new chat")
    page.wait("!document.querySelector('#send').disabled", what="the composer")


def card(page: Page) -> None:
    page.wait("document.querySelector('.interrupt-card')", what="the interrupt card")
    page.wait_state("waiting")


def thread_values(base: str, tid: str) -> dict[str, Any]:
    with httpx.Client(base_url=base, headers={"x-api-key": ALICE}, timeout=30) as c:
        return dict(c.get(f"/threads/{tid}").json())


@pytest.mark.parametrize("phone", [False, True], ids=["desktop", "phone"])
def test_plain_interrupt_waits_survives_reload_and_is_answered_by_typing(
    cluster: Cluster,
    open_page: Any,  # noqa: F811 - the imported fixture
    phone: bool,
) -> None:
    """H3: a plain `interrupt("question")` reads "waiting for you" (header and sidebar, not
    "stopped"), shows its question as a card that a reload and a second page show too, and
    the text typed in the composer resumes it (`command.resume`), not a new message."""
    page = open_page(cluster.url, phone=phone)
    new_chat(page)
    pick(page, "ask_chat")
    tid = page.send("book a trip")
    card(page)
    assert "Which city should I book?" in page.js(
        "document.querySelector('.interrupt-card').textContent"
    )
    assert page.js("document.querySelector('#run-status').textContent") == "waiting for you"
    page.wait(
        f"document.querySelector('[data-thread-id=\"{tid}\"] .t-waiting')",
        what="the sidebar's waiting badge",
    )
    view = "phone" if phone else "desktop"
    page.screenshot(f"plain-waiting-{view}", prefix="approval")

    page.page.reload()
    page.wait("window.threadrunTest && window.threadrunTest.ready()", what="the reload")
    card(page)
    other = open_page(cluster.url, phone=phone)
    other.page.goto(f"{cluster.url}/?api_key={ALICE}#thread={tid}")
    other.wait("window.threadrunTest && window.threadrunTest.ready()", what="the second page")
    card(other)

    page.page.fill("#input", "Lisbon")
    page.page.keyboard.press("Enter")
    page.wait(
        "Array.from(document.querySelectorAll('.msg-ai'))"
        ".some(m => m.textContent.includes('booking: Lisbon'))",
        what="the answer to the resume",
    )
    page.wait_state("done")
    assert not page.js("document.querySelector('.interrupt-card')")
    humans = page.js("document.querySelectorAll('.msg-human').length")
    assert humans == 1, "the typed answer was sent as a new message"
    assert not thread_values(cluster.url, tid)["interrupts"]


@pytest.mark.parametrize(
    ("button", "expected"),
    [
        ("i-approve", '"type": "approve"'),
        ("i-edit", '"to": "dev@example.com"'),
        ("i-reject", '"type": "reject"'),
    ],
    ids=["approve", "edit", "reject"],
)
def test_tool_review_is_approved_edited_or_rejected_from_its_card(
    cluster: Cluster,
    open_page: Any,  # noqa: F811 - the imported fixture
    button: str,
    expected: str,
) -> None:
    """H3: a HumanInTheLoopMiddleware review shows the tool's arguments as a form; typing
    in the composer is refused with a hint (the text stays); Approve / Edit / Reject resume
    with `{"decisions": [...]}` in the middleware's shape, also after a reload."""
    page = open_page(cluster.url)
    new_chat(page)
    pick(page, "review_chat")
    page.send("deploy please")
    card(page)
    assert page.js("document.querySelector('.interrupt-card input[name=to]').value") == (
        "ops@example.com"
    )
    page.page.fill("#input", "just do it")
    page.page.keyboard.press("Enter")
    page.wait("document.querySelector('.notice[data-kind=hint]')", what="the hint")
    assert page.js("document.querySelector('#input').value") == "just do it"
    page.screenshot(f"review-{button}", prefix="approval")

    page.page.reload()
    page.wait("window.threadrunTest && window.threadrunTest.ready()", what="the reload")
    card(page)
    if button == "i-edit":
        page.page.fill(".interrupt-card input[name=to]", "dev@example.com")
    page.page.click(f".interrupt-card .{button}")
    page.wait(
        f"Array.from(document.querySelectorAll('.msg-ai')).some(m => m.textContent.includes({expected!r}))",
        what="the decision in the answer",
    )
    page.wait_state("done")
    assert not page.js("document.querySelector('.interrupt-card')")
