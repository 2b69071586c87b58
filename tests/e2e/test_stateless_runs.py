"""Runs without a thread, batches and bulk cancels end to end, through the official
langgraph-sdk against real processes (A1, A3, A4, R5).

`client.runs.create/stream/wait` with `thread_id=None` run on a temporary thread of the
caller, deleted after the run ends (`on_completion=delete`, the default) or kept;
`runs.create_batch` admits runs on threads and without one, all or nothing;
`runs.cancel_many` cancels by ids on a thread or by status, only the caller's runs.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable
from typing import Any

import httpx
import orjson
import psycopg
import pytest
import redis
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.schema import RunCreateMetadata

from shared.redis_keys import Keys
from shared.tools.testing import Cluster, wait_for
from shared.workspaces import thread_workspace
from tests.e2e.conftest import ALICE, BOB, FAST_LEASES, ClusterFactory, human
from tests.e2e.conftest import run_sdk as run

pytestmark = pytest.mark.e2e

GONE_WITHIN_S = 20.0
"""The worker deletes the thread right after the end; a slow CI box gets some slack."""


def knobs(tokens: int = 6, delay_ms: float = 0) -> dict[str, Any]:
    return {"configurable": {"tokens": tokens, "token_delay_ms": delay_ms}}


async def status_of(res: Awaitable[Any]) -> int:
    """The HTTP status an SDK call failed with (200 when it did not fail)."""
    try:
        await res
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code
    return 200


async def gone(c: LangGraphClient, thread_id: str, run_id: str) -> None:
    """Wait until the thread and its run answer 404."""
    deadline = asyncio.get_running_loop().time() + GONE_WITHIN_S
    while await status_of(c.threads.get(thread_id)) != 404:
        assert asyncio.get_running_loop().time() < deadline, f"thread {thread_id} still there"
        await asyncio.sleep(0.1)
    assert await status_of(c.runs.get(thread_id, run_id)) == 404
    assert await status_of(c.threads.get_state(thread_id)) == 404


async def until_status(c: LangGraphClient, thread_id: str, run_id: str, status: str) -> None:
    deadline = asyncio.get_running_loop().time() + 30
    while (got := (await c.runs.get(thread_id, run_id))["status"]) != status:
        assert asyncio.get_running_loop().time() < deadline, f"{run_id} is {got}, not {status}"
        await asyncio.sleep(0.1)


# --- runs without a thread ---------------------------------------------------------------------
def test_a1_stateless_wait_answers_final_values_then_its_thread_is_gone(cluster: Cluster) -> None:
    """A1: /runs/wait returns the run's final values although its temporary thread (runs,
    checkpoints) is deleted when it ends; the SDK learns the ids from Content-Location."""

    async def scenario(c: LangGraphClient) -> tuple[str, Any]:
        created: list[RunCreateMetadata] = []
        values = await c.runs.wait(
            None,
            "lead_agent",
            input=human("hello"),
            config=knobs(tokens=5),
            on_run_created=created.append,
        )
        assert [m["type"] for m in values["messages"]] == ["human", "ai"]
        assert values["messages"][0]["content"] == "hello"
        (meta,) = created
        assert meta["thread_id"] and meta["run_id"]
        await gone(c, str(meta["thread_id"]), meta["run_id"])
        return meta["run_id"], values

    run_id, values = run(scenario, cluster.url)
    # What the answer came from once the thread is gone: stored by the worker before `end`.
    client = redis.Redis.from_url(cluster.settings.redis_url)
    try:
        stored = client.get(Keys(cluster.settings.redis_prefix).result(run_id))
    finally:
        client.close()
    assert stored is not None and orjson.loads(stored) == values


def test_a1_stateless_stream_ends_then_its_thread_is_gone(cluster: Cluster) -> None:
    """A1: /runs/stream streams like a thread run (metadata first, end last) and the
    thread goes after the end."""

    async def scenario(c: LangGraphClient) -> None:
        created: list[RunCreateMetadata] = []
        parts = [
            p
            async for p in c.runs.stream(
                None,
                "lead_agent",
                input=human("stream me"),
                stream_mode=["values"],
                config=knobs(),
                on_run_created=created.append,
            )
        ]
        assert parts[0].event == "metadata" and parts[-1].event == "end"
        assert parts[-1].data["status"] == "success"
        last = [p for p in parts if p.event == "values"][-1]
        assert [m["type"] for m in last.data["messages"]] == ["human", "ai"]
        (meta,) = created
        assert meta["run_id"] == parts[0].data["run_id"]
        await gone(c, str(meta["thread_id"]), meta["run_id"])

    run(scenario, cluster.url)


def removed_whole(cluster: Cluster, tid: str, rid: str) -> None:
    """The temporary thread went through the thread-removal path: its row, its run, its
    checkpoints and workspace, its admission stream, its run's lease and cancel keys; its
    run's stream, meta and `/wait` answer stay for their readers, with a TTL (A1, P6)."""
    with psycopg.connect(cluster.settings.dsn) as conn:
        for table, column, value in [
            ("threads", "thread_id", tid),
            ("runs", "run_id", rid),
            ("checkpoints", "thread_id", tid),
            ("checkpoint_writes", "thread_id", tid),
        ]:
            row = conn.execute(f"SELECT count(*) FROM {table} WHERE {column} = %s", (value,))
            assert row.fetchone() == (0,), table
    assert not thread_workspace(cluster.settings.workspace_dir, "alice", tid).exists()
    keys = Keys(cluster.settings.redis_prefix)
    client = redis.Redis.from_url(cluster.settings.redis_url)
    try:
        assert client.exists(keys.thread_runs(tid), keys.lease(rid), keys.cancel(rid)) == 0
        for key in (keys.stream(rid), keys.stream_meta(rid), keys.result(rid)):
            assert 0 < client.ttl(key) <= cluster.settings.stream_ttl_after_end_s, key
    finally:
        client.close()


REPORT = human("please write a report")
"""What makes the lead agent write a file into the thread's workspace."""


def test_a1_p6_a_stateless_threads_removal_leaves_its_clients_their_answers(
    cluster: Cluster,
) -> None:
    """A1, P6: a run without a thread has its thread removed with everything that is its
    own (rows, checkpoints, workspace files, keys) once it ends, and still `/runs/wait`
    returns its final values and a slow `/runs/stream` reader, who reads the rest only
    after the thread is gone, gets every event of the run's stream through `end`."""
    folder_seen: list[bool] = []

    async def waited(c: LangGraphClient) -> tuple[str, str]:
        created: list[RunCreateMetadata] = []
        values = await c.runs.wait(
            None, "lead_agent", input=REPORT, config=knobs(), on_run_created=created.append
        )
        assert values["messages"][0]["content"] == "please write a report"
        assert values["artifacts"], values  # it wrote into the workspace
        (meta,) = created
        await gone(c, str(meta["thread_id"]), meta["run_id"])
        return str(meta["thread_id"]), meta["run_id"]

    tid, rid = run(waited, cluster.url)
    removed_whole(cluster, tid, rid)

    async def slow_reader(c: LangGraphClient) -> tuple[str, str, list[Any]]:
        created: list[RunCreateMetadata] = []
        parts = c.runs.stream(
            None,
            "lead_agent",
            input=REPORT,
            stream_mode=["values", "updates", "messages-tuple"],
            config=knobs(tokens=200),
            on_run_created=created.append,
        )
        got = [await anext(parts)]
        assert got[0].event == "metadata"
        (meta,) = created
        # The reader stalls until its run ended and its thread is gone.
        await gone(c, str(meta["thread_id"]), meta["run_id"])
        folder = thread_workspace(cluster.settings.workspace_dir, "alice", meta["thread_id"])
        folder_seen.append(folder.exists())
        got += [p async for p in parts]
        return str(meta["thread_id"]), meta["run_id"], got

    tid, rid, parts = run(slow_reader, cluster.url)
    assert folder_seen == [False]
    removed_whole(cluster, tid, rid)
    assert parts[-1].event == "end" and parts[-1].data["status"] == "success"
    client = redis.Redis.from_url(cluster.settings.redis_url)
    try:  # the stream, kept until its TTL: the reader got each of its entries, in order
        entries = client.xrange(Keys(cluster.settings.redis_prefix).stream(rid))
    finally:
        client.close()
    assert [p.id for p in parts if p.id] == [eid.decode() for eid, _ in entries]
    assert len(entries) > 200  # a token each, and more


def test_a1_stateless_background_run_and_its_headers(cluster: Cluster) -> None:
    """A1: POST /runs answers the SDK's Run with a Content-Location like a thread run's;
    the run executes and its thread goes."""
    with httpx.Client(base_url=cluster.url, headers={"x-api-key": ALICE}, timeout=30) as h:
        res = h.post(
            "/runs",
            json={"assistant_id": "lead_agent", "input": human("bg"), "config": knobs()},
        )
        assert res.status_code == 200, res.text
        body = res.json()
        tid, rid = body["thread_id"], body["run_id"]
        assert res.headers["Content-Location"] == f"/threads/{tid}/runs/{rid}"
        assert body["status"] in ("pending", "running") and body["on_completion"] == "delete"

    async def scenario(c: LangGraphClient) -> None:
        await gone(c, tid, rid)

    run(scenario, cluster.url)


def test_a1_stateless_run_with_keep_leaves_its_thread(cluster: Cluster) -> None:
    """A1: on_completion=keep: the caller owns the thread afterwards, with its state; it is
    listed by search and invisible to another user."""

    async def scenario(c: LangGraphClient) -> str:
        created: list[RunCreateMetadata] = []
        values = await c.runs.wait(
            None,
            "lead_agent",
            input=human("keep me"),
            config=knobs(),
            on_completion="keep",
            on_run_created=created.append,
        )
        tid = str(created[0]["thread_id"])
        thread = await c.threads.get(tid)
        assert thread["status"] == "idle" and thread["metadata"]["graph_id"] == "lead_agent"
        assert tid in [t["thread_id"] for t in await c.threads.search(limit=1000)]
        state = await c.threads.get_state(tid)
        assert state["values"]["messages"] == values["messages"]
        (r,) = await c.runs.list(tid)
        assert r["status"] == "success" and r["run_id"] == created[0]["run_id"]
        return tid

    tid = run(scenario, cluster.url)

    async def as_bob(c: LangGraphClient) -> None:
        assert await status_of(c.threads.get(tid)) == 404

    run(as_bob, cluster.url, BOB)


def test_a3_on_completion_is_refused_on_a_thread_run(cluster: Cluster) -> None:
    """A3: on a thread run on_completion means nothing: a 422 naming it, never ignored; a
    run without a thread cannot resume an interrupt."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        res = c.runs.create(tid, "lead_agent", input=human("x"), on_completion="keep")
        assert await status_of(res) == 422
        assert await status_of(c.runs.wait(None, "nope", input=human("x"))) == 404
        resume = c.runs.create(None, "lead_agent", command={"resume": "yes"})
        assert await status_of(resume) == 422
        assert await c.runs.list(tid) == []

    run(scenario, cluster.url)


# --- batches ----------------------------------------------------------------------------------
def test_a1_batch_of_thread_runs_and_a_stateless_one(cluster: Cluster) -> None:
    """A1: create_batch admits runs on their threads and one without a thread, in order;
    a bad item is a 422 naming its index, a missing thread a 404 naming it, and either
    creates nothing."""

    async def scenario(c: LangGraphClient) -> None:
        t1 = (await c.threads.create())["thread_id"]
        t2 = (await c.threads.create())["thread_id"]
        payloads: list[Any] = [
            {
                "thread_id": t1,
                "assistant_id": "lead_agent",
                "input": human("one"),
                "config": knobs(),
            },
            {
                "thread_id": t2,
                "assistant_id": "lead_agent",
                "input": human("two"),
                "config": knobs(),
            },
            {"assistant_id": "lead_agent", "input": human("three"), "config": knobs()},
        ]
        runs = await c.runs.create_batch(payloads)
        assert [r["thread_id"] for r in runs[:2]] == [t1, t2]
        assert runs[2]["thread_id"] not in (t1, t2)
        assert [r["on_completion"] for r in runs] == [None, None, "delete"]
        for r, text in zip(runs[:2], ("one", "two"), strict=True):
            values = await c.runs.join(r["thread_id"], r["run_id"])
            assert [m["content"] for m in values["messages"]][0] == text
        await gone(c, runs[2]["thread_id"], runs[2]["run_id"])

        bad = [payloads[0], {"assistant_id": "lead_agent", "stream_mode": 1}]
        with pytest.raises(httpx.HTTPStatusError) as info:
            await c.runs.create_batch(bad)
        assert info.value.response.status_code == 422
        assert info.value.response.json()["field"] == "[1].stream_mode"
        missing = {**payloads[1], "thread_id": "00000000-0000-4000-8000-000000000000"}
        with pytest.raises(httpx.HTTPStatusError) as info:
            await c.runs.create_batch([payloads[0], missing])
        assert info.value.response.status_code == 404
        assert "item 1" in info.value.response.json()["message"]
        assert len(await c.runs.list(t1)) == 1 and len(await c.runs.list(t2)) == 1

    run(scenario, cluster.url)


# --- bulk cancel ------------------------------------------------------------------------------
def test_r5_cancel_many_by_ids_and_by_status_spares_other_users(cluster: Cluster) -> None:
    """R5/A4: cancel_many by ids on a thread interrupts them (the running one at its next
    safe point, the queued ones at once); by status it takes every pending run of the
    caller, then every running one; bob's run and bob's thread are never touched."""
    slow = knobs(tokens=400, delay_ms=10)

    async def bobs(c: LangGraphClient) -> tuple[str, str]:
        tid = (await c.threads.create())["thread_id"]
        r = await c.runs.create(tid, "lead_agent", input=human("bob"), config=slow)
        return tid, r["run_id"]

    bob_tid, bob_run = run(bobs, cluster.url, BOB)

    async def alice(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        first = await c.runs.create(tid, "lead_agent", input=human("a"), config=slow)
        queued = [
            await c.runs.create(tid, "lead_agent", input=human(f"q{i}"), config=knobs())
            for i in range(2)
        ]
        await until_status(c, tid, first["run_id"], "running")
        ids = [first["run_id"], queued[0]["run_id"]]
        assert await c.runs.cancel_many(thread_id=tid, run_ids=ids) is None
        await until_status(c, tid, queued[0]["run_id"], "interrupted")
        await until_status(c, tid, first["run_id"], "interrupted")
        await c.runs.join(tid, queued[1]["run_id"])  # not selected: it ran
        assert (await c.runs.get(tid, queued[1]["run_id"]))["status"] == "success"
        # Another user's thread is a 404, like every other route.
        other = c.runs.cancel_many(thread_id=bob_tid, run_ids=[bob_run])
        assert await status_of(other) == 404

        t2 = (await c.threads.create())["thread_id"]
        running = await c.runs.create(t2, "lead_agent", input=human("r"), config=slow)
        pending = await c.runs.create(t2, "lead_agent", input=human("p"), config=knobs())
        await until_status(c, t2, running["run_id"], "running")
        await c.runs.cancel_many(status="pending")
        await until_status(c, t2, pending["run_id"], "interrupted")
        assert (await c.runs.get(t2, running["run_id"]))["status"] == "running"
        await c.runs.cancel_many(status="all", action="interrupt")
        await until_status(c, t2, running["run_id"], "interrupted")

    run(alice, cluster.url)

    async def bob_after(c: LangGraphClient) -> None:
        assert (await c.runs.get(bob_tid, bob_run))["status"] == "running"
        await c.runs.cancel(bob_tid, bob_run, wait=True)
        assert await status_of(c.runs.cancel_many(status="all")) == 404  # nothing inflight

    run(bob_after, cluster.url, BOB)


# --- the durable path ---------------------------------------------------------------------------
def test_a1_no_temporary_thread_outlives_a_worker_or_its_absence(
    private_cluster: ClusterFactory,
) -> None:
    """A1: a stateless run that ends without a worker (cancelled while pending) has its
    thread deleted by the recovery pass once a worker is up, after its waiting client got
    its answer; one whose worker is killed mid-run is resumed elsewhere and its thread
    goes all the same."""
    env = {**FAST_LEASES, "THREADRUN_TEMPORARY_THREAD_GRACE_S": "1"}
    with private_cluster("stateless", env) as c:
        c.start_web()
        h = httpx.Client(base_url=c.url, headers={"x-api-key": ALICE}, timeout=60)
        body = {"assistant_id": "lead_agent", "input": human("x"), "config": knobs()}
        res = h.post("/runs", json=body)
        assert res.status_code == 200, res.text
        tid, rid = res.json()["thread_id"], res.json()["run_id"]
        joined: list[httpx.Response] = []
        waiter = threading.Thread(
            target=lambda: joined.append(h.get(f"/threads/{tid}/runs/{rid}/join"))
        )
        waiter.start()
        assert h.post("/runs/cancel", json={"status": "pending"}).status_code == 204
        waiter.join(30)
        assert joined and joined[0].status_code == 200 and joined[0].json() == {}
        assert h.get(f"/threads/{tid}/runs/{rid}").json()["status"] == "interrupted"
        assert h.get(f"/threads/{tid}").status_code == 200  # no worker, no recovery pass yet

        w1 = c.start_worker("w1")
        wait_for(lambda: h.get(f"/threads/{tid}").status_code == 404, 30, what="the purge")

        slow = {**body, "config": knobs(tokens=200, delay_ms=20)}
        res = h.post("/runs", json=slow)
        tid, rid = res.json()["thread_id"], res.json()["run_id"]
        wait_for(
            lambda: h.get(f"/threads/{tid}/runs/{rid}").json()["status"] == "running",
            30,
            what="the run to start",
        )
        w1.stop(signal.SIGKILL)
        c.start_worker("w2")
        wait_for(
            lambda: h.get(f"/threads/{tid}").status_code == 404,
            90,
            what="the thread of the killed worker's run to go",
            detail=lambda: c.tails(),
        )
        h.close()
