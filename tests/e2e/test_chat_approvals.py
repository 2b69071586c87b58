"""H3 in the chat page, in headless Chromium against real web + worker processes: a pending
interrupt is a state of its own ("waiting for you", in the header and the sidebar, not
"stopped"), shown as a card from the thread's server state (so a reload and a second tab
show the same card), and answered with `Command(resume=...)` in the interrupt's own shape:
a text answer for a plain `interrupt("question")`, `{"decisions": [...]}` for a
HumanInTheLoopMiddleware tool review (approve, edit, reject). Typing while a plain
question is pending answers it; typing while a tool review is pending is refused with a
hint to use the card (docs/chat.md).

The same card answers agent-chat-ui's inbox shape (`HumanInterrupt` lists: accept, edit,
ignore), and LangChain's real `HumanInTheLoopMiddleware` in a `create_agent` graph: an
approved tool call runs (its file appears), an edited one runs with the edited arguments, a
rejected one never runs.

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
    """Web + one worker serving the approval graphs."""
    config = tmp_path_factory.mktemp("approval-config") / "langgraph.json"
    graphs = {
        name: f"{GRAPHS}:{name}" for name in ("ask_chat", "review_chat", "inbox_chat", "hitl_agent")
    }
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


def ask(page: Page, text: str) -> str:
    """Send `text` and wait for the interrupt card; the thread id. (`Page.send` waits for the
    run's id, which a graph that pauses at once may already have dropped for the card.)"""
    page.page.fill("#input", text)
    page.page.keyboard.press("Enter")
    card(page)
    return str(page.js("window.threadrunTest.threadId()"))


def answered(page: Page, text: str) -> None:
    """Wait until an assistant message contains `text` and the run is done."""
    page.wait(
        "Array.from(document.querySelectorAll('.msg-ai'))"
        f".some(m => m.textContent.includes({text!r}))",
        what=f"an answer with {text!r}",
    )
    page.wait_state("done")


@pytest.mark.parametrize(
    ("button", "expected"),
    [
        ("i-approve", '"type": "accept"'),
        ("i-edit", '"to": "dev@example.com"'),
        ("i-reject", '"type": "ignore"'),
    ],
    ids=["accept", "edit", "ignore"],
)
def test_agent_chat_ui_inbox_interrupt_is_answered_in_its_shape(
    cluster: Cluster,
    open_page: Any,  # noqa: F811 - the imported fixture
    button: str,
    expected: str,
) -> None:
    """H3: an interrupt in agent-chat-ui's inbox shape (a `HumanInterrupt` list) is a review
    card with the action's arguments as a form; its buttons resume with the inbox's own
    response list (`accept` / `edit` with `{action, args}` / `ignore`)."""
    page = open_page(cluster.url)
    new_chat(page)
    pick(page, "inbox_chat")
    ask(page, "deploy please")
    assert page.js("document.querySelector('.interrupt-card').dataset.interruptKind") == "inbox"
    assert page.js("document.querySelector('.interrupt-card input[name=to]').value") == (
        "ops@example.com"
    )
    if button == "i-edit":
        page.page.fill(".interrupt-card input[name=to]", "dev@example.com")
    page.page.click(f".interrupt-card .{button}")
    answered(page, expected)
    if button == "i-edit":
        answered(page, '"action": "send_email"')
    assert not page.js("document.querySelector('.interrupt-card')")


def artifact_paths(base: str, tid: str) -> list[str]:
    with httpx.Client(base_url=base, headers={"x-api-key": ALICE}, timeout=30) as c:
        return [a["path"] for a in c.get(f"/threads/{tid}/artifacts").json()]


@pytest.mark.parametrize("button", ["i-approve", "i-edit", "i-reject"])
def test_real_hitl_middleware_tool_call_runs_only_as_decided(
    cluster: Cluster,
    open_page: Any,  # noqa: F811 - the imported fixture
    button: str,
) -> None:
    """H3: LangChain's own HumanInTheLoopMiddleware (create_agent, the built-in model,
    `write_artifact`) asks before the tool runs; from the chat page's card an approval runs
    it (the file is there), an edit runs it with the edited file name (only that file is
    there) and keeps the arguments not edited exactly (a multi-line content), a rejection
    never runs it (no file) and the model is told why."""
    page = open_page(cluster.url)
    new_chat(page)
    pick(page, "hitl_agent")
    tid = ask(page, "please write notes.md")
    assert page.js("document.querySelector('.interrupt-card').dataset.interruptKind") == "hitl"
    assert page.js("document.querySelector('.interrupt-card input[name=filename]').value") == (
        "notes.md"
    )
    assert artifact_paths(cluster.url, tid) == []  # nothing ran before the decision
    page.screenshot(f"hitl-middleware-{button}", prefix="approval")
    if button == "i-edit":
        page.page.fill(".interrupt-card input[name=filename]", "edited.md")
    page.page.click(f".interrupt-card .{button}")
    if button == "i-reject":
        answered(page, "rejected")
        assert artifact_paths(cluster.url, tid) == []
    else:
        name = "edited.md" if button == "i-edit" else "notes.md"
        answered(page, "Saved artifact")
        assert artifact_paths(cluster.url, tid) == [f"outputs/{name}"]
        # The multi-line content went through the card's form untouched (an <input> would
        # have dropped its newlines on "Edit and run").
        with httpx.Client(base_url=cluster.url, headers={"x-api-key": ALICE}) as c:
            body = c.get(f"/threads/{tid}/artifacts/outputs/{name}").text
        assert body.startswith("# notes.md\n\nRequest: please write notes.md\n"), body
    assert not page.js("document.querySelector('.interrupt-card')")
