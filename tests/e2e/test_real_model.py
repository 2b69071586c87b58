"""A real model client (langchain-openai) against a local OpenAI-compatible server.

The cluster's processes run `THREADRUN_MODEL=openai:gpt-fixture` with the base URL of
tests/fixtures/openai_server.py, which streams chat-completion chunks, tool calls and
usage, and answers 429/500/slowly when a test scripts it. Everything between the
official SDK and the fixture is the real thing: web, worker, the OpenAI client and its
retries, the journal. Short settings keep it fast: one client retry, a 2 s timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient

from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ALICE, ClusterFactory, human, run_sdk
from tests.fixtures.openai_server import OpenAIServer, Reply, ToolCall

pytestmark = pytest.mark.e2e

MODEL = "openai:gpt-fixture"
TIMEOUT_S = 2.0
RETRIES = 1


@pytest.fixture(scope="module")
def llm() -> Iterator[OpenAIServer]:
    """The fixture server, shared by the module's tests (each resets its script)."""
    with OpenAIServer() as server:
        yield server


@pytest.fixture(scope="module")
def real(private_cluster: ClusterFactory, llm: OpenAIServer) -> Iterator[Cluster]:
    """A web process and a runs worker whose model is the real OpenAI client."""
    env = {
        "THREADRUN_MODEL": MODEL,
        "THREADRUN_MODEL_BASE_URL": llm.url,
        "THREADRUN_MODEL_API_KEY": "sk-fixture",
        "THREADRUN_MODEL_TIMEOUT_S": str(TIMEOUT_S),
        "THREADRUN_MODEL_MAX_RETRIES": str(RETRIES),
    }
    with private_cluster("real-model", env) as c:
        c.start()
        yield c


@pytest.fixture
def fresh(llm: OpenAIServer) -> OpenAIServer:
    """The fixture server with no script and no requests recorded."""
    llm.reset()
    return llm


def ai_text(parts: list[Any]) -> str:
    """The AI text streamed in `messages` events (messages-tuple mode)."""
    return "".join(
        p.data[0].get("content") or ""
        for p in parts
        if p.event == "messages"
        and p.data[0].get("type") in ("AIMessageChunk", "ai")
        and isinstance(p.data[0].get("content"), str)
    )


def journal(c: Cluster, tid: str, run_id: str) -> list[dict[str, Any]]:
    """The run's audit trail (its journal events)."""
    with httpx.Client(base_url=c.url, headers={"x-api-key": ALICE}, timeout=10) as h:
        res = h.get(f"/threads/{tid}/runs/{run_id}/events", params={"limit": 500})
        res.raise_for_status()
        events: list[dict[str, Any]] = res.json()["events"]
        return events


def test_real_model_streams_tokens_calls_a_tool_and_records_usage(
    real: Cluster, fresh: OpenAIServer
) -> None:
    """A real-model run streams tokens, calls a tool (write_artifact, whose result
    goes back to the model), and records the usage the provider reported in its last
    streamed chunk (stream_options.include_usage)."""
    fresh.script(
        Reply.text(
            "Writing notes.md.",
            tool_calls=(ToolCall("write_artifact", {"filename": "notes.md", "content": "# N\n"}),),
        ),
        Reply.text("Saved notes.md for you, as asked.", token_delay_s=0.01),
    )

    async def scenario(c: LangGraphClient) -> tuple[str, str, list[Any]]:
        tid = (await c.threads.create())["thread_id"]
        parts = [
            p
            async for p in c.runs.stream(
                tid,
                "lead_agent",
                input=human("please write notes.md"),
                stream_mode=["messages-tuple", "values"],
            )
        ]
        assert parts[-1].event == "end" and parts[-1].data["status"] == "success", parts[-3:]
        run_id = parts[0].data["run_id"]
        state = await c.threads.get_state(tid)
        msgs = state["values"]["messages"]
        assert [m["type"] for m in msgs] == ["human", "ai", "tool", "ai"]
        assert msgs[1]["tool_calls"][0]["name"] == "write_artifact"
        assert msgs[3]["content"] == "Saved notes.md for you, as asked."
        assert any(a.endswith("notes.md") for a in state["values"]["artifacts"])
        run = await c.runs.get(tid, run_id)
        # 11 prompt tokens per call (the fixture's count) + 2 and 6 streamed tokens.
        assert run["usage"]["total"]["total_tokens"] == (11 + 2) + (11 + 6)
        return tid, run_id, parts

    tid, run_id, parts = run_sdk(scenario, real.url)
    assert "Saved notes.md for you, as asked." in ai_text(parts)
    streamed = [p for p in parts if p.event == "messages"]
    assert len(streamed) >= 6  # token by token, not one final message
    chats = fresh.received()
    assert len(chats) == 2
    assert all(r.body["stream"] and r.body["stream_options"]["include_usage"] for r in chats)
    assert "write_artifact" in [t["function"]["name"] for t in chats[0].body["tools"]]
    assert chats[1].body["messages"][-1]["role"] == "tool"
    ends = [e for e in journal(real, tid, run_id) if e["type"] == "model.end"]
    assert [e["payload"]["usage"]["total_tokens"] for e in ends] == [13, 17]


def test_a_429_is_retried_with_backoff_then_succeeds(real: Cluster, fresh: OpenAIServer) -> None:
    """bounded retries: the client retries a 429 (honouring retry-after-ms) and
    the run succeeds with the second answer."""
    fresh.script(Reply(status=429, retry_after_ms=50), Reply.text("Recovered after a 429."))

    async def scenario(c: LangGraphClient) -> Any:
        tid = (await c.threads.create())["thread_id"]
        return await c.runs.wait(tid, "lead_agent", input=human("hello"))

    out = run_sdk(scenario, real.url)
    assert out["messages"][-1]["content"] == "Recovered after a 429."
    statuses = [r.status for r in fresh.received()]
    assert statuses == [429, 200]
    gap = fresh.received()[1].at - fresh.received()[0].at
    assert gap >= 0.05  # the client waited as told before retrying


def test_a_500_after_retries_is_a_typed_error_everywhere(
    real: Cluster, fresh: OpenAIServer
) -> None:
    """A failing endpoint ends the run `error` with a typed, readable error
    (provider, endpoint host, HTTP status, retried or not) in the stream's `error` event,
    in the run record (runs.get), and in the run's journal (`model.error`)."""
    fresh.script(*[Reply(status=500)] * (RETRIES + 1))
    host = fresh.url.removeprefix("http://").split("/")[0]

    async def scenario(c: LangGraphClient) -> tuple[str, str, list[Any], dict[str, Any]]:
        tid = (await c.threads.create())["thread_id"]
        parts = [p async for p in c.runs.stream(tid, "lead_agent", input=human("hello"))]
        run_id = parts[0].data["run_id"]
        return tid, run_id, parts, await c.runs.get(tid, run_id)

    tid, run_id, parts, run = run_sdk(scenario, real.url)
    assert [p.event for p in parts][-2:] == ["error", "end"]
    assert parts[-1].data["status"] == "error"
    err = parts[-2].data
    assert err["error"] == "ModelCallError"
    assert (err["provider"], err["host"], err["status_code"]) == ("openai", host, 500)
    assert (err["kind"], err["retries"], err["will_retry"]) == ("server_error", RETRIES, False)
    assert f"openai at {host} answered HTTP 500" in err["message"]
    assert f"retried {RETRIES} time" in err["message"]
    assert run["status"] == "error" and run["error"] == err
    assert [r.status for r in fresh.received()] == [500] * (RETRIES + 1)
    failed = [e for e in journal(real, tid, run_id) if e["type"] == "model.error"]
    assert failed and failed[0]["payload"]["status_code"] == 500
    assert failed[0]["payload"]["host"] == host


def test_a_slow_answer_hits_the_timeout_as_a_typed_error(
    real: Cluster, fresh: OpenAIServer
) -> None:
    """THREADRUN_MODEL_TIMEOUT_S bounds each request; the run ends `error` with
    kind `timeout` after the client's retries instead of hanging."""
    fresh.script(*[Reply.text("too late", delay_s=TIMEOUT_S + 3)] * (RETRIES + 1))

    async def scenario(c: LangGraphClient) -> tuple[list[Any], dict[str, Any]]:
        tid = (await c.threads.create())["thread_id"]
        parts = [p async for p in c.runs.stream(tid, "lead_agent", input=human("hello"))]
        return parts, await c.runs.get(tid, parts[0].data["run_id"])

    parts, run = run_sdk(scenario, real.url)
    assert parts[-1].data["status"] == "error"
    err = parts[-2].data
    assert (err["error"], err["kind"], err["status_code"]) == ("ModelCallError", "timeout", None)
    assert "did not answer in time" in err["message"]
    assert run["error"]["kind"] == "timeout"
    assert len(fresh.received()) == RETRIES + 1


def test_stop_keeps_what_was_said(real: Cluster, fresh: OpenAIServer) -> None:
    """cancel(interrupt) mid-answer (the stop button) commits the partial AI
    message streamed so far, marked `response_metadata.stopped`, so get_state and the
    history show it; the next user message follows it (never two user messages in a
    row), twice over."""
    words = " ".join(f"w{i}" for i in range(200))
    fresh.script(
        Reply.text(words, token_delay_s=0.02),
        Reply.text(words, token_delay_s=0.02),
        Reply.text("Done."),
    )

    async def stop_midway(c: LangGraphClient, tid: str, text: str) -> str:
        seen = ""
        run_id = ""
        async for p in c.runs.stream(
            tid, "lead_agent", input=human(text), stream_mode=["messages-tuple"]
        ):
            if p.event == "metadata":
                run_id = p.data["run_id"]
            seen += ai_text([p])
            if len(seen.split()) >= 10 and run_id:
                await c.runs.cancel(tid, run_id, wait=True, action="interrupt")
                break
        assert (await c.runs.get(tid, run_id))["status"] == "interrupted"
        return seen

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        first = await stop_midway(c, tid, "talk a lot")
        state = await c.threads.get_state(tid)
        msgs = state["values"]["messages"]
        assert [m["type"] for m in msgs] == ["human", "ai"]
        stopped = msgs[1]
        assert stopped["response_metadata"]["stopped"] is True
        assert stopped["content"].startswith(first.strip())  # at least what the client saw
        assert words.startswith(stopped["content"]) and stopped["content"] != words
        assert state["next"] == []

        await stop_midway(c, tid, "again")
        out = await c.runs.wait(tid, "lead_agent", input=human("and now briefly"))
        kinds = [m["type"] for m in out["messages"]]
        assert kinds == ["human", "ai", "human", "ai", "human", "ai"]
        assert [m["response_metadata"].get("stopped") for m in out["messages"][1::2]] == [
            True,
            True,
            None,
        ]
        assert out["messages"][-1]["content"] == "Done."
        history = await c.threads.get_history(tid, limit=50)
        assert any(
            any(m.get("response_metadata", {}).get("stopped") for m in h["values"]["messages"])
            for h in history
        )
        # The model saw the stopped answer as the assistant's turn before the new question.
        last = fresh.received()[-1].body["messages"]
        assert [m["role"] for m in last[-2:]] == ["assistant", "user"]

    run_sdk(scenario, real.url)


def test_failing_summary_and_memory_models_never_break_a_chat_run(
    private_cluster: ClusterFactory, fresh: OpenAIServer
) -> None:
    """the summary and memory models (THREADRUN_SUMMARY_MODEL, _MEMORY_MODEL)
    fail with 500 on every call, and the chat runs still succeed: summarization falls
    back to the run model or changes nothing, memory extraction is retried in the
    background by the memory worker."""
    fresh.defaults["summary"] = Reply(status=500)
    fresh.defaults["memory"] = Reply(status=500)
    env = {
        "THREADRUN_SUMMARY_MODEL": "openai:summarizer",
        "THREADRUN_MEMORY_MODEL": "openai:memorizer",
        "THREADRUN_MODEL_BASE_URL": fresh.url,
        "THREADRUN_MODEL_API_KEY": "sk-fixture",
        "THREADRUN_MODEL_MAX_RETRIES": "0",
        "THREADRUN_SUMMARY_TRIGGER_TOKENS": "30",
        "THREADRUN_SUMMARY_KEEP_MESSAGES": "2",
        "THREADRUN_MEMORY_DEBOUNCE_S": "0",
        "THREADRUN_MEMORY_MAX_WAIT_S": "0",
        "THREADRUN_MEMORY_DRAIN_INTERVAL_S": "0.2",
    }
    with private_cluster("side-models", env) as c:
        c.side_by_side(
            c.start_web, c.start_worker, lambda: c.start_worker("memory", 2, queues="memory")
        )

        async def scenario(cl: LangGraphClient) -> list[str]:
            tid = (await cl.threads.create())["thread_id"]
            statuses = []
            for i in range(3):
                text = f"turn {i}: I prefer short answers with plenty of detail about {i}"
                await cl.runs.wait(tid, "lead_agent", input=human(text))
                runs = await cl.runs.list(tid, limit=1)
                statuses.append(runs[0]["status"])
            return statuses

        assert run_sdk(scenario, c.url) == ["success"] * 3
        wait_for(lambda: fresh.received("summary"), timeout=10, what="a summary call")
        wait_for(lambda: fresh.received("memory"), timeout=20, what="a memory call")
        assert all(r.status == 500 for r in fresh.received("summary") + fresh.received("memory"))
        assert {r.body["model"] for r in fresh.received("summary")} == {"summarizer"}
        assert fresh.received("chat") == []  # the run model is the built-in one


def test_stop_keeps_what_was_said_with_the_builtin_model(cluster: Cluster) -> None:
    """The same with the default (built-in) model on the session cluster: the stopped
    answer is the streamed prefix of the reply, and history ends with it."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        knobs = {"configurable": {"tokens": 400, "token_delay_ms": 10}}
        r = await c.runs.create(
            tid, "lead_agent", input=human("long"), config=knobs, stream_mode=["messages-tuple"]
        )
        chunks = 0  # stop once tokens are streaming, however slowly the run started
        async for part in c.runs.join_stream(tid, r["run_id"], last_event_id="-1"):
            chunks += part.event == "messages"
            if chunks >= 10:
                break
        await c.runs.cancel(tid, r["run_id"], wait=True, action="interrupt")
        msgs = (await c.threads.get_state(tid))["values"]["messages"]
        assert [m["type"] for m in msgs] == ["human", "ai"]
        assert msgs[1]["content"].startswith("(turn 1) You said: long")
        assert 5 < len(msgs[1]["content"].split()) < 400
        assert msgs[1]["response_metadata"]["stopped"] is True

    run_sdk(scenario, cluster.url)
