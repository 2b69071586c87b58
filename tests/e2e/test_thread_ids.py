"""A4: thread ids are per owner. A client-chosen thread id names the caller's own thread,
whoever else has a thread with that id: Bob choosing Alice's id gets a thread of his own
(200, not a 409 that would tell hers exists or let him squat the id she will choose), runs
on it, reads it and deletes it under that id, and never sees the id it is stored under
(shared/runs/thread_ids.py, app/public_ids.py)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import pytest
import simple_websocket
from langgraph_sdk.client import LangGraphClient

from shared.runs.thread_ids import storage_id
from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, BOB, run_sdk

pytestmark = pytest.mark.e2e

KNOBS = {"configurable": {"tokens": 4}}


def _h(key: str) -> dict[str, str]:
    return {"x-api-key": key}


def _run(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": text}]},
        "config": KNOBS,
        **extra,
    }


def _view(url: str, key: str, tid: str) -> dict[str, Any]:
    """What one user reads of a thread: the thread, its runs, state and history."""
    out: dict[str, Any] = {}
    for name, path in {
        "thread": f"/threads/{tid}",
        "runs": f"/threads/{tid}/runs",
        "state": f"/threads/{tid}/state",
        "history": f"/threads/{tid}/history",
    }.items():
        r = httpx.get(url + path, headers=_h(key), timeout=30)
        assert r.status_code == 200, (path, r.text)
        out[name] = r.json()
    return out


def test_a4_another_users_thread_id_names_a_thread_of_ones_own(cluster: Cluster) -> None:
    """A4: Alice has thread X (a client-chosen id, e.g. a uuid5 of an email); Bob's
    `POST /threads {"thread_id": X}` answers 200 with X, his runs on X (also with
    if_not_exists=create) and his reads of X show X and his data only, Alice's thread is
    unchanged byte for byte, Bob's own re-create is his usual 409 / do_nothing, and
    search, get and delete by X act on each user's own thread."""
    url = cluster.url
    x = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"alice-{uuid.uuid4().hex}@example.com"))
    bob_storage = storage_id("bob", x)
    r = httpx.post(
        f"{url}/threads",
        json={"thread_id": x, "metadata": {"who": "alice"}},
        headers=_h(ALICE),
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["thread_id"] == x, r.text
    r = httpx.post(
        f"{url}/threads/{x}/runs/wait", json=_run("alice-secret"), headers=_h(ALICE), timeout=60
    )
    assert r.status_code == 200, r.text
    alice_before = _view(url, ALICE, x)

    # Bob chooses the same id: a thread of his own, not a 409.
    r = httpx.post(
        f"{url}/threads",
        json={"thread_id": x, "metadata": {"who": "bob"}},
        headers=_h(BOB),
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["thread_id"] == x and r.json()["metadata"] == {"who": "bob"}
    assert r.json()["values"] is None  # nothing of Alice's state
    # His own re-create conflicts as usual.
    r = httpx.post(f"{url}/threads", json={"thread_id": x}, headers=_h(BOB), timeout=30)
    assert r.status_code == 409 and x in r.text and bob_storage not in r.text
    r = httpx.post(
        f"{url}/threads",
        json={"thread_id": x, "if_exists": "do_nothing"},
        headers=_h(BOB),
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["metadata"] == {"who": "bob"}

    # Bob runs on X and reads it: X everywhere, his data only, never his storage id.
    r = httpx.post(
        f"{url}/threads/{x}/runs/wait", json=_run("bob-text"), headers=_h(BOB), timeout=60
    )
    assert r.status_code == 200, r.text
    assert f"/threads/{x}/runs/" in r.headers["Content-Location"]
    modes = {"stream_mode": ["values", "checkpoints", "debug", "tasks"]}
    r = httpx.post(
        f"{url}/threads/{x}/runs/stream",
        json=_run("bob-stream", **modes),
        headers=_h(BOB),
        timeout=60,
    )
    assert r.status_code == 200 and "event: end" in r.text, r.text[-500:]
    assert bob_storage not in r.text and f'"thread_id": "{x}"' in r.text.replace('":"', '": "')
    assert "alice-secret" not in r.text
    bob = _view(url, BOB, x)
    text = json.dumps(bob)
    assert bob_storage not in text and "alice-secret" not in text and "bob-text" in text
    assert bob["thread"]["thread_id"] == x and bob["thread"]["metadata"]["who"] == "bob"
    assert {run["thread_id"] for run in bob["runs"]} == {x} and len(bob["runs"]) == 2
    assert bob["state"]["checkpoint"]["thread_id"] == x
    for state in bob["history"]:
        assert state["checkpoint"]["thread_id"] == x
        if state["parent_checkpoint"]:
            assert state["parent_checkpoint"]["thread_id"] == x
    rid = bob["runs"][0]["run_id"]
    r = httpx.get(f"{url}/threads/{x}/runs/{rid}/events", headers=_h(BOB), timeout=30)
    assert r.status_code == 200 and bob_storage not in r.text
    r = httpx.get(f"{url}/threads/{x}/runs/{rid}", headers=_h(BOB), timeout=30)
    assert r.json()["thread_id"] == x

    # Search by X: each user finds their own thread under X.
    for key, who in ((ALICE, "alice"), (BOB, "bob")):
        r = httpx.post(f"{url}/threads/search", json={"ids": [x]}, headers=_h(key), timeout=30)
        assert [(t["thread_id"], t["metadata"]["who"]) for t in r.json()] == [(x, who)]
        assert bob_storage not in r.text

    # Alice's thread is unaffected, byte for byte.
    assert _view(url, ALICE, x) == alice_before

    # Bob deletes X: his thread only; his X is gone, hers stays.
    assert httpx.delete(f"{url}/threads/{x}", headers=_h(BOB), timeout=30).status_code == 204
    r = httpx.get(f"{url}/threads/{x}", headers=_h(BOB), timeout=30)
    assert r.status_code == 404 and x in r.text and bob_storage not in r.text
    assert _view(url, ALICE, x) == alice_before
    # Re-created, it starts empty (no old runs, state or files).
    r = httpx.post(f"{url}/threads", json={"thread_id": x}, headers=_h(BOB), timeout=30)
    assert r.status_code == 200 and r.json()["values"] is None
    assert httpx.get(f"{url}/threads/{x}/runs", headers=_h(BOB), timeout=30).json() == []
    r = httpx.get(f"{url}/threads/{x}/artifacts", headers=_h(BOB), timeout=30)
    assert r.status_code == 200 and "bob" not in r.text

    # if_not_exists=create on an id Alice has and Bob has not: Bob's new thread.
    y = str(uuid.uuid4())
    r = httpx.post(f"{url}/threads", json={"thread_id": y}, headers=_h(ALICE), timeout=30)
    assert r.status_code == 200
    r = httpx.post(
        f"{url}/threads/{y}/runs/wait",
        json=_run("bob-y", if_not_exists="create"),
        headers=_h(BOB),
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert storage_id("bob", y) not in r.text
    r = httpx.get(f"{url}/threads/{y}/runs", headers=_h(BOB), timeout=30)
    assert [run["thread_id"] for run in r.json()] == [y]
    assert httpx.get(f"{url}/threads/{y}/runs", headers=_h(ALICE), timeout=30).json() == []


def test_a4_client_chosen_ids_in_batches_crons_and_websocket(cluster: Cluster) -> None:
    """A4: a batch item, a cron and a WebSocket run on Bob's client-chosen X (Alice has X
    too) act on Bob's thread and answer X, never its storage id."""
    url = cluster.url
    x = str(uuid.uuid4())
    bob_storage = storage_id("bob", x)
    for key in (ALICE, BOB):
        r = httpx.post(f"{url}/threads", json={"thread_id": x}, headers=_h(key), timeout=30)
        assert r.status_code == 200 and r.json()["thread_id"] == x
    r = httpx.post(
        f"{url}/runs/batch", json=[{**_run("batch"), "thread_id": x}], headers=_h(BOB), timeout=30
    )
    assert r.status_code == 200, r.text
    assert [run["thread_id"] for run in r.json()] == [x] and bob_storage not in r.text
    r = httpx.post(
        f"{url}/threads/{x}/runs/crons",
        json={"assistant_id": "lead_agent", "schedule": "0 0 1 1 *"},
        headers=_h(BOB),
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["thread_id"] == x, r.text
    cron_id = r.json()["cron_id"]
    for body in ({}, {"thread_id": x}):
        r = httpx.post(f"{url}/runs/crons/search", json=body, headers=_h(BOB), timeout=30)
        assert [(c["cron_id"], c["thread_id"]) for c in r.json()] == [(cron_id, x)]
    r = httpx.patch(
        f"{url}/runs/crons/{cron_id}", json={"enabled": False}, headers=_h(BOB), timeout=30
    )
    assert r.status_code == 200 and r.json()["thread_id"] == x, r.text
    r = httpx.post(f"{url}/runs/crons/search", json={"thread_id": x}, headers=_h(ALICE), timeout=30)
    assert r.json() == []
    assert httpx.delete(f"{url}/runs/crons/{cron_id}", headers=_h(BOB), timeout=30).is_success
    z = str(uuid.uuid4())
    for key in (ALICE, BOB):
        r = httpx.post(f"{url}/threads", json={"thread_id": z}, headers=_h(key), timeout=30)
        assert r.status_code == 200
    r = httpx.post(f"{url}/threads/prune", json={"thread_ids": [z]}, headers=_h(BOB), timeout=30)
    assert r.status_code == 200 and r.json() == {"pruned_count": 1}, r.text
    assert httpx.get(f"{url}/threads/{z}", headers=_h(BOB), timeout=30).status_code == 404
    assert httpx.get(f"{url}/threads/{z}", headers=_h(ALICE), timeout=30).status_code == 200

    ws = simple_websocket.Client.connect(
        url.replace("http://", "ws://") + f"/threads/{x}/ws", headers=_h(BOB)
    )
    frames: list[str] = []
    try:
        ws.send(
            json.dumps({"type": "run.create", **_run("ws", stream_mode=["values", "checkpoints"])})
        )
        while True:
            msg = ws.receive(timeout=30)
            assert msg is not None
            frames.append(msg)
            if json.loads(msg).get("type") in ("end", "error"):
                break
    finally:
        ws.close()
    text = "\n".join(frames)
    created = json.loads(frames[0])
    assert created["type"] == "run.created" and created["run"]["thread_id"] == x, frames[0]
    assert bob_storage not in text and x in text
    assert json.loads(frames[-1])["type"] == "end", frames[-1]


async def follow(c: LangGraphClient, tid: str) -> list[tuple[str, Any]]:
    """The thread stream's parts (event, data) until a run is done."""
    parts: list[tuple[str, Any]] = []
    gen = await c.threads.join_stream(tid)
    async for part in gen:
        parts.append((part.event, part.data))
        if part.event == "metadata" and part.data.get("status") == "run_done":
            break
    await gen.aclose()  # type: ignore[attr-defined]
    return parts


def test_a4_the_sdk_works_on_a_client_chosen_id_another_user_has(cluster: Cluster) -> None:
    """A4, A1: the official SDK creates, runs, follows, reads, searches, copies and deletes
    Bob's thread X while Alice has her own X."""
    x = str(uuid.uuid4())
    run_sdk(lambda c: c.threads.create(thread_id=x, metadata={"who": "alice"}), cluster.url)

    async def go(c: LangGraphClient) -> dict[str, Any]:
        made = await c.threads.create(thread_id=x, metadata={"who": "bob"})
        await c.runs.wait(
            x, "lead_agent", input={"messages": [{"role": "user", "content": "hi"}]}, config=KNOBS
        )
        follower = asyncio.create_task(follow(c, x))
        await asyncio.sleep(1.0)  # connected before the run
        await c.runs.create(
            x,
            "lead_agent",
            input={"messages": [{"role": "user", "content": "followed"}]},
            config=KNOBS,
            stream_mode=["values", "checkpoints"],
        )
        followed = await asyncio.wait_for(follower, 60)
        state = await c.threads.get_state(x)
        history = await c.threads.get_history(x)
        runs = await c.runs.list(x)
        found = await c.threads.search(ids=[x])
        got = await c.threads.get(x)
        copy = await c.threads.copy(x)
        copied = await c.threads.get_state(copy["thread_id"])
        copied_history = await c.threads.get_history(copy["thread_id"])
        await c.threads.delete(x)
        return {
            "followed": followed,
            "made": made,
            "state": state,
            "history": history,
            "runs": runs,
            "found": found,
            "got": got,
            "copied": copied,
            "copied_history": copied_history,
        }

    out = run_sdk(go, cluster.url, BOB)
    assert out["made"]["thread_id"] == out["got"]["thread_id"] == x
    assert out["got"]["metadata"]["who"] == "bob"
    assert out["state"]["checkpoint"]["thread_id"] == x
    assert {s["checkpoint"]["thread_id"] for s in out["history"]} == {x}
    assert [r["thread_id"] for r in out["runs"]] == [x, x]
    assert any(event == "checkpoints" and x in json.dumps(data) for event, data in out["followed"])
    assert [(t["thread_id"], t["metadata"]["who"]) for t in out["found"]] == [(x, "bob")]
    assert out["copied"]["values"] == out["state"]["values"]
    assert storage_id("bob", x) not in json.dumps(out, default=str)
    alice = run_sdk(lambda c: c.threads.get(x), cluster.url)
    assert alice["metadata"]["who"] == "alice"
