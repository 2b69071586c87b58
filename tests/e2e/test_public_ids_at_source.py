"""A4: the worker writes a client-chosen thread's public id into the run's stream (the
metadata of every token chunk, checkpoint configs: workers/public_ids.py), so the web
relays those events unparsed; the client reads what it read before: its own id in every
event, over SSE, after a reconnect with Last-Event-ID and over the WebSocket, and never
the id the thread is stored under."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
import redis
import simple_websocket

from shared import serde
from shared.bridge.codec import decode
from shared.redis_keys import Keys
from shared.runs.thread_ids import storage_id
from shared.settings import Settings
from shared.tools.testing import Cluster
from tests.e2e.conftest import BOB
from tests.e2e.test_thread_ids import _h, _run

pytestmark = pytest.mark.e2e

MODES = ["messages-tuple", "messages", "checkpoints", "debug", "values"]


def _events(text: str) -> list[tuple[str, str, Any]]:
    out = []
    for message in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in message.split("\n") if ": " in line)
        if "event" in lines and "data" in lines:
            out.append((lines.get("id", ""), lines["event"], json.loads(lines["data"])))
    return out


def _thread_ids(events: list[tuple[str, str, Any]]) -> set[str]:
    """The thread ids the events name at their id positions."""
    found: set[str] = set()
    for _, name, data in events:
        if name == "messages":
            found.add(data[1]["thread_id"])
        elif name == "messages/metadata":
            found.update(e["metadata"]["thread_id"] for e in data.values())
        elif name == "checkpoints":
            found.add(data["config"]["configurable"]["thread_id"])
        elif name == "debug" and data["type"] == "checkpoint":
            found.add(data["payload"]["config"]["configurable"]["thread_id"])
    return found


def _stored(settings: Settings, run_id: str) -> list[tuple[str, Any]]:
    """The run's stream as the worker published it (decoded, not translated)."""
    keys = Keys(settings.redis_prefix)
    client = redis.Redis.from_url(settings.redis_url)
    try:
        meta = keys.stream_meta(run_id)

        def dictionary(ref: str) -> bytes | None:
            body = client.hget(meta, "z" + ref)
            return body if isinstance(body, bytes) else None

        return [
            (f[b"e"].decode(), serde.loads(decode(f[b"d"], dictionary)))
            for _, f in client.xrange(keys.stream(run_id))
        ]
    finally:
        client.close()


def test_a4_a_stream_written_with_public_ids_reads_as_before(
    cluster: Cluster, settings: Settings
) -> None:
    """A4: Bob's run on his client-chosen X: the stream Redis holds names X in its token
    chunks (written by the worker); the SSE stream, its replay after the second event and a
    WebSocket join name X at every id position, and his storage id nowhere."""
    url = cluster.url
    x = str(uuid.uuid4())
    stored_as = storage_id("bob", x)
    r = httpx.post(f"{url}/threads", json={"thread_id": x}, headers=_h(BOB), timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.post(
        f"{url}/threads/{x}/runs/stream",
        json=_run("at-source", stream_mode=MODES),
        headers=_h(BOB),
        timeout=60,
    )
    assert r.status_code == 200 and "event: end" in r.text, r.text[-500:]
    assert stored_as not in r.text
    events = _events(r.text)
    assert {"messages", "messages/metadata", "checkpoints", "debug"} <= {e[1] for e in events}
    assert _thread_ids(events) == {x}
    run_id = events[0][2]["run_id"]

    stored = _stored(settings, run_id)
    tokens = [data for name, data in stored if name == "messages"]
    assert tokens and tokens[-1][1]["thread_id"] == x  # written by the worker, not the web
    assert {data[1]["thread_id"] for data in tokens} <= {x, stored_as}

    cursor = events[1][0]
    r = httpx.get(
        f"{url}/threads/{x}/runs/{run_id}/stream",
        headers={**_h(BOB), "Last-Event-ID": cursor},
        timeout=60,
    )
    replay = _events(r.text)
    assert [e[0] for e in replay] == [e[0] for e in events[2:]]
    assert [e[2] for e in replay] == [e[2] for e in events[2:]]
    assert stored_as not in r.text

    ws = simple_websocket.Client.connect(
        url.replace("http://", "ws://") + f"/threads/{x}/ws", headers=_h(BOB)
    )
    frames: list[dict[str, Any]] = []
    try:
        ws.send(json.dumps({"type": "run.join", "run_id": run_id, "last_event_id": "-1"}))
        while not frames or frames[-1].get("type") not in ("end", "error"):
            msg = ws.receive(timeout=30)
            assert msg is not None
            assert stored_as not in msg
            frames.append(json.loads(msg))
    finally:
        ws.close()
    got = [(f["id"], f["event"], f["data"]) for f in frames if f["type"] == "event"]
    assert [g[2] for g in got] == [e[2] for e in events if e[1] != "end"]
    assert _thread_ids(got) == {x}
