"""Honest waiting on the model (H2): the retry policy, and one provider model call against
the fixture OpenAI server (tests/fixtures/openai_server.py) with the real client inside a
one-node LangGraph graph, so the `model_wait` events are what a run's `custom` stream gets.

The client's own retries are off (`max_retries=0`): the attempts the events and the
error report are the requests the server received.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, TypedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from pydantic import SecretStr

from shared.agent.model import make_model
from shared.agent.retrying import WAIT_KIND, RetryingChatModel, RetryPolicy
from shared.model_errors import ModelCallFailed, describe_model_error
from shared.settings import Settings
from tests.fixtures.openai_server import OpenAIServer, Reply

RETRIES = 2


def policy(**kw: Any) -> RetryPolicy:
    base = dict(
        retries=RETRIES, backoff_s=0.01, backoff_max_s=0.05, first_byte_timeout_s=5,
        heartbeat_s=5,
    )  # fmt: skip
    return RetryPolicy(**{**base, **kw})


# --- the policy ---------------------------------------------------------------------------------
@given(
    base=st.floats(0, 30, allow_nan=False),
    cap=st.floats(0, 120, allow_nan=False),
    after=st.none() | st.floats(0, 1e6, allow_nan=False),
    retries=st.integers(1, 64),
)
def test_backoff_is_monotone_and_capped(
    base: float, cap: float, after: float | None, retries: int
) -> None:
    """H2: the wait before retry k never decreases with k, never exceeds the cap, and is
    at least the answer's Retry-After (up to the cap)."""
    p = policy(backoff_s=base, backoff_max_s=cap)
    waits = [p.backoff(k, after) for k in range(1, retries + 1)]
    assert all(0 <= w <= cap for w in waits)
    assert waits == sorted(waits)
    if after is not None:
        assert all(w >= min(after, cap) for w in waits)


def test_settings_give_the_policy() -> None:
    """H2: THREADRUN_MODEL_MAX_RETRIES & co. are the policy; the client's retries are 0."""
    s = Settings(
        model="openai:gpt-fixture",
        model_base_url="http://127.0.0.1:9/v1",
        model_api_key=SecretStr("sk-fixture"),
        model_max_retries=3,
        model_first_byte_timeout_s=7,
    )
    model = make_model(s)
    assert isinstance(model, RetryingChatModel)
    assert model.policy.attempts == 4 and model.policy.first_byte_timeout_s == 7
    assert getattr(model.inner, "max_retries", None) == 0


# --- one call against the fixture server ------------------------------------------------------
@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer() as s:
        yield s


@pytest.fixture
def llm(server: OpenAIServer) -> OpenAIServer:
    server.reset()
    return server


class _State(TypedDict, total=False):
    text: str


def call(
    server: OpenAIServer, p: RetryPolicy
) -> tuple[str | None, list[Any], ModelCallFailed | None]:
    """Stream one model call in a graph: (its text, the model_wait events, its error)."""
    s = Settings(
        model="openai:gpt-fixture", model_base_url=server.url, model_api_key=SecretStr("sk-fixture")
    )
    model = RetryingChatModel(inner=make_model(s).inner, policy=p)  # type: ignore[attr-defined]

    async def node(state: _State) -> _State:
        reply = await model.ainvoke([HumanMessage("hello")])
        return {"text": reply.text}

    builder = StateGraph(_State)
    builder.add_node("model", node)
    builder.add_edge(START, "model")
    builder.add_edge("model", END)
    graph = builder.compile()

    async def run() -> tuple[str | None, list[Any], ModelCallFailed | None]:
        events: list[Any] = []
        text = None
        try:
            async for mode, chunk in graph.astream({}, stream_mode=["custom", "values"]):
                if mode == "custom":
                    events.append(chunk)
                elif isinstance(chunk, dict) and chunk.get("text") is not None:
                    text = str(chunk["text"])
        except ModelCallFailed as exc:
            return text, events, exc
        return text, events, None

    return asyncio.run(run())


def test_500_then_ok_is_retried_by_us_and_said_on_the_stream(llm: OpenAIServer) -> None:
    """H2: a 500 before the answer is retried (the client does not retry it itself), and
    the events say attempt 2 of 3 after "HTTP 500", then answering."""
    llm.fail_first(1, 500)
    text, events, error = call(llm, policy())
    assert error is None and text == "You said: hello"
    assert [r.status for r in llm.received()] == [500, 200]
    assert all(e["kind"] == WAIT_KIND and e["of"] == RETRIES + 1 for e in events)
    states = [(e["state"], e["attempt"], e["cause"]) for e in events]
    assert states == [
        ("waiting", 1, None),
        ("retrying", 2, "HTTP 500"),
        ("waiting", 2, "HTTP 500"),
        ("answering", 2, "HTTP 500"),
    ]
    waited = [e["waited_s"] for e in events]
    assert waited == sorted(waited)


def test_a_failing_endpoint_is_tried_n_plus_one_times_then_reported(llm: OpenAIServer) -> None:
    """H2: attempts never exceed retries + 1; the error says how many were made."""
    llm.fail_first(10, 503)
    _text, events, error = call(llm, policy())
    assert isinstance(error, ModelCallFailed) and error.attempts == RETRIES + 1
    assert [r.status for r in llm.received()] == [503] * (RETRIES + 1)
    assert events[-1]["state"] == "failed" and events[-1]["cause"] == "HTTP 503"
    record = describe_model_error(error, model="openai:gpt-fixture")
    assert record is not None
    assert (record["retries"], record["attempts"], record["status_code"]) == (2, 3, 503)
    assert record["short"] == "The model failed: HTTP 503, after 3 attempts"
    assert "retried 2 times, then gave up" in record["detail"]


def test_a_client_error_is_not_retried(llm: OpenAIServer) -> None:
    """H2: a 400 is the request's fault: one attempt, reported as not retried."""
    llm.fail_first(1, 400)
    _text, _events, error = call(llm, policy())
    assert isinstance(error, ModelCallFailed) and error.attempts == 1
    assert len(llm.received()) == 1
    record = describe_model_error(error)
    assert record is not None and record["retries"] == 0 and "not retried" in record["message"]


def test_a_hanging_provider_hits_the_first_byte_timeout(llm: OpenAIServer) -> None:
    """H2: a provider that never answers is abandoned after the first-byte timeout, each
    attempt, and the call ends with the short cause; the heartbeat said how long it waited."""
    llm.script(*[Reply(hang=True)] * (RETRIES + 1))
    p = policy(first_byte_timeout_s=0.4, heartbeat_s=0.1)
    _text, events, error = call(llm, p)
    assert isinstance(error, ModelCallFailed) and error.attempts == RETRIES + 1
    assert error.cause == "no answer within 0.4 s"
    assert len(llm.received()) == RETRIES + 1
    beats = [e for e in events if e["state"] == "waiting" and e["attempt"] == 1]
    assert len(beats) >= 2  # the heartbeat, while attempt 1 hung
    record = describe_model_error(error, model="openai:gpt-fixture")
    assert record is not None and (record["kind"], record["exception"]) == (
        "timeout",
        "FirstByteTimeout",
    )
    assert record["host"] == llm.url.removeprefix("http://").split("/")[0]
    assert "sent nothing within 0.4 s (first-byte timeout)" in record["message"]


def test_a_stall_mid_answer_is_not_retried(llm: OpenAIServer) -> None:
    """H2: once the answer began, a stall ends the call at the client's read timeout and
    is not retried (its tokens were streamed already)."""
    llm.script(Reply.text("one two three four", stall_after=2))
    s = Settings(
        model="openai:gpt-fixture",
        model_base_url=llm.url,
        model_api_key=SecretStr("sk-fixture"),
        model_timeout_s=0.5,
    )
    inner = make_model(s).inner  # type: ignore[attr-defined]
    model = RetryingChatModel(inner=inner, policy=policy())

    async def run() -> tuple[list[str], ModelCallFailed | None]:
        seen: list[str] = []
        try:
            async for chunk in model.astream([HumanMessage("hi")]):
                seen.append(chunk.text)
        except ModelCallFailed as exc:
            return seen, exc
        return seen, None

    seen, error = asyncio.run(run())
    assert "".join(seen).startswith("one two")
    assert isinstance(error, ModelCallFailed) and error.mid_stream and error.attempts == 1
    assert len(llm.received()) == 1
    record = describe_model_error(error)
    assert record is not None and "mid-answer" in record["message"]
