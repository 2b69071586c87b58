"""A4: ids a client chooses are per owner, and storage ids are translated only where an id
is: a thread's metadata that holds its own storage id comes back as written on every read,
a client id equal to another thread's storage id is answered as itself (batch, WebSocket),
and an assistant id another user has is a fresh assistant of one's own (no 409 oracle)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
import simple_websocket

from shared.runs.thread_ids import storage_id
from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, BOB
from tests.e2e.test_thread_ids import _h, _run

pytestmark = pytest.mark.e2e


def test_a4_metadata_holding_storage_ids_round_trips_unchanged(cluster: Cluster) -> None:
    """A4: thread metadata holding the caller's own storage id (and another thread's client
    id) comes back exactly as written from create, GET, PATCH and search alike."""
    url = cluster.url
    x = str(uuid.uuid4())
    own = storage_id("bob", x)
    metadata = {"mine": own, "text": f"stored under {own}", "nested": {"thread_id": own}}
    r = httpx.post(
        f"{url}/threads", json={"thread_id": x, "metadata": metadata}, headers=_h(BOB), timeout=30
    )
    assert r.status_code == 200 and r.json()["metadata"] == metadata, r.text
    r = httpx.get(f"{url}/threads/{x}", headers=_h(BOB), timeout=30)
    assert r.json()["thread_id"] == x and r.json()["metadata"] == metadata, r.text
    patched = {**metadata, "more": own}
    r = httpx.patch(
        f"{url}/threads/{x}", json={"metadata": {"more": own}}, headers=_h(BOB), timeout=30
    )
    assert r.status_code == 200 and r.json()["metadata"] == patched, r.text
    r = httpx.post(f"{url}/threads/search", json={"ids": [x]}, headers=_h(BOB), timeout=30)
    assert [t["metadata"] for t in r.json()] == [patched], r.text
    r = httpx.get(f"{url}/threads/{x}", headers=_h(BOB), timeout=30)
    assert r.json()["metadata"] == patched


def test_a4_a_client_id_equal_to_another_storage_id_is_answered_as_itself(
    cluster: Cluster,
) -> None:
    """A4: Bob's X2 is the storage id of his X1: a batch on both answers [X2, X1] (not
    [X1, X1]), his runs list on X2 names X2, and WebSocket runs on X2 then X1 name each."""
    url = cluster.url
    x1 = str(uuid.uuid4())
    x2 = storage_id("bob", x1)
    for x in (x1, x2):
        r = httpx.post(f"{url}/threads", json={"thread_id": x}, headers=_h(BOB), timeout=30)
        assert r.status_code == 200 and r.json()["thread_id"] == x, r.text
    for order in ([x2, x1], [x1, x2]):  # X2 resolved first: its storage id's turn comes after
        batch = [{**_run("batch"), "thread_id": x} for x in order]
        r = httpx.post(f"{url}/runs/batch", json=batch, headers=_h(BOB), timeout=30)
        assert r.status_code == 200, r.text
        assert [run["thread_id"] for run in r.json()] == order
    r = httpx.get(f"{url}/threads/{x2}/runs", headers=_h(BOB), timeout=30)
    assert {run["thread_id"] for run in r.json()} == {x2}, r.text

    ws = simple_websocket.Client.connect(url.replace("http://", "ws://") + "/ws", headers=_h(BOB))
    frames: list[dict[str, Any]] = []
    try:
        # X2 is named first (a join of no run: 404), then runs on X1 and on X2 follow.
        ws.send(json.dumps({"type": "run.join", "thread_id": x2, "run_id": str(uuid.uuid4())}))
        first = ws.receive(timeout=30)
        assert first is not None and json.loads(first)["type"] == "error", first
        sent = [{"type": "run.create", "thread_id": x, **_run("ws")} for x in (x1, x2)]
        sent[1]["stream_mode"] = ["values", "checkpoints"]
        for frame in sent:
            ws.send(json.dumps(frame))
            while True:
                msg = ws.receive(timeout=30)
                assert msg is not None
                frames.append(json.loads(msg))
                if frames[-1].get("type") in ("end", "error"):
                    break
    finally:
        ws.close()
    created = [f["run"]["thread_id"] for f in frames if f["type"] == "run.created"]
    assert created == [x1, x2], frames
    checkpoints = [f["data"] for f in frames if f.get("event") == "checkpoints"]
    assert checkpoints and {c["config"]["configurable"]["thread_id"] for c in checkpoints} == {x2}
    assert [f["type"] for f in frames if f["type"] in ("end", "error")] == ["end", "end"]


def test_a4_an_assistant_id_another_user_has_makes_ones_own(cluster: Cluster) -> None:
    """A4: Alice's client-chosen assistant id X: Bob's `POST /assistants {"assistant_id": X}`
    answers 200 with his own assistant X (not 409), each reads, patches, runs on and deletes
    their own X, and Bob's own re-create is his usual 409."""
    url = cluster.url
    x = str(uuid.uuid4())
    made = {}
    for key, who in ((ALICE, "alice"), (BOB, "bob")):
        r = httpx.post(
            f"{url}/assistants",
            json={"assistant_id": x, "graph_id": "lead_agent", "metadata": {"who": who}},
            headers=_h(key),
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert r.json()["assistant_id"] == x and r.json()["metadata"] == {"who": who}
        made[who] = r.json()
    r = httpx.post(
        f"{url}/assistants", json={"assistant_id": x, "graph_id": "lead_agent"}, headers=_h(BOB)
    )
    assert r.status_code == 409 and x in r.text, r.text
    r = httpx.post(
        f"{url}/assistants",
        json={"assistant_id": x, "graph_id": "lead_agent", "if_exists": "do_nothing"},
        headers=_h(BOB),
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["metadata"] == {"who": "bob"}, r.text
    for key, who in ((ALICE, "alice"), (BOB, "bob")):
        r = httpx.get(f"{url}/assistants/{x}", headers=_h(key), timeout=30)
        assert r.json()["assistant_id"] == x and r.json()["metadata"] == {"who": who}, r.text
        r = httpx.post(f"{url}/assistants/search", json={"metadata": {"who": who}}, headers=_h(key))
        assert [a["assistant_id"] for a in r.json()] == [x], r.text
    r = httpx.patch(
        f"{url}/assistants/{x}", json={"metadata": {"v": 2}}, headers=_h(BOB), timeout=30
    )
    assert r.status_code == 200 and r.json()["assistant_id"] == x and r.json()["version"] == 2
    r = httpx.get(f"{url}/assistants/{x}/versions", headers=_h(BOB), timeout=30)
    r = httpx.post(f"{url}/assistants/{x}/versions", json={}, headers=_h(BOB), timeout=30)
    assert [v["assistant_id"] for v in r.json()] == [x, x], r.text
    r = httpx.get(f"{url}/assistants/{x}", headers=_h(ALICE), timeout=30)
    assert r.json()["version"] == 1 and "v" not in r.json()["metadata"]

    # A run on X runs on the caller's X and names X.
    r = httpx.post(f"{url}/threads", json={}, headers=_h(BOB), timeout=30)
    tid = r.json()["thread_id"]
    r = httpx.post(
        f"{url}/threads/{tid}/runs/wait",
        json={**_run("hi"), "assistant_id": x},
        headers=_h(BOB),
        timeout=60,
    )
    assert r.status_code == 200, r.text
    r = httpx.get(f"{url}/threads/{tid}/runs", headers=_h(BOB), timeout=30)
    assert [run["assistant_id"] for run in r.json()] == [x], r.text
    r = httpx.post(
        f"{url}/runs/crons",
        json={"assistant_id": x, "schedule": "0 0 1 1 *"},
        headers=_h(BOB),
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["assistant_id"] == x, r.text
    assert httpx.delete(f"{url}/runs/crons/{r.json()['cron_id']}", headers=_h(BOB)).is_success

    # Deleting is per owner too.
    assert httpx.delete(f"{url}/assistants/{x}", headers=_h(BOB), timeout=30).is_success
    assert httpx.get(f"{url}/assistants/{x}", headers=_h(BOB), timeout=30).status_code == 404
    r = httpx.get(f"{url}/assistants/{x}", headers=_h(ALICE), timeout=30)
    assert r.status_code == 200 and r.json()["metadata"] == {"who": "alice"}
