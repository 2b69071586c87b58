"""The run pipeline end to end, driven by the official langgraph-sdk against real processes.

Web (gunicorn) and a Celery worker run as separate processes on a private database and
Redis prefix (see conftest.py). Covers A1, A4, R2-R6, B4, B5 and the J5 order
(status committed before the stream closes).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient

from shared.tools.testing import Cluster
from shared.workspaces import thread_workspace
from tests.e2e.conftest import ALICE, BOB, human
from tests.e2e.conftest import run_sdk as run

pytestmark = pytest.mark.e2e


def knobs(tokens: int = 8, delay_ms: float = 0) -> dict[str, Any]:
    return {"configurable": {"tokens": tokens, "token_delay_ms": delay_ms}}


def ai_tokens(parts: list[Any]) -> list[str]:
    """Texts of the AI token chunks among `messages` events."""
    out = []
    for p in parts:
        if (
            p.event == "messages"
            and p.data[0].get("type") == "AIMessageChunk"
            and p.data[0].get("content")
        ):
            out.append(p.data[0]["content"])
    return out


def test_a1_stream_a_run_then_read_state_and_history(cluster: Cluster) -> None:
    """A1: metadata first, tokens live, `end` last with the committed status; state and history after."""

    async def scenario(c: LangGraphClient) -> None:
        thread = await c.threads.create(metadata={"topic": "e2e"})
        tid = thread["thread_id"]
        parts = [
            p
            async for p in c.runs.stream(
                tid,
                "lead_agent",
                input=human("hello"),
                stream_mode=["messages-tuple", "values", "updates"],
                config=knobs(tokens=12),
            )
        ]
        assert parts[0].event == "metadata" and parts[0].data["attempt"] == 1
        run_id = parts[0].data["run_id"]
        assert len(ai_tokens(parts)) == 12
        assert {"values", "updates", "messages"} <= {p.event for p in parts}
        assert parts[-1].event == "end" and parts[-1].data == {
            "run_id": run_id,
            "status": "success",
        }
        ids = [p.id for p in parts]
        assert all(ids) and len(set(ids)) == len(ids)
        # The status was committed before the stream closed (A1).
        assert (await c.runs.get(tid, run_id))["status"] == "success"
        state = await c.threads.get_state(tid)
        assert [m["type"] for m in state["values"]["messages"]] == ["human", "ai"]
        history = await c.threads.get_history(tid, limit=50)
        assert (
            len(history) >= 2
            and history[0]["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
        )
        t = await c.threads.get(tid)
        assert (
            t["status"] == "idle"
            and t["metadata"]["graph_id"] == "lead_agent"
            and t["metadata"]["topic"] == "e2e"
        )
        found = await c.threads.search(metadata={"topic": "e2e"})
        assert tid in [x["thread_id"] for x in found]

    run(scenario, cluster.url)


def test_b4_rejoin_a_running_run_gets_exactly_the_rest(cluster: Cluster) -> None:
    """B4: drop the stream mid-run, rejoin with the last event id: every event exactly once."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        first: list[Any] = []
        gen = c.runs.stream(
            tid,
            "lead_agent",
            input=human("stream slowly"),
            stream_mode=["messages-tuple"],
            config=knobs(tokens=60, delay_ms=15),
            stream_resumable=True,
            on_disconnect="continue",
        )
        async for p in gen:
            first.append(p)
            if len(first) == 15:
                break
        await gen.aclose()
        run_id = first[0].data["run_id"]
        assert (await c.runs.get(tid, run_id))["status"] == "running"
        rest = [p async for p in c.runs.join_stream(tid, run_id, last_event_id=first[-1].id)]
        full = [p async for p in c.runs.join_stream(tid, run_id, last_event_id="-1")]
        assert [p.id for p in first + rest] == [p.id for p in full]
        assert Counter(ai_tokens(first + rest)) == Counter(ai_tokens(full))
        assert len(ai_tokens(full)) == 60 and rest[-1].event == "end"

    run(scenario, cluster.url)


def test_second_run_sees_the_first_runs_messages(cluster: Cluster) -> None:
    """Durable state: a second run on the thread continues from the first run's checkpoint."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        await c.runs.wait(tid, "lead_agent", input=human("one"), config=knobs())
        values = await c.runs.wait(tid, "lead_agent", input=human("two"), config=knobs(tokens=10))
        msgs = values["messages"]
        assert [m["type"] for m in msgs] == ["human", "ai", "human", "ai"]
        assert msgs[-1]["content"].startswith("(turn 2)")

    run(scenario, cluster.url)


def test_r3_reject_gives_409_and_enqueue_runs_in_order(cluster: Cluster) -> None:
    """R3: reject on a busy thread is a 409 that creates nothing; enqueued runs run one at a time, FIFO."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        slow = await c.runs.create(
            tid, "lead_agent", input=human("slow"), config=knobs(tokens=40, delay_ms=10)
        )
        with pytest.raises(httpx.HTTPStatusError) as info:
            await c.runs.create(tid, "lead_agent", input=human("x"), multitask_strategy="reject")
        assert info.value.response.status_code == 409
        queued = [
            await c.runs.create(
                tid,
                "lead_agent",
                input=human(f"q{i}"),
                config=knobs(),
                multitask_strategy="enqueue",
            )
            for i in range(3)
        ]
        for r in [slow, *queued]:
            await c.runs.join(tid, r["run_id"])
        runs = {r["run_id"]: r for r in await c.runs.list(tid, limit=10)}
        assert len(runs) == 4 and all(r["status"] == "success" for r in runs.values())
        order = [slow["run_id"]] + [q["run_id"] for q in queued]
        started = [runs[r]["started_at"] for r in order]
        ended = [runs[r]["ended_at"] for r in order]
        assert started == sorted(started)
        assert all(ended[i] <= started[i + 1] for i in range(3))  # never two at once
        msgs = (await c.threads.get_state(tid))["values"]["messages"]
        assert [m["content"] for m in msgs if m["type"] == "human"] == ["slow", "q0", "q1", "q2"]

    run(scenario, cluster.url)


def test_a4_another_users_key_gets_404_everywhere(cluster: Cluster) -> None:
    """A4: bob cannot see or steer alice's thread, runs, state or stream; no key is a 401."""

    async def make(c: LangGraphClient) -> tuple[str, str]:
        tid = (await c.threads.create())["thread_id"]
        r = await c.runs.wait(tid, "lead_agent", input=human("mine"), config=knobs())
        runs = await c.runs.list(tid)
        assert r["messages"]
        return tid, runs[0]["run_id"]

    tid, run_id = run(make, cluster.url)
    base = cluster.url
    calls = [
        ("GET", f"/threads/{tid}"),
        ("GET", f"/threads/{tid}/state"),
        ("POST", f"/threads/{tid}/history"),
        ("GET", f"/threads/{tid}/runs"),
        ("GET", f"/threads/{tid}/runs/{run_id}"),
        ("GET", f"/threads/{tid}/runs/{run_id}/join"),
        ("GET", f"/threads/{tid}/runs/{run_id}/stream"),
        ("POST", f"/threads/{tid}/runs/{run_id}/cancel"),
        ("DELETE", f"/threads/{tid}/runs/{run_id}"),
        ("PATCH", f"/threads/{tid}"),
        ("DELETE", f"/threads/{tid}"),
    ]
    with httpx.Client(base_url=base, headers={"x-api-key": BOB}, timeout=10) as bob:
        for method, path in calls:
            body = (
                {"metadata": {"x": 1}} if method == "PATCH" else ({} if method == "POST" else None)
            )
            res = bob.request(method, path, json=body, headers={"Last-Event-ID": "-1"})
            assert res.status_code == 404, (method, path, res.status_code, res.text)
        res = bob.post(f"/threads/{tid}/runs", json={"assistant_id": "lead_agent"})
        assert res.status_code == 404
        assert all(t["thread_id"] != tid for t in bob.post("/threads/search", json={}).json())
    assert httpx.get(f"{base}/threads/{tid}", timeout=10).status_code == 401
    assert (
        httpx.get(f"{base}/threads/{tid}", headers={"x-api-key": ALICE}, timeout=10).status_code
        == 200
    )


def test_a3_bad_input_is_a_clear_4xx(cluster: Cluster) -> None:
    """A3/B4: invalid bodies, unknown assistants and bad cursors are 4xx naming the problem."""
    with httpx.Client(base_url=cluster.url, headers={"x-api-key": ALICE}, timeout=10) as c:
        tid = c.post("/threads", json={}).json()["thread_id"]
        res = c.post(
            f"/threads/{tid}/runs", json={"assistant_id": "lead_agent", "webhook": "ftp://x"}
        )
        assert res.status_code == 422 and "webhook" in res.text
        res = c.post(
            f"/threads/{tid}/runs", json={"assistant_id": "lead_agent", "stream_mode": "strem"}
        )
        assert res.status_code == 422 and res.json()["field"] == "stream_mode"
        assert c.post(f"/threads/{tid}/runs", json={"assistant_id": "nope"}).status_code == 404
        assert c.post(f"/threads/{tid}/runs", content=b"{not json").status_code == 400
        assert c.post(f"/threads/{tid}/runs", json=[1, 2]).status_code == 422
        assert c.get("/threads/not-a-uuid").status_code == 404
        assert c.post("/threads", json={"thread_id": tid}).status_code == 409
        run_id = c.post(
            f"/threads/{tid}/runs", json={"assistant_id": "lead_agent", "input": human("x")}
        ).json()["run_id"]
        res = c.get(f"/threads/{tid}/runs/{run_id}/stream", headers={"Last-Event-ID": "gar bage"})
        assert res.status_code == 400 and "Last-Event-ID" in res.text
        res = c.get(f"/threads/{tid}/runs/{run_id}/join")
        assert res.status_code == 200
        res = c.get(
            f"/threads/{tid}/runs/{run_id}/stream", headers={"Last-Event-ID": "99999999999999-0"}
        )
        assert res.status_code == 400
        res = c.post(
            f"/threads/{tid}/runs",
            content=b"x" * (2 << 20),
            headers={"content-type": "application/json"},
        )
        assert res.status_code == 413


def test_g4_a_failing_run_reports_error_everywhere(cluster: Cluster) -> None:
    """G4: a graph error reaches the stream as an `error` event; /wait returns `__error__`; status `error`."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        bad = {"configurable": {"tokens": -1}}  # the built-in model refuses this
        parts = [p async for p in c.runs.stream(tid, "lead_agent", input=human("x"), config=bad)]
        assert [p.event for p in parts][-2:] == ["error", "end"]
        assert parts[-2].data["error"] and parts[-2].data["message"]
        assert parts[-1].data["status"] == "error"
        res = await c.runs.wait(tid, "lead_agent", input=human("x"), config=bad, raise_error=False)
        assert "__error__" in res
        assert (await c.threads.get(tid))["status"] == "error"

    run(scenario, cluster.url)


def test_r5_cancel_interrupt_keeps_progress(cluster: Cluster) -> None:
    """R5: cancel(interrupt, wait) stops the run at a safe point; the thread is usable again."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        r = await c.runs.create(
            tid,
            "lead_agent",
            input=human("long"),
            config=knobs(tokens=400, delay_ms=10),
            stream_mode=["messages-tuple"],
        )
        await asyncio.sleep(0.5)
        await c.runs.cancel(tid, r["run_id"], wait=True, action="interrupt")
        got = await c.runs.get(tid, r["run_id"])
        assert got["status"] == "interrupted"
        parts = [p async for p in c.runs.join_stream(tid, r["run_id"], last_event_id="-1")]
        assert parts[-1].event == "end" and parts[-1].data["status"] == "interrupted"
        assert 0 < len(ai_tokens(parts)) < 400
        after = await c.runs.wait(tid, "lead_agent", input=human("after"), config=knobs())
        assert after["messages"][-1]["type"] == "ai"

    run(scenario, cluster.url)


def test_r3_rollback_strategy_undoes_the_inflight_run(cluster: Cluster) -> None:
    """R3: a new run with multitask_strategy=rollback cancels the inflight run, restores the
    thread to its pre-run state, then runs: the undone run's message is gone, the earlier
    conversation and the new run's are there."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        await c.runs.wait(tid, "lead_agent", input=human("earlier"), config=knobs())
        long = await c.runs.create(
            tid, "lead_agent", input=human("undone"), config=knobs(tokens=400, delay_ms=10)
        )
        await asyncio.sleep(0.5)
        new = await c.runs.create(
            tid,
            "lead_agent",
            input=human("instead"),
            config=knobs(),
            multitask_strategy="rollback",
        )
        await c.runs.join(tid, new["run_id"])
        assert (await c.runs.get(tid, long["run_id"]))["status"] == "interrupted"
        got = await c.runs.get(tid, new["run_id"])
        assert got["status"] == "success", got.get("error")
        state = await c.threads.get_state(tid)
        humans = [m["content"] for m in state["values"]["messages"] if m["type"] == "human"]
        assert humans == ["earlier", "instead"]

    run(scenario, cluster.url)


def test_r6_on_disconnect_cancel(cluster: Cluster) -> None:
    """R6: a stream created with on_disconnect=cancel is cancelled when the client goes away."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        gen = c.runs.stream(
            tid,
            "lead_agent",
            input=human("x"),
            config=knobs(tokens=400, delay_ms=10),
            stream_mode="messages-tuple",
            on_disconnect="cancel",
        )
        run_id = None
        async for p in gen:
            if p.event == "metadata":
                run_id = p.data["run_id"]
            elif p.event == "messages":
                break
        await gen.aclose()
        assert run_id
        for _ in range(100):
            status = (await c.runs.get(tid, run_id))["status"]
            if status != "running":
                break
            await asyncio.sleep(0.1)
        assert status == "interrupted"

    run(scenario, cluster.url)


def test_tool_call_writes_an_artifact(cluster: Cluster) -> None:
    """§9: the built-in model calls the tool that writes an artifact into the thread's workspace."""

    async def scenario(c: LangGraphClient) -> str:
        tid = (await c.threads.create())["thread_id"]
        parts = [
            p
            async for p in c.runs.stream(
                tid,
                "lead_agent",
                input=human("please write a report"),
                stream_mode=["updates"],
                config=knobs(),
            )
        ]
        nodes = [next(iter(p.data)) for p in parts if p.event == "updates"]
        assert "tools" in nodes
        return tid

    tid = run(scenario, cluster.url)
    path = thread_workspace(cluster.settings.workspace_dir, "alice", tid) / "outputs" / "report.md"
    assert path.is_file() and path.stat().st_size > 0


def test_assistants_and_info(cluster: Cluster) -> None:
    """A1: each graph of langgraph.json has a system assistant; its graph name works as its id."""

    async def scenario(c: LangGraphClient) -> None:
        found = await c.assistants.search(metadata={"created_by": "system"})
        assert [a["graph_id"] for a in found] == ["lead_agent"]
        by_id = await c.assistants.get(found[0]["assistant_id"])
        by_name = await c.assistants.get("lead_agent")
        assert by_id == by_name
        tid = (await c.threads.create())["thread_id"]
        res = await c.runs.wait(tid, found[0]["assistant_id"], input=human("by id"), config=knobs())
        assert res["messages"][-1]["type"] == "ai"

    run(scenario, cluster.url)
    flags = httpx.get(f"{cluster.url}/info", timeout=5).json()["flags"]
    assert flags["assistants"] is True and flags["crons"] is True  # clients hide what is off


def test_state_update_through_the_api(cluster: Cluster) -> None:
    """State update writes a new head checkpoint the next read returns."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        await c.runs.wait(tid, "lead_agent", input=human("hi"), config=knobs())
        before = await c.threads.get_state(tid)
        msg = {"type": "human", "content": "added by update", "id": str(uuid.uuid4())}
        out = await c.threads.update_state(tid, {"messages": [msg]}, as_node="model")
        assert out["checkpoint"]["checkpoint_id"] != before["checkpoint"]["checkpoint_id"]
        after = await c.threads.get_state(tid)
        assert after["values"]["messages"][-1]["content"] == "added by update"

    run(scenario, cluster.url)


def test_a1_interrupt_before_then_resume(cluster: Cluster) -> None:
    """A1: interrupt_before stops the graph before a node (thread `interrupted`); a run with
    no input resumes it from the checkpoint."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        first = await c.runs.wait(
            tid,
            "lead_agent",
            input=human("please write a report"),
            config=knobs(),
            interrupt_before=["tools"],
        )
        assert first["messages"][-1]["tool_calls"]
        state = await c.threads.get_state(tid)
        assert state["next"] == ["tools"]
        assert (await c.threads.get(tid))["status"] == "interrupted"
        done = await c.runs.wait(tid, "lead_agent", input=None, config=knobs())
        assert [m["type"] for m in done["messages"]][-2:] == ["tool", "ai"]
        assert (await c.threads.get_state(tid))["next"] == []
        assert (await c.threads.get(tid))["status"] == "idle"

    run(scenario, cluster.url)


def test_j1_j5_audit_trail_of_a_run(cluster: Cluster) -> None:
    """J1/J2/J4/J5: a run's audit trail lists the model calls with usage, the tool call that
    wrote the artifact, the artifact, and the delivery receipt; usage is summed into the run
    and the thread; another user sees none of it."""

    async def scenario(c: LangGraphClient) -> tuple[str, str]:
        tid = (await c.threads.create())["thread_id"]
        await c.runs.wait(tid, "lead_agent", input=human("please write a report"), config=knobs())
        run = (await c.runs.list(tid))[0]
        assert run["status"] == "success"
        assert run["usage"]["total"]["total_tokens"] > 0
        return tid, run["run_id"]

    tid, run_id = run(scenario, cluster.url)
    with httpx.Client(base_url=cluster.url, headers={"x-api-key": ALICE}, timeout=10) as c:
        events = c.get(f"/threads/{tid}/runs/{run_id}/events", params={"limit": 500}).json()[
            "events"
        ]
        kinds = [(e["category"], e["type"]) for e in events]
        seqs = [e["seq"] for e in events]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert kinds.count(("model", "model.end")) == 2
        ends = [e for e in events if e["type"] == "model.end"]
        assert all(e["payload"]["usage"]["total_tokens"] > 0 for e in ends)
        calls = [e for e in events if e["category"] == "tool" and e["type"] == "tool.call"]
        assert [e["payload"]["name"] for e in calls] == ["write_artifact"]
        assert any(e["category"] == "artifact" for e in events)
        # J5 order: the receipt precedes the terminal lifecycle event.
        order = [e["type"] for e in events if e["type"] in ("run.delivery", "success")]
        assert order == ["run.delivery", "success"]
        receipt = c.get(f"/threads/{tid}/runs/{run_id}/delivery").json()
        coverage = receipt["payload"]["coverage"]
        assert (
            receipt["payload"]["produced_output"]
            and coverage
            and all(x["exists"] for x in coverage)
        )
        tools = c.get(f"/threads/{tid}/runs/{run_id}/events", params={"category": "tool"}).json()
        assert {e["category"] for e in tools["events"]} == {"tool"}
        usage = c.get(f"/threads/{tid}/token-usage").json()
        assert usage["total"]["total_tokens"] > 0 and "lead_agent" in usage["by_tag"]
        assert c.get(f"/threads/{tid}/messages/page").status_code == 200
        assert (
            c.get(f"/threads/{tid}/runs/{run_id}/events", params={"category": "nope"}).status_code
            == 422
        )
    with httpx.Client(base_url=cluster.url, headers={"x-api-key": BOB}, timeout=10) as bob:
        for path in (
            f"/threads/{tid}/runs/{run_id}/events",
            f"/threads/{tid}/events",
            f"/threads/{tid}/messages/page",
            f"/threads/{tid}/token-usage",
            f"/threads/{tid}/runs/{run_id}/delivery",
        ):
            assert bob.get(path).status_code == 404, path


def test_a5_openapi_document(cluster: Cluster) -> None:
    """A5: /openapi.json lists the served routes with the request schemas that validate them."""
    doc = httpx.get(f"{cluster.url}/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.1")
    stream = doc["paths"]["/threads/{thread_id}/runs/stream"]["post"]
    assert stream["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RunCreate"
    }
    assert "text/event-stream" in stream["responses"]["200"]["content"]
    run_create = doc["components"]["schemas"]["RunCreate"]
    assert "assistant_id" in run_create["required"]
    assert run_create.get("additionalProperties", True) is not False  # unknown fields: ignored
    assert {"get"} <= set(doc["paths"]["/threads/{thread_id}/runs/{run_id}/events"])
    cancel = doc["paths"]["/threads/{thread_id}/runs/{run_id}/cancel"]["post"]
    assert {p["name"] for p in cancel["parameters"]} >= {"thread_id", "run_id", "wait", "action"}
    assert "/ws" not in doc["paths"] and "/ui" not in doc["paths"]


def test_a1_messages_stream_mode_through_the_sdk(cluster: Cluster) -> None:
    """A1: `stream_mode="messages"` gives `messages/metadata` once per message and
    `messages/partial` with the whole message so far; the last partial is the reply stored
    in the thread's state; a join replays the same events, filtered to that mode."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        parts = [
            p
            async for p in c.runs.stream(
                tid,
                "lead_agent",
                input=human("hello"),
                stream_mode=["messages", "updates"],
                config=knobs(tokens=10),
            )
        ]
        run_id = parts[0].data["run_id"]
        names = [p.event for p in parts]
        assert "messages" not in names and "updates" in names
        metas = [p.data for p in parts if p.event == "messages/metadata"]
        partial = [p.data[0] for p in parts if p.event == "messages/partial"]
        ai_ids = {m["id"] for m in partial if m["type"] == "ai"}
        assert len(ai_ids) == 1 and ai_ids <= {k for meta in metas for k in meta}
        texts = [m["content"] for m in partial if m["type"] == "ai"]
        assert len(texts) >= 10
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
        state = await c.threads.get_state(tid)
        assert texts[-1] == state["values"]["messages"][-1]["content"]
        replay = [
            p
            async for p in c.runs.join_stream(
                tid, run_id, stream_mode=["messages"], last_event_id="-1"
            )
        ]
        mine = [(p.event, p.data) for p in parts if p.event.startswith("messages/")]
        assert [(p.event, p.data) for p in replay if p.event.startswith("messages/")] == mine
        assert not [p for p in replay if p.event == "updates"]

    run(scenario, cluster.url)


def test_a1_events_stream_mode_through_the_sdk(cluster: Cluster) -> None:
    """A1: `stream_mode="events"` sends LangChain's astream_events v2 events (the model's
    tokens among them) beside the other modes asked for; the run ends `success`."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        parts = [
            p
            async for p in c.runs.stream(
                tid,
                "lead_agent",
                input=human("hello"),
                stream_mode=["events", "values"],
                config=knobs(tokens=6),
            )
        ]
        kinds = [p.data["event"] for p in parts if p.event == "events"]
        assert "on_chain_start" in kinds and "on_chain_end" in kinds
        tokens = [
            p.data["data"]["chunk"]["content"]
            for p in parts
            if p.event == "events" and p.data["event"] == "on_chat_model_stream"
        ]
        state = await c.threads.get_state(tid)
        reply = state["values"]["messages"][-1]["content"]
        assert len(tokens) >= 6 and "".join(tokens) == reply
        assert [p for p in parts if p.event == "values"][-1].data["messages"][-1]["content"] == (
            reply
        )
        assert parts[-1].event == "end" and parts[-1].data["status"] == "success"

    run(scenario, cluster.url)
