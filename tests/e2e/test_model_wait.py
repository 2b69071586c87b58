"""Honest waiting on a slow, failing or hanging model (H2), end to end.

Web + a runs worker whose model is the real OpenAI client against the fixture server
(tests/fixtures/openai_server.py). threadrun retries, not the client (its `max_retries`
is 0): the `custom` stream's `model_wait` events say which attempt of how many runs and
why the last one failed, a provider that never answers is given up at the first-byte
timeout (the run ends `error` with that short cause, in seconds, not at the 60 s client
timeout), and the chat page shows "waiting for the model (N s)" with a live counter,
"retrying (k of n): <cause>", then the short error with its detail behind "Details".
Screenshots: tests/output/chat-model-wait-*.png.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph_sdk.client import LangGraphClient

from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, ClusterFactory, human, run_sdk
from tests.e2e.test_browser import Page, browser  # noqa: F401 - the fixture
from tests.fixtures.openai_server import OpenAIServer, Reply

pytestmark = pytest.mark.e2e

RETRIES = 2
FIRST_BYTE_S = 1.5


@pytest.fixture(scope="module")
def llm() -> Iterator[OpenAIServer]:
    with OpenAIServer() as server:
        yield server


@pytest.fixture(scope="module")
def slow(private_cluster: ClusterFactory, llm: OpenAIServer) -> Iterator[Cluster]:
    env = {
        "THREADRUN_MODEL": "openai:gpt-fixture",
        "THREADRUN_MODEL_BASE_URL": llm.url,
        "THREADRUN_MODEL_API_KEY": "sk-fixture",
        "THREADRUN_MODEL_TIMEOUT_S": "60",  # the client's; the first-byte timeout is ours
        "THREADRUN_MODEL_MAX_RETRIES": str(RETRIES),
        "THREADRUN_MODEL_FIRST_BYTE_TIMEOUT_S": str(FIRST_BYTE_S),
        "THREADRUN_MODEL_RETRY_BACKOFF_S": "0.05",
        "THREADRUN_MODEL_RETRY_BACKOFF_MAX_S": "0.2",
        "THREADRUN_MODEL_WAIT_HEARTBEAT_S": "0.5",
    }
    with private_cluster("model-wait", env) as c:
        c.start()
        yield c


@pytest.fixture
def fresh(llm: OpenAIServer) -> OpenAIServer:
    llm.reset()
    return llm


def waits(parts: list[Any]) -> list[dict[str, Any]]:
    return [
        p.data
        for p in parts
        if p.event == "custom" and isinstance(p.data, dict) and p.data.get("kind") == "model_wait"
    ]


def test_h2_a_500_then_ok_is_retried_and_the_stream_says_so(
    slow: Cluster, fresh: OpenAIServer
) -> None:
    """H2: the provider answers 500 once, then the answer: the run succeeds, the server
    received exactly two requests (the client did not retry on its own), and the run's
    custom events say attempt 2 of 3 after "HTTP 500"."""
    fresh.fail_first(1, 500)

    async def scenario(c: LangGraphClient) -> list[Any]:
        tid = (await c.threads.create())["thread_id"]
        return [
            p
            async for p in c.runs.stream(
                tid, "lead_agent", input=human("hello"), stream_mode=["custom", "values"]
            )
        ]

    parts = run_sdk(scenario, slow.url)
    assert parts[-1].event == "end" and parts[-1].data["status"] == "success", parts[-3:]
    assert parts[-2].data["messages"][-1]["content"] == "You said: hello"
    assert [r.status for r in fresh.received()] == [500, 200]
    events = waits(parts)
    retry = [e for e in events if e["state"] == "retrying"]
    assert [(e["attempt"], e["of"], e["cause"]) for e in retry] == [(2, RETRIES + 1, "HTTP 500")]
    assert events[0]["state"] == "waiting" and events[0]["attempt"] == 1
    assert events[-1]["state"] == "answering" and events[-1]["attempt"] == 2


def test_h2_a_hanging_model_ends_the_run_at_the_first_byte_timeout(
    slow: Cluster, fresh: OpenAIServer
) -> None:
    """H2: a provider that never answers: every attempt is given up after the first-byte
    timeout, the heartbeat says how long the run has waited, and the run ends `error` with
    the short cause and the whole story (provider, host, attempts) as its detail."""
    fresh.script(*[Reply(hang=True)] * (RETRIES + 1))

    async def scenario(c: LangGraphClient) -> tuple[list[Any], dict[str, Any]]:
        tid = (await c.threads.create())["thread_id"]
        parts = [
            p
            async for p in c.runs.stream(
                tid, "lead_agent", input=human("hello"), stream_mode=["custom"]
            )
        ]
        run: dict[str, Any] = dict(await c.runs.get(tid, parts[0].data["run_id"]))
        return parts, run

    parts, run = run_sdk(scenario, slow.url)
    assert [p.event for p in parts][-2:] == ["error", "end"]
    assert parts[-1].data["status"] == "error"
    err = parts[-2].data
    cause = f"no answer within {FIRST_BYTE_S:g} s"
    assert err["short"] == f"The model failed: {cause}, after {RETRIES + 1} attempts"
    assert (err["kind"], err["exception"], err["attempts"]) == (
        "timeout",
        "FirstByteTimeout",
        RETRIES + 1,
    )
    host = fresh.url.removeprefix("http://").split("/")[0]
    assert f"openai at {host} sent nothing within {FIRST_BYTE_S:g} s" in err["detail"]
    assert run["status"] == "error" and run["error"] == err
    assert len(fresh.received()) == RETRIES + 1
    events = waits(parts)
    assert max(e["waited_s"] for e in events) >= FIRST_BYTE_S  # it said it was waiting
    assert {e["attempt"] for e in events if e["state"] == "waiting"} == {1, 2, 3}
    assert events[-1]["state"] == "failed" and events[-1]["cause"] == cause


def test_h2_the_chat_page_shows_the_wait_the_retries_and_the_failure(
    slow: Cluster,
    fresh: OpenAIServer,
    browser: Any,  # noqa: F811 - the imported fixture
) -> None:
    """H2: in Chromium, while the model hangs the page says "waiting for the model (N s)"
    with a counter that moves, then "retrying (2 of 3): no answer within 1.5 s", and when
    the run gives up the short error with the detail behind an expandable "Details"."""
    fresh.script(*[Reply(hang=True)] * (RETRIES + 1))
    page = Page(browser, slow.url, key=ALICE)
    try:
        page.new_thread()
        page.send("are you there?")
        first = page.wait(
            "(t => t && /waiting for the model \\(1 s\\)/.test(t) && t)"
            "(window.threadrunTest.modelWait())",
            what="the waiting line at 1 s",
        )
        assert not first.startswith("retrying"), first
        page.screenshot("model-wait-1-waiting", prefix="chat")
        line = page.wait(
            "(t => t && t.startsWith('retrying (2 of 3)') && t)(window.threadrunTest.modelWait())",
            what="the retrying line",
        )
        assert f"retrying (2 of 3): no answer within {FIRST_BYTE_S:g} s" in line, line
        assert re.search(r"waiting for the model \(\d+ s\)", line), line
        page.screenshot("model-wait-2-retrying", prefix="chat")
        notice = page.wait("window.threadrunTest.notice()", what="the error notice")
        assert notice["detail"] == (
            f"The model failed: no answer within {FIRST_BYTE_S:g} s, after {RETRIES + 1} attempts"
        ), notice
        assert "first-byte timeout" in notice["more"], notice
        assert page.js("window.threadrunTest.modelWait()") is None  # the line is gone
        assert not page.js("document.querySelector('#notices .n-more').open")
        page.page.click("#notices .n-more summary")
        assert page.js("document.querySelector('#notices .n-more').open")
        page.screenshot("model-wait-3-failed", prefix="chat")
        states = [w["state"] for w in page.js("window.threadrunTest.modelWaits()")]
        assert states[0] == "waiting" and "retrying" in states, states
        assert page.errors == []
    finally:
        page.close()
