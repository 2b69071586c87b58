"""The thread stream (A1), `GET /threads/{id}/stream` end to end: the official langgraph-sdk's
`threads.join_stream` against real processes follows two consecutive runs (the events of
both, in order, with the payloads of the runs' own streams), resumes mid-way across the
run boundary, gets heartbeats while idle, and is refused for another user's thread (404)
and for a bad Last-Event-ID (400)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient

from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, BOB, ClusterFactory, human
from tests.e2e.conftest import run_sdk as run

pytestmark = pytest.mark.e2e

HEARTBEAT_S = 1.0


@pytest.fixture(scope="module")
def follow_cluster(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """A web process and a runs worker with a short heartbeat."""
    with private_cluster("thread-stream", {"THREADRUN_STREAM_HEARTBEAT_S": str(HEARTBEAT_S)}) as c:
        yield c.start()


def knobs(tokens: int, delay_ms: float = 0) -> dict[str, Any]:
    return {"configurable": {"tokens": tokens, "token_delay_ms": delay_ms}}


def is_done(part: Any) -> bool:
    return part.event == "metadata" and part.data.get("status") == "run_done"


async def follow(
    c: LangGraphClient, tid: str, runs: int, last_event_id: str | None = None
) -> list[Any]:
    """The thread stream's parts until `runs` runs are done."""
    parts: list[Any] = []
    # The async client's join_stream is a coroutine that returns the stream.
    gen = await c.threads.join_stream(tid, last_event_id=last_event_id)
    async for part in gen:
        parts.append(part)
        if sum(1 for p in parts if is_done(p)) >= runs:
            break
    await gen.aclose()  # type: ignore[attr-defined]
    return parts


async def own_stream(c: LangGraphClient, tid: str, run_id: str) -> list[Any]:
    """The run's own stream, everything retained."""
    return [p async for p in c.runs.join_stream(tid, run_id, last_event_id="-1")]


def test_a1_thread_join_stream_follows_two_runs_and_resumes_across_them(
    follow_cluster: Cluster,
) -> None:
    """A1 thread stream: a follower connected before the runs gets both runs' events in order, as
    `<run>:<id>` with the same event names and payloads as each run's own stream, each run
    closed by `run_done`; resuming from any event of the first run gets exactly the rest,
    across the boundary; resuming from the first run's `run_done` gets the second run."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        follower = asyncio.create_task(follow(c, tid, 2))
        await asyncio.sleep(1.0)  # connected (run 1 is slow: a late join still gets it all)
        run1 = await c.runs.create(
            tid,
            "lead_agent",
            input=human("one"),
            config=knobs(20, 20),
            stream_mode=["values", "messages-tuple"],
        )
        await c.runs.join(tid, run1["run_id"])
        run2 = await c.runs.create(
            tid, "lead_agent", input=human("two"), config=knobs(4), stream_mode=["updates"]
        )
        await c.runs.join(tid, run2["run_id"])
        parts = await asyncio.wait_for(follower, 30)

        expected: list[tuple[str, str, Any]] = []
        for r in (run1, run2):
            own = await own_stream(c, tid, r["run_id"])
            assert own[-1].event == "end"
            expected += [(f"{r['run_id']}:{p.id}", p.event, p.data) for p in own[:-1]]
            expected.append((f"{r['run_id']}:done", "metadata", None))
        got = [(p.id, p.event, None if is_done(p) else p.data) for p in parts]
        assert got == expected
        done1 = next(p for p in parts if is_done(p))
        assert done1.data == {
            "status": "run_done",
            "run_id": run1["run_id"],
            "run_status": "success",
        }
        assert {p.event for p in parts} >= {"metadata", "values", "messages", "updates"}

        ids = [p.id for p in parts]
        boundary = ids.index(f"{run1['run_id']}:done")
        for k in (1, boundary // 2, boundary - 1, boundary):
            rest = await asyncio.wait_for(follow(c, tid, 2 if k < boundary else 1, ids[k]), 30)
            assert [p.id for p in rest] == ids[k + 1 :], ids[k]
            assert [p.data for p in rest] == [p.data for p in parts[k + 1 :]]

    run(scenario, follow_cluster.url)


def test_b6_idle_thread_stream_heartbeats(follow_cluster: Cluster) -> None:
    """A1 thread stream / B6: a thread with nothing running keeps the stream open with heartbeat
    comments; the response names its reconnect Location (with the stream modes); the
    route is in /openapi.json (A5)."""
    with httpx.Client(base_url=follow_cluster.url, headers={"x-api-key": ALICE}) as http:
        tid = http.post("/threads", json={}).json()["thread_id"]
        beats = 0
        started = time.monotonic()
        with http.stream(
            "GET", f"/threads/{tid}/stream", params={"stream_mode": "lifecycle"}, timeout=10
        ) as res:
            assert res.status_code == 200
            assert res.headers["content-type"].startswith("text/event-stream")
            assert res.headers["location"] == f"/threads/{tid}/stream?stream_mode=lifecycle"
            for line in res.iter_lines():
                assert not line.startswith(("event:", "data:")), line
                beats += line == ": heartbeat"
                if beats == 2:
                    break
        assert time.monotonic() - started < 4 * HEARTBEAT_S
        doc = http.get("/openapi.json").json()
        op = doc["paths"]["/threads/{thread_id}/stream"]["get"]
        assert "text/event-stream" in op["responses"]["200"]["content"]
        assert {p["name"] for p in op["parameters"]} >= {"thread_id", "stream_mode"}


def test_a4_thread_stream_another_users_thread_and_bad_ids_are_refused(
    follow_cluster: Cluster,
) -> None:
    """A1 thread stream / A4 / B4: another user's thread answers 404 like a missing one; a
    malformed Last-Event-ID, or one beyond its run's last event, is a 400 naming it; an
    unknown stream mode is a 422 naming stream_mode."""

    async def scenario(c: LangGraphClient) -> tuple[str, str]:
        tid = (await c.threads.create())["thread_id"]
        r = await c.runs.wait(tid, "lead_agent", input=human("x"), config=knobs(2))
        runs = await c.runs.list(tid)
        assert r is not None
        return tid, runs[0]["run_id"]

    tid, run_id = run(scenario, follow_cluster.url)

    async def as_bob(c: LangGraphClient) -> None:
        for thread in (tid, "00000000-0000-0000-0000-000000000000", "not-a-uuid"):
            with pytest.raises(httpx.HTTPStatusError) as err:
                async for _ in await c.threads.join_stream(thread):
                    pass
            assert err.value.response.status_code == 404

    run(as_bob, follow_cluster.url, BOB)

    async def bad_ids(c: LangGraphClient) -> None:
        for bad in ("garbage", "1-1", f"{run_id}:zz", f"{run_id}:99999999999999-0"):
            with pytest.raises(httpx.HTTPStatusError) as err:
                async for _ in await c.threads.join_stream(tid, last_event_id=bad):
                    pass
            body = err.value.response.json()
            assert err.value.response.status_code == 400, bad
            assert body["field"] == "Last-Event-ID", body
        with pytest.raises(httpx.HTTPStatusError) as err:
            async for _ in await c.threads.join_stream(tid, stream_mode="values"):  # type: ignore[arg-type]
                pass
        assert err.value.response.status_code == 422
        assert err.value.response.json()["field"].startswith("stream_mode")

    run(bad_ids, follow_cluster.url)
