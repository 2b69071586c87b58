"""Wire behaviours the official server's clients count on: unknown fields ignored, a foreign
Last-Event-ID read from the start, keep-alive newlines on /wait, a cancel answered once the
run has stopped (A1, A3, B4, R5)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from langgraph_sdk.client import LangGraphClient

from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, human
from tests.e2e.conftest import run_sdk as run
from tests.e2e.test_sdk_e2e import knobs


def test_a3_unknown_fields_are_ignored_and_refused_values_still_named(cluster: Cluster) -> None:
    """A3: a body or query field the server does not know is ignored (as the official server
    does); an unsupported SDK field and an invalid value are still a 422 naming the field."""
    with httpx.Client(base_url=cluster.url, headers={"x-api-key": ALICE}, timeout=30) as c:
        tid = c.post("/threads", json={"metadata": {"wire": "a3"}, "color": "red"}).json()[
            "thread_id"
        ]
        res = c.post(
            "/threads/search",
            json={"metadata": {"wire": "a3"}, "order_by": "created_at ASC", "limit": 5},
        )
        assert res.status_code == 200 and [t["thread_id"] for t in res.json()] == [tid]
        res = c.post(
            f"/threads/{tid}/runs/wait",
            json={
                "assistant_id": "lead_agent",
                "input": human("hi"),
                "config": {**knobs(), "callbacks": None},
                "a_field_of_tomorrow": {"x": 1},
            },
        )
        assert res.status_code == 200 and res.json()["messages"][-1]["type"] == "ai"
        assert c.get(f"/threads/{tid}/runs", params={"limit": 1, "select": "x"}).status_code == 200
        res = c.post(
            f"/threads/{tid}/runs", json={"assistant_id": "lead_agent", "strict_resume": 1}
        )
        assert res.status_code == 422 and "strict_resume" in res.json()["message"]
        res = c.post(f"/threads/{tid}/runs", json={"assistant_id": "lead_agent", "stream_mode": 3})
        assert res.status_code == 422 and res.json()["field"] == "stream_mode"


def test_b4_a_foreign_last_event_id_replays_from_the_start(cluster: Cluster) -> None:
    """B4: a cursor not of this server's shape (another server's id, one a client made up)
    cannot be placed, so the join reads from the start of what is retained, as `-1` does:
    nothing is skipped. A malformed one is still a 400 naming Last-Event-ID."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        r = await c.runs.create(
            tid, "lead_agent", input=human("x"), config=knobs(6), stream_mode=["messages-tuple"]
        )
        await c.runs.join(tid, r["run_id"])
        start = [p async for p in c.runs.join_stream(tid, r["run_id"], last_event_id="-1")]
        foreign = [
            p async for p in c.runs.join_stream(tid, r["run_id"], last_event_id="mock_event_4")
        ]
        assert [(p.id, p.event) for p in foreign] == [(p.id, p.event) for p in start]
        assert foreign[-1].event == "end" and len(foreign) > 6

    run(scenario, cluster.url)
    with httpx.Client(base_url=cluster.url, headers={"x-api-key": ALICE}, timeout=30) as c:
        tid = c.post("/threads", json={}).json()["thread_id"]
        rid = c.post(
            f"/threads/{tid}/runs", json={"assistant_id": "lead_agent", "input": human("x")}
        ).json()["run_id"]
        res = c.get(f"/threads/{tid}/runs/{rid}/stream", headers={"Last-Event-ID": "not an id"})
        assert res.status_code == 400 and "Last-Event-ID" in res.text


def test_a1_wait_sends_keepalive_newlines_while_events_flow(cluster: Cluster) -> None:
    """A1: /wait sends a newline every THREADRUN_WAIT_KEEPALIVE_S (5 s) while the run lasts,
    even when its events never leave the stream idle; the body is still JSON for the SDK."""
    with httpx.Client(base_url=cluster.url, headers={"x-api-key": ALICE}, timeout=60) as c:
        tid = c.post("/threads", json={}).json()["thread_id"]
        chunks: list[bytes] = []
        started = time.monotonic()
        with c.stream(
            "POST",
            f"/threads/{tid}/runs/wait",
            json={"assistant_id": "lead_agent", "input": human("x"), "config": knobs(70, 100)},
        ) as res:
            assert res.status_code == 200
            assert "application/json" in res.headers["content-type"]
            chunks = list(res.iter_bytes())
        took = time.monotonic() - started
    body = b"".join(chunks)
    newlines = len(body) - len(body.lstrip(b"\n"))
    assert took > 6 and newlines >= int(took // 5) >= 1, (took, newlines)
    assert json.loads(body)["messages"][-1]["type"] == "ai"


def test_r5_a_cancel_without_wait_answers_once_the_run_has_stopped(cluster: Cluster) -> None:
    """R5: `cancel` without `wait` answers once the run's owner has stopped it (within
    THREADRUN_CANCEL_SETTLE_S), so a read right after it sees `interrupted`, as on the official
    server, while the status is still written by the owner, fenced, after the graph stopped."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        r = await c.runs.create(
            tid, "lead_agent", input=human("long"), config=knobs(tokens=400, delay_ms=10)
        )
        for _ in range(100):
            if (await c.runs.get(tid, r["run_id"]))["status"] == "running":
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        answer = await c.runs.cancel(tid, r["run_id"])
        assert answer["status"] == "interrupted"
        assert (await c.runs.get(tid, r["run_id"]))["status"] == "interrupted"

    run(scenario, cluster.url)
