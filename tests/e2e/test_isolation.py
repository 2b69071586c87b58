"""A4 isolation: Bob's key against Alice's ids, over every route of the URL map and the WebSocket.

The walk iterates `app.url_map`, so an endpoint added later is covered without editing this
file. For each route that takes a thread or run id, Bob's request on Alice's ids must be
answered exactly like the same request on ids that do not exist (status and body, with the
ids swapped), and no response to Bob may contain Alice's ids or her message text. Views that
call `require_ops()` must answer a user-role key with 403.
"""

from __future__ import annotations

import inspect
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import simple_websocket
from flask import Flask
from pydantic import SecretStr

from app import create_app
from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, API_KEYS, BOB

pytestmark = pytest.mark.e2e

SECRET_TEXT = f"alice-private-{uuid.uuid4().hex}"
RUN_BODY = {
    "assistant_id": "lead_agent",
    "input": {"messages": [{"role": "user", "content": "from bob"}]},
}
# Valid bodies, so that a refusal can only come from the ownership check.
SAMPLE_BODIES: dict[str, dict[str, Any]] = {
    "threads.patch": {"metadata": {"by": "bob"}},
    "state.update_state": {"values": {"messages": []}},
    "state.post_state_at": {"checkpoint": {"checkpoint_id": "CHECKPOINT"}},
    "state.post_history": {"limit": 5},
    "runs.create": RUN_BODY,
    "runs.create_stream": RUN_BODY,
    "runs.create_wait": RUN_BODY,
}
ID_PARAMS = {"thread_id", "run_id"}


@dataclass
class World:
    """Alice's committed data and the app whose URL map is walked."""

    url: str
    thread_id: str
    run_id: str
    checkpoint_id: str
    app: Flask
    before: dict[str, Any]


def snapshot(url: str, tid: str, rid: str) -> dict[str, Any]:
    """Alice's view of her thread, runs, state and audit events."""
    h = {"x-api-key": ALICE}
    out: dict[str, Any] = {}
    for name, path in {
        "thread": f"/threads/{tid}",
        "runs": f"/threads/{tid}/runs",
        "run": f"/threads/{tid}/runs/{rid}",
        "state": f"/threads/{tid}/state",
        "events": f"/threads/{tid}/runs/{rid}/events?limit=500",
    }.items():
        r = httpx.get(url + path, headers=h, timeout=30)
        assert r.status_code == 200, (path, r.text)
        out[name] = r.json()
    return out


@pytest.fixture(scope="module")
def world(cluster: Cluster) -> Iterator[World]:
    h = {"x-api-key": ALICE}
    tid = httpx.post(f"{cluster.url}/threads", json={}, headers=h, timeout=30).json()["thread_id"]
    body = {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": SECRET_TEXT}]},
        "config": {"configurable": {"tokens": 4}},
    }
    r = httpx.post(f"{cluster.url}/threads/{tid}/runs/wait", json=body, headers=h, timeout=60)
    assert r.status_code == 200, r.text
    rid = r.headers["Content-Location"].rsplit("/", 1)[-1]
    state = httpx.get(f"{cluster.url}/threads/{tid}/state", headers=h, timeout=30).json()
    assert SECRET_TEXT in json.dumps(state)
    settings = cluster.settings.model_copy(update={"api_keys": SecretStr(API_KEYS)})
    app = create_app(settings)
    yield World(
        cluster.url,
        tid,
        rid,
        state["checkpoint"]["checkpoint_id"],
        app,
        snapshot(cluster.url, tid, rid),
    )


def _fill(rule: Any, ids: dict[str, str]) -> str:
    path = rule.rule
    for arg in rule.arguments:
        for conv in ("", "path:", "uuid:", "string:"):
            path = path.replace(f"<{conv}{arg}>", ids.get(arg, "x"))
    return path


def _call(
    url: str, method: str, path: str, key: str, body: Any, headers: dict[str, str]
) -> httpx.Response:
    return httpx.request(
        method,
        url + path,
        json=body if method in ("POST", "PATCH", "PUT") else None,
        headers={"x-api-key": key, **headers},
        timeout=30,
    )


_OPS_CALL = re.compile(r"^    (\w+ = )?require_ops\(\)", re.MULTILINE)


def _needs_ops(app: Flask, endpoint: str) -> bool:
    """Views that call `require_ops()` unconditionally (at the top level of their body)."""
    view = app.view_functions[endpoint]
    try:
        return bool(_OPS_CALL.search(inspect.getsource(view)))
    except (OSError, TypeError):
        return False


def test_a4_every_endpoint_hides_alices_ids_from_bob(world: World) -> None:
    """A4: every route with a thread/run id answers Bob on Alice's ids exactly like missing ids."""
    alice = {
        "thread_id": world.thread_id,
        "run_id": world.run_id,
        "checkpoint_id": world.checkpoint_id,
    }
    missing = {
        "thread_id": str(uuid.uuid4()),
        "run_id": str(uuid.uuid4()),
        "checkpoint_id": world.checkpoint_id,
    }
    walked = 0
    for rule in world.app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.endpoint.startswith("ws.") or rule.websocket:
            continue  # the chat WebSocket is walked below, the protocol's in its own module
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            raw = SAMPLE_BODIES.get(rule.endpoint, {})
            body = json.loads(json.dumps(raw).replace("CHECKPOINT", world.checkpoint_id))
            headers = {"Last-Event-ID": "0"} if rule.endpoint == "runs.join_stream" else {}
            got = _call(world.url, method, _fill(rule, alice), BOB, body, headers)
            text = got.text
            where = f"{method} {rule.rule}"
            assert got.status_code < 500, (where, got.status_code, text)
            sent = _fill(rule, alice) + json.dumps(body)
            for secret in (*alice.values(), SECRET_TEXT):
                if secret not in sent:  # ids Bob sent may be echoed in a 404 message
                    assert secret not in text, (where, "leaks", secret)
            if _needs_ops(world.app, rule.endpoint):
                assert got.status_code == 403, (where, got.status_code)
            if not (set(rule.arguments) & ID_PARAMS):
                walked += 1
                continue
            ref = _call(world.url, method, _fill(rule, missing), BOB, body, headers)
            expect = ref.text.replace(missing["thread_id"], world.thread_id).replace(
                missing["run_id"], world.run_id
            )
            assert got.status_code == ref.status_code, (where, got.status_code, ref.status_code)
            assert text.replace(world.thread_id, "T").replace(world.run_id, "R") == expect.replace(
                world.thread_id, "T"
            ).replace(world.run_id, "R"), where
            if rule.endpoint in SAMPLE_BODIES or method in ("GET", "DELETE"):
                assert got.status_code in (403, 404), (where, got.status_code, text)
            walked += 1
    assert walked >= 30
    # Nothing Bob did changed Alice's data.
    assert snapshot(world.url, world.thread_id, world.run_id) == world.before


def test_a4_search_and_count_show_bob_nothing_of_alice(world: World) -> None:
    """A4: listing endpoints are scoped to the caller."""
    h = {"x-api-key": BOB}
    r = httpx.post(f"{world.url}/threads/search", json={"limit": 1000}, headers=h, timeout=30)
    assert r.status_code == 200 and world.thread_id not in r.text
    r = httpx.post(
        f"{world.url}/threads/search", json={"ids": [world.thread_id]}, headers=h, timeout=30
    )
    assert r.json() == []
    # Thread ids are per owner: creating a thread with Alice's id makes Bob a thread of his
    # own under that id, exactly as a fresh id would (no 409 telling hers exists), with
    # nothing of hers (shared/runs/thread_ids.py; tests/e2e/test_thread_ids.py goes on).
    body = {"thread_id": world.thread_id, "if_exists": "do_nothing"}
    r = httpx.post(f"{world.url}/threads", json=body, headers=h, timeout=30)
    assert r.status_code == 200 and SECRET_TEXT not in r.text, r.text
    assert r.json()["thread_id"] == world.thread_id and r.json()["metadata"] == {}
    r = httpx.delete(f"{world.url}/threads/{world.thread_id}", headers=h, timeout=30)
    assert r.status_code == 204
    assert snapshot(world.url, world.thread_id, world.run_id) == world.before


def _ws_frames(url: str, path: str, key: str, frames: list[dict[str, Any]]) -> list[Any]:
    ws = simple_websocket.Client.connect(
        url.replace("http://", "ws://") + path, headers={"x-api-key": key}
    )
    out: list[Any] = []
    try:
        for frame in frames:
            ws.send(json.dumps(frame))
            msg = ws.receive(timeout=15)
            assert msg is not None, frame
            out.append(json.loads(msg))
    finally:
        ws.close()
    return out


def test_a4_websocket_join_replay_and_cancel_hide_alices_run(world: World) -> None:
    """A4: run.join (with last_event_id replay), run.cancel and run.create over /ws and
    /threads/{id}/ws answer Bob on Alice's ids exactly like missing ids."""

    def frames(ids: dict[str, str]) -> list[dict[str, Any]]:
        tid, rid = ids["thread_id"], ids["run_id"]
        return [
            {"type": "run.join", "thread_id": tid, "run_id": rid, "last_event_id": "0"},
            {"type": "run.join", "thread_id": tid, "run_id": rid, "last_event_id": "-"},
            {"type": "run.join", "thread_id": tid, "run_id": rid},
            {"type": "run.cancel", "thread_id": tid, "run_id": rid},
            {"type": "run.create", "thread_id": tid, **RUN_BODY},
        ]

    alice = {"thread_id": world.thread_id, "run_id": world.run_id}
    missing = {"thread_id": str(uuid.uuid4()), "run_id": str(uuid.uuid4())}
    for path_of in (lambda _ids: "/ws", lambda ids: f"/threads/{ids['thread_id']}/ws"):
        got = _ws_frames(world.url, path_of(alice), BOB, frames(alice))
        ref = _ws_frames(world.url, path_of(missing), BOB, frames(missing))
        text = json.dumps(got)
        for secret in (SECRET_TEXT,):
            assert secret not in text
        swapped = json.dumps(ref).replace(missing["thread_id"], "T").replace(missing["run_id"], "R")
        assert text.replace(world.thread_id, "T").replace(world.run_id, "R") == swapped
        assert all(f["type"] == "error" and f["code"].endswith("not_found") for f in got), got
    assert snapshot(world.url, world.thread_id, world.run_id) == world.before


def test_a4_alice_still_sees_her_stream_replay(world: World) -> None:
    """A4 control: the same replay works for the owner (the 404s above are ownership)."""
    r = httpx.get(
        f"{world.url}/threads/{world.thread_id}/runs/{world.run_id}/stream",
        headers={"x-api-key": ALICE, "Last-Event-ID": "0"},
        timeout=30,
    )
    assert r.status_code == 200 and "event: end" in r.text
