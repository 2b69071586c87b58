"""Hostile input against a running server (A3, G3): schemathesis over /openapi.json and a
hypothesis WebSocket frame fuzzer; afterwards every previously committed thread, run and
event is intact and the server still serves.

Bounded for CI: a few examples per operation and generation mode, no shrinking database.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
import simple_websocket
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from simple_websocket import ConnectionClosed

from shared.tools.testing import Cluster
from tests.e2e.conftest import ClusterFactory

pytestmark = pytest.mark.e2e

OWNER, FUZZER = "key-owner", "key-fuzzer"
FRAME_MAX = 4096
ENV = {
    "THREADRUN_API_KEYS": f"{OWNER}:owner,{FUZZER}:fuzzer",
    # Limits high enough that they never mask a fault; tests/e2e/test_limits.py covers them.
    "THREADRUN_RUNS_PER_MINUTE": "100000",
    "THREADRUN_MAX_ACTIVE_RUNS": "10000",
    "THREADRUN_MAX_CONNECTIONS_PER_USER": "10000",
    "THREADRUN_WS_FRAMES_PER_SECOND": "10000",
    "THREADRUN_WS_FRAME_BURST": "10000",
    "THREADRUN_WS_MAX_FRAME_BYTES": str(FRAME_MAX),
}
EXAMPLES_PER_OPERATION = 4
WS_EXAMPLES = 60
SERVER_FRAME_TYPES = {
    "event",
    "gap",
    "heartbeat",
    "end",
    "error",
    "pong",
    "run.created",
    "run.cancel.accepted",
}
FOLLOW_FOREVER = "/threads/{thread_id}/stream"
PROTOCOL_STREAM = "/threads/{thread_id}/stream/events"
"""The thread streaming protocol's stream follows the thread forever too (when valid)."""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@dataclass
class Committed:
    """Data written before the hostile traffic, and how it looked."""

    owner_threads: list[tuple[str, str]]  # (thread_id, run_id)
    fuzz_thread: str
    fuzz_run: str
    before: dict[str, Any]
    play: dict[str, str] | None = None  # the fuzzer's thread that schemathesis may change


@pytest.fixture(scope="module")
def fz(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """Web + one worker, own database and prefix."""
    with private_cluster("fuzz", ENV) as c:
        yield c.start(workers=["fuzz"], concurrency=4)


def _run(url: str, key: str, text: str) -> tuple[str, str]:
    h = {"x-api-key": key}
    tid = httpx.post(f"{url}/threads", json={"metadata": {"k": text}}, headers=h, timeout=30)
    thread_id = tid.json()["thread_id"]
    body = {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": text}]},
        "config": {"configurable": {"tokens": 4}},
    }
    r = httpx.post(f"{url}/threads/{thread_id}/runs/wait", json=body, headers=h, timeout=60)
    assert r.status_code == 200, r.text
    return thread_id, r.headers["Content-Location"].rsplit("/", 1)[-1]


def _snapshot(url: str, key: str, tid: str, rid: str, *, thread_level: bool) -> dict[str, Any]:
    h = {"x-api-key": key}
    paths = {
        "run": f"/threads/{tid}/runs/{rid}",
        "events": f"/threads/{tid}/runs/{rid}/events?limit=500",
        "stream": f"/threads/{tid}/runs/{rid}/stream",
    }
    if thread_level:
        paths |= {
            "thread": f"/threads/{tid}",
            "runs": f"/threads/{tid}/runs",
            "state": f"/threads/{tid}/state",
            "history": f"/threads/{tid}/history",
        }
    out: dict[str, Any] = {}
    for name, path in paths.items():
        r = httpx.get(url + path, headers={**h, "Last-Event-ID": "0"}, timeout=30)
        assert r.status_code == 200, (path, r.text)
        out[name] = r.text if name == "stream" else r.json()
    return out


def snapshot_all(url: str, c: Committed) -> dict[str, Any]:
    out = {tid: _snapshot(url, OWNER, tid, rid, thread_level=True) for tid, rid in c.owner_threads}
    out["fuzz"] = _snapshot(url, FUZZER, c.fuzz_thread, c.fuzz_run, thread_level=False)
    return out


@pytest.fixture(scope="module")
def committed(fz: Cluster) -> Committed:
    owner = [_run(fz.url, OWNER, f"owner-{i}") for i in range(2)]
    ftid, frid = _run(fz.url, FUZZER, "fuzzer-own")
    ptid, prid = _run(fz.url, FUZZER, "fuzzer-play")
    c = Committed(owner, ftid, frid, {}, {"thread_id": ptid, "run_id": prid})
    c.before = snapshot_all(fz.url, c)
    return c


def test_a3_schemathesis_openapi_no_5xx_and_conformance(fz: Cluster, committed: Committed) -> None:
    """A3/A5: generated valid and invalid requests for every operation of /openapi.json get
    no 5xx, and status, content type and body conform to the document. A second pass aims
    the operations of a thread or run at the fuzzer's own live thread and run, so bodies
    and queries reach the code behind the ownership check."""
    doc = httpx.get(f"{fz.url}/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(doc)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 30
    assert committed.play is not None
    play = committed.play
    passes: list[tuple[Any, GenerationMode, dict[str, str] | None]] = []
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            passes.append((op, mode, None))
    for op in operations:
        names = {p.name for p in op.path_parameters}
        # Following a live thread never ends by itself (it waits for the thread's next run),
        # so a client that reads the whole body cannot call it; it is checked below instead.
        if (op.method.upper(), op.path) in (("GET", FOLLOW_FOREVER), ("POST", PROTOCOL_STREAM)):
            continue
        if "thread_id" in names and op.method.upper() != "DELETE":
            passes.append((op, GenerationMode.POSITIVE, {k: play[k] for k in names & set(play)}))
    failures: list[str] = []
    started = time.monotonic()
    for op, mode, path_parameters in passes:

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy(generation_mode=mode, path_parameters=path_parameters))
        def call(case: Any) -> None:
            response = case.call(base_url=fz.url, headers={"x-api-key": FUZZER}, timeout=20)
            case.validate_response(response, checks=CHECKS)

        try:
            call()
        except Exception as exc:  # noqa: BLE001 - collect every operation's failure
            aimed = " (own thread)" if path_parameters else ""
            failures.append(f"{op.label} [{mode.value}]{aimed}: {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)
    assert time.monotonic() - started < 120
    # The follow-forever stream on the fuzzer's own thread: it answers an event stream.
    url = f"{fz.url}/threads/{play['thread_id']}/stream"
    with httpx.stream("GET", url, headers={"x-api-key": FUZZER}, timeout=20) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")


def _json_values() -> st.SearchStrategy[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text(max_size=20)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )


def _frames(c: Committed) -> st.SearchStrategy[Any]:
    # The owner's thread and run too: another user's ids must be refused like unknown ones.
    owner_thread, owner_run = c.owner_threads[0]
    ids = st.sampled_from(
        [
            c.fuzz_thread,
            c.fuzz_run,
            owner_thread,
            owner_run,
            str(uuid.uuid4()),
            "",
            "../x",
            "0" * 36,
        ]
    )
    ids = ids | st.text(max_size=40)
    cursors = (
        st.sampled_from(["0", "-", "0-0", "-1", "$", "9999999999999-0", "1-x"])
        | st.text(max_size=30)
        | st.integers()
    )
    typed = st.fixed_dictionaries(
        {
            "type": st.sampled_from(["run.create", "run.join", "run.cancel", "ping"])
            | st.text(max_size=12)
        },
        optional={
            "thread_id": ids | _json_values(),
            "run_id": ids | _json_values(),
            "last_event_id": cursors | _json_values(),
            "request_id": st.text(max_size=300) | st.integers() | _json_values(),
            "assistant_id": st.sampled_from(["lead_agent", ""]) | st.text(max_size=10),
            "input": _json_values(),
            "stream_mode": _json_values()
            | st.lists(st.sampled_from(["values", "updates", "bogus"])),
            "action": st.sampled_from(["interrupt", "rollback"]) | _json_values(),
            "config": _json_values(),
            "metadata": _json_values(),
            "durability": st.sampled_from(["sync", "async", "exit", "bogus"]) | _json_values(),
            "checkpoint_during": st.booleans() | _json_values(),
            "cancel_on_disconnect": st.booleans() | _json_values(),
            "on_disconnect": st.sampled_from(["cancel", "continue"]) | _json_values(),
            "multitask_strategy": st.sampled_from(["reject", "enqueue", "interrupt", "rollback"])
            | _json_values(),
            "if_not_exists": st.sampled_from(["create", "reject"]) | _json_values(),
        },
    ).map(json.dumps)
    return st.one_of(
        typed,
        typed,
        _json_values().map(json.dumps),
        st.text(max_size=200),
        st.binary(max_size=64),
        st.integers(FRAME_MAX + 1, FRAME_MAX * 3).map(
            lambda n: '{"type":"ping","pad":"' + "x" * n + '"}'
        ),
    )


def _drain(ws: simple_websocket.Client) -> tuple[list[dict[str, Any]], int | None]:
    frames: list[dict[str, Any]] = []
    try:
        while (msg := ws.receive(timeout=0.15)) is not None:
            frame = json.loads(msg)
            assert isinstance(frame, dict) and frame.get("type") in SERVER_FRAME_TYPES, frame
            frames.append(frame)
    except ConnectionClosed as closed:
        return frames, closed.reason
    return frames, None


def test_g3_websocket_frame_fuzzer(fz: Cluster, committed: Committed) -> None:
    """A2/A3: random bytes, random JSON, malformed protocol frames and oversize frames never
    kill the handler: the server answers with JSON frames or closes 1007/1009 (never 1011,
    never `internal_error`), and keeps serving another client."""
    url = fz.url.replace("http://", "ws://") + "/ws"

    @settings(
        max_examples=WS_EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(batch=st.lists(_frames(committed), min_size=1, max_size=3))
    def session(batch: list[Any]) -> None:
        ws = simple_websocket.Client.connect(url, headers={"x-api-key": FUZZER})
        try:
            code = None
            frames: list[dict[str, Any]] = []
            for frame in batch:
                try:
                    ws.send(frame)
                except ConnectionClosed as closed:
                    code = closed.reason
                    break
                got, code = _drain(ws)
                frames += got
                if code is not None:
                    break
            if code is None and not ws.connected:  # closed after the last read
                code = ws.close_reason
            assert code in (None, 1007, 1009), (batch, code)
            for f in frames:
                assert f.get("code") != "internal_error", (batch, f)
        finally:
            with contextlib.suppress(ConnectionClosed):
                ws.close()

    session()
    # Another client is served normally: a ping, and a run created over the socket ends.
    ws = simple_websocket.Client.connect(url, headers={"x-api-key": OWNER})
    try:
        ws.send(json.dumps({"type": "ping", "request_id": "alive"}))
        assert json.loads(ws.receive(timeout=10)) == {"type": "pong", "request_id": "alive"}
        tid = committed.owner_threads[0][0]
        ws.send(
            json.dumps(
                {
                    "type": "run.create",
                    "thread_id": tid,
                    "assistant_id": "lead_agent",
                    "input": {"messages": [{"role": "user", "content": "after the storm"}]},
                    "config": {"configurable": {"tokens": 3}},
                }
            )
        )
        deadline = time.monotonic() + 60
        end = None
        while end is None and time.monotonic() < deadline:
            frame = json.loads(ws.receive(timeout=30))
            if frame["type"] == "end":
                end = frame
        assert end is not None and end["status"] == "success", end
        committed.owner_threads.append((tid, end["run_id"]))
    finally:
        ws.close()


def test_g3_committed_data_intact_after_hostile_traffic(fz: Cluster, committed: Committed) -> None:
    """G3: after all of the above, every previously committed thread, run and event is as it was
    (the owner's runs list gained only the run created after the fuzzing)."""
    after = snapshot_all(
        fz.url,
        Committed(committed.owner_threads[:2], committed.fuzz_thread, committed.fuzz_run, {}),
    )
    before = committed.before
    assert after["fuzz"] == before["fuzz"]
    first, _ = committed.owner_threads[0]
    for tid, _rid in committed.owner_threads[:2]:
        a, b = after[tid], before[tid]
        for name in ("run", "events", "stream"):
            assert a[name] == b[name], (tid, name)
        if tid != first:
            assert a == b, tid
    # The first thread: the one new run, and its old runs unchanged.
    old = {r["run_id"]: r for r in before[first]["runs"]}
    new = {r["run_id"]: r for r in after[first]["runs"]}
    assert set(new) - set(old) == {committed.owner_threads[-1][1]}
    assert all(new[rid] == run for rid, run in old.items())
    assert next(p for p in fz.procs if p.role == "web").alive(), "the web process died"
