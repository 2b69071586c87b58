"""The WebSocket chat protocol (A2) against real gunicorn + Celery processes.

Frames are one JSON object per text frame (docs/websocket.md). Covers A2 with the replay,
gap, heartbeat and end semantics of the bridge (B4-B7), identity and ownership (A4),
cancel (R5), on_disconnect=cancel (R6) and malformed input (A3). The gap and heartbeat
tests use a second cluster with `THREADRUN_STREAM_MAXLEN=5` and a 0.5 s heartbeat.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import simple_websocket
from simple_websocket import ConnectionClosed

from shared.agent.graphs import assistant_id_for
from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, BOB, ClusterFactory

pytestmark = pytest.mark.e2e

Frame = dict[str, Any]


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def knobs(tokens: int = 8, delay_ms: float = 0) -> dict[str, Any]:
    return {"configurable": {"tokens": tokens, "token_delay_ms": delay_ms}}


def create_frame(tokens: int = 8, delay_ms: float = 0, **extra: Any) -> Frame:
    return {
        "type": "run.create",
        "assistant_id": "lead_agent",
        "input": human("hello over ws"),
        "stream_mode": ["messages-tuple", "values"],
        "config": knobs(tokens, delay_ms),
        **extra,
    }


class WS:
    """A test client: JSON frames over simple-websocket."""

    def __init__(self, base: str, path: str = "/ws", key: str | None = ALICE, query: str = ""):
        url = base.replace("http://", "ws://") + path + (f"?{query}" if query else "")
        headers = {"x-api-key": key} if key else {}
        self.client = simple_websocket.Client.connect(url, headers=headers)
        self.backlog: deque[Frame] = deque()  # stream items `request` stepped over

    def send(self, frame: Frame) -> None:
        self.client.send(json.dumps(frame))

    def recv(self, timeout: float = 30) -> Frame:
        if self.backlog:
            return self.backlog.popleft()
        msg = self.client.receive(timeout=timeout)
        if msg is None:
            raise AssertionError(f"no frame within {timeout} s")
        frame = json.loads(msg)
        assert isinstance(frame, dict)
        return frame

    def request(self, frame: Frame, timeout: float = 30) -> Frame:
        """Send and return the next frame that is not a run's stream item (those are kept)."""
        self.send(frame)
        skipped: list[Frame] = []
        while True:
            msg = self.client.receive(timeout=timeout)
            if msg is None:
                raise AssertionError(f"no reply within {timeout} s")
            got = json.loads(msg)
            if got["type"] not in ("event", "heartbeat", "end", "gap"):
                self.backlog.extend(skipped)
                return got
            skipped.append(got)

    def until(self, done: Callable[[Frame], bool], timeout: float = 60) -> list[Frame]:
        """Frames up to and including the first one `done` accepts."""
        end = time.monotonic() + timeout
        out: list[Frame] = []
        while True:
            out.append(self.recv(max(0.1, end - time.monotonic())))
            if done(out[-1]):
                return out

    def follow(self, run_ids: set[str], timeout: float = 60) -> dict[str, list[Frame]]:
        """Frames per run until every run in `run_ids` has its `end` (or `gap`)."""
        per: dict[str, list[Frame]] = {r: [] for r in run_ids}
        open_ = set(run_ids)
        end = time.monotonic() + timeout
        while open_:
            f = self.recv(max(0.1, end - time.monotonic()))
            if f.get("run_id") in per:
                per[f["run_id"]].append(f)
                if f["type"] in ("end", "gap"):
                    open_.discard(f["run_id"])
        return per

    def close(self) -> None:
        if self.client.connected:
            with contextlib.suppress(OSError):  # the test may have cut the connection
                self.client.close()

    def __enter__(self) -> WS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def api(c: Cluster, key: str = ALICE) -> httpx.Client:
    return httpx.Client(base_url=c.url, headers={"x-api-key": key}, timeout=30)


def new_thread(c: Cluster, key: str = ALICE) -> str:
    with api(c, key) as h:
        return str(h.post("/threads", json={}).json()["thread_id"])


def status(c: Cluster, tid: str, run_id: str) -> str:
    with api(c) as h:
        return str(h.get(f"/threads/{tid}/runs/{run_id}").json()["status"])


def wait_status(c: Cluster, tid: str, run_id: str, want: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while (got := status(c, tid, run_id)) != want:
        assert time.monotonic() < end, f"run {run_id} is {got}, expected {want}"
        time.sleep(0.1)


def tokens(frames: list[Frame]) -> list[str]:
    """Texts of the AI token chunks among `messages` events."""
    return [
        f["data"][0]["content"]
        for f in frames
        if f["type"] == "event"
        and f["event"] == "messages"
        and f["data"][0].get("type") == "AIMessageChunk"
        and f["data"][0].get("content")
    ]


def event_ids(frames: list[Frame]) -> list[str]:
    return [f["id"] for f in frames if f["type"] in ("event", "end")]


def as_key(event_id: str) -> tuple[int, int]:
    ms, seq = event_id.split("-")
    return int(ms), int(seq)


def refused_upgrade(base: str, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """A raw upgrade request (so the refusal's status and JSON body can be read)."""
    upgrade = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    return httpx.get(base + path, headers={**upgrade, **(headers or {})}, timeout=10)


def web_threads(c: Cluster) -> int:
    """Threads of the (single) gunicorn worker process of `c`."""
    children = next(p for p in c.procs if p.name.startswith("web")).children()
    assert len(children) == 1, children
    return len(os.listdir(f"/proc/{children[0]}/task"))


def idle_threads(c: Cluster) -> int:
    """The web worker's thread count with no socket open (its pool has an idle thread)."""
    with WS(c.url) as warm:
        assert warm.request({"type": "ping"}) == {"type": "pong"}
    time.sleep(0.5)
    return web_threads(c)


def assert_threads_back(c: Cluster, baseline: int, timeout: float = 8) -> None:
    """Every socket, reader and subscription thread is gone again (no leak)."""
    end = time.monotonic() + timeout
    while (n := web_threads(c)) > baseline:
        assert time.monotonic() < end, f"{n} threads in the web worker, {baseline} before"
        time.sleep(0.1)


# --- the main cluster -------------------------------------------------------------------------


def test_a2_b7_create_streams_every_token_then_end(cluster: Cluster) -> None:
    """A2, B7, A1: run.create answers run.created (request_id echoed), then metadata first,
    every token as a parsed `event` frame with increasing ids, and `end` with the committed status."""
    tid = new_thread(cluster)
    with WS(cluster.url, f"/threads/{tid}/ws") as ws:  # the path sets the default thread_id
        created = ws.request(create_frame(tokens=12, request_id="r-1"))
        assert created["type"] == "run.created" and created["request_id"] == "r-1"
        run = created["run"]
        assert run["thread_id"] == tid and run["assistant_id"] == assistant_id_for("lead_agent")
        frames = ws.follow({run["run_id"]})[run["run_id"]]
    first, last = frames[0], frames[-1]
    assert first["type"] == "event" and first["event"] == "metadata"
    assert first["data"] == {"run_id": run["run_id"], "attempt": 1}
    assert len(tokens(frames)) == 12
    assert {"messages", "values"} <= {f["event"] for f in frames if f["type"] == "event"}
    assert last == {"type": "end", "run_id": run["run_id"], "id": last["id"], "status": "success"}
    ids = event_ids(frames)
    assert [as_key(i) for i in ids] == sorted({as_key(i) for i in ids})  # B2: strictly increasing
    assert status(cluster, tid, run["run_id"]) == "success"  # committed before the end frame


def test_a2_b4_join_mid_run_gets_exactly_the_rest(cluster: Cluster) -> None:
    """A2, B4: leave mid-run, run.join with last_event_id gets exactly the rest; a full replay
    (`-1`) has the same ids; later frames on one socket still run as the upgrade's user (A4)."""
    tid = new_thread(cluster)
    with WS(cluster.url) as ws:
        run_id = ws.request(create_frame(tokens=60, delay_ms=15, thread_id=tid))["run"]["run_id"]
        first = ws.until(lambda f: f["type"] == "event" and len(tokens([f])) == 1)
        first += [ws.recv() for _ in range(10)]
    assert all(f["type"] == "event" for f in first)
    assert status(cluster, tid, run_id) == "running"  # on_disconnect=continue (default)
    with WS(cluster.url) as ws:
        assert ws.request({"type": "ping", "request_id": 7}) == {"type": "pong", "request_id": 7}
        ws.send(
            {
                "type": "run.join",
                "thread_id": tid,
                "run_id": run_id,
                "last_event_id": first[-1]["id"],
            }
        )
        rest = ws.follow({run_id})[run_id]
        ws.send({"type": "run.join", "thread_id": tid, "run_id": run_id, "last_event_id": -1})
        full = ws.follow({run_id})[run_id]
    assert rest[-1]["type"] == "end" and rest[-1]["status"] == "success"
    assert event_ids(first + rest) == event_ids(full)
    assert sorted(tokens(first + rest)) == sorted(tokens(full)) and len(tokens(full)) == 60


def test_a2_r5_cancel_over_ws(cluster: Cluster) -> None:
    """A2, R5: run.cancel answers run.cancel.accepted; the followed run ends `interrupted`;
    with action=rollback the thread's state is the one before the run (here: empty)."""
    tid = new_thread(cluster)
    with WS(cluster.url, f"/threads/{tid}/ws") as ws:
        run_id = ws.request(create_frame(tokens=400, delay_ms=10))["run"]["run_id"]
        ws.until(lambda f: len(tokens([f])) == 1)
        ws.send({"type": "run.cancel", "run_id": run_id, "request_id": "c", "action": "rollback"})
        frames = ws.until(lambda f: f["type"] == "end")
    accepted = [f for f in frames if f["type"] == "run.cancel.accepted"]
    assert accepted == [
        {"type": "run.cancel.accepted", "request_id": "c", "run_id": run_id, "outcome": "requested"}
    ]
    assert frames[-1]["status"] == "interrupted"
    assert 0 < len(tokens(frames)) < 400
    assert status(cluster, tid, run_id) == "interrupted"
    with api(cluster) as h:
        state = h.get(f"/threads/{tid}/state").json()
    assert (
        state["values"]["messages"] == [] and state["metadata"]["threadrun_rollback_of"] == run_id
    )


def test_a4_another_users_key_gets_not_found(cluster: Cluster) -> None:
    """A2, A4: bob's frames on alice's thread/run get `not_found`, exactly like a missing one;
    alice's run is untouched."""
    tid = new_thread(cluster)
    with WS(cluster.url) as ws:
        run_id = ws.request(create_frame(thread_id=tid))["run"]["run_id"]
        ws.follow({run_id})
    missing_tid, missing_run = str(uuid.uuid4()), str(uuid.uuid4())
    answers: dict[str, list[Frame]] = {}
    with WS(cluster.url, key=BOB) as bob:
        for t, r in ((tid, run_id), (missing_tid, missing_run)):
            for frame in (
                {"type": "run.join", "thread_id": t, "run_id": r, "last_event_id": "-1"},
                {"type": "run.cancel", "thread_id": t, "run_id": r},
                create_frame(thread_id=t),
            ):
                got = bob.request({**frame, "request_id": "b"})
                assert got["type"] == "error" and got["code"] == "not_found", got
                got["message"] = got["message"].replace(t, "T").replace(r, "R")
                answers.setdefault(t, []).append(got)
    assert answers[tid] == answers[missing_tid]  # nothing tells "not yours" from "missing"
    with WS(cluster.url, f"/threads/{tid}/ws", key=BOB) as bob:
        assert bob.request(create_frame())["code"] == "not_found"
        assert bob.request({"type": "run.join", "run_id": run_id})["code"] == "not_found"
    with api(cluster) as h:
        assert [r["run_id"] for r in h.get(f"/threads/{tid}/runs").json()] == [run_id]
    assert status(cluster, tid, run_id) == "success"


def test_a4_upgrade_without_a_valid_key_is_401(cluster: Cluster) -> None:
    """A2, A4: no key or a wrong key → HTTP 401 JSON before the upgrade; `?api_key=` works for
    browsers, and the header works too."""
    for headers in (None, {"x-api-key": "nope"}, {"Authorization": "Bearer nope"}):
        res = refused_upgrade(cluster.url, "/ws", headers)
        assert res.status_code == 401 and res.json()["error"] == "unauthorized", res.text
    res = refused_upgrade(cluster.url, f"/threads/{uuid.uuid4()}/ws?api_key=nope")
    assert res.status_code == 401
    with WS(cluster.url, key=None, query=f"api_key={ALICE}") as ws:
        assert ws.request({"type": "ping"}) == {"type": "pong"}
    with WS(cluster.url, key=BOB) as ws:
        assert ws.request({"type": "ping"}) == {"type": "pong"}


def test_a2_non_json_binary_and_oversized_frames_close_the_socket(cluster: Cluster) -> None:
    """A2, A3: a text frame that is not JSON or a binary frame → close 1007; a frame above
    max_body_bytes → an `error` frame naming the limit, then close 1009. The server keeps serving other sockets, and the closed
    sockets leave no thread behind."""
    baseline = idle_threads(cluster)
    for payload in ("{not json", b"\x00\x01"):
        with WS(cluster.url) as ws:
            ws.client.send(payload)
            with pytest.raises(ConnectionClosed) as info:
                ws.recv(10)
            assert info.value.reason == 1007
    with WS(cluster.url) as ws:
        ws.client.send("x" * ((1 << 20) + 1))
        said = ws.recv(10)  # first the reason, as an `error` frame naming the limit
        assert said["code"] == "limit_exceeded" and said["limit"] == "ws_max_frame_bytes"
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(10)
        assert info.value.reason == 1009
    with WS(cluster.url) as ws:
        assert ws.request({"type": "ping"}) == {"type": "pong"}
    assert_threads_back(cluster, baseline)


def test_a2_a3_bad_frames_get_error_frames_and_the_socket_stays(cluster: Cluster) -> None:
    """A2, A3: unknown/missing type, non-object JSON, invalid fields → `error` frames naming the
    problem (and the field); a ping still works afterwards."""
    tid = new_thread(cluster)
    with WS(cluster.url) as ws:
        cases: list[tuple[Any, str, str | None]] = [
            ({"type": "run.explode", "request_id": 1}, "unknown_type", "type"),
            ([1, 2], "invalid_request", "frame"),
            ({}, "invalid_request", "type"),
            ({"type": "ping", "request_id": {"x": 1}}, "invalid_request", "request_id"),
            (create_frame(), "invalid_request", "thread_id"),  # /ws has no default thread
            (create_frame(thread_id=tid, stream_mode="strem"), "invalid_request", "stream_mode"),
            (create_frame(thread_id=tid, webhook="ftp://x"), "invalid_request", "webhook"),
            ({**create_frame(thread_id=tid), "assistant_id": "nope"}, "not_found", None),
            ({"type": "run.join", "thread_id": tid}, "invalid_request", "run_id"),
            ({"type": "run.join", "thread_id": "not-a-uuid", "run_id": "x"}, "not_found", None),
        ]
        for frame, code, field in cases:
            got = ws.request(frame)
            assert got["type"] == "error" and got["code"] == code, (frame, got)
            assert got.get("field") == field, (frame, got)
            assert got["message"]
        assert ws.request({"type": "run.explode", "request_id": "z"})["request_id"] == "z"
        assert ws.request({"type": "ping"}) == {"type": "pong"}
    with api(cluster) as h:
        assert h.get(f"/threads/{tid}/runs").json() == []  # nothing was admitted


def test_b4_bad_last_event_id_is_an_error_frame(cluster: Cluster) -> None:
    """A2, B4: a malformed cursor or one beyond the last id → `invalid_last_event_id`, never a
    Redis error; joining at the end's id answers `end` at once (B7)."""
    tid = new_thread(cluster)
    with WS(cluster.url, f"/threads/{tid}/ws") as ws:
        run_id = ws.request(create_frame())["run"]["run_id"]
        end = ws.follow({run_id})[run_id][-1]
        for bad in ("gar bage", "99999999999999-0", "9" * 30 + "-0"):
            got = ws.request({"type": "run.join", "run_id": run_id, "last_event_id": bad})
            assert got["code"] == "invalid_last_event_id" and got["field"] == "last_event_id"
            assert "ERR" not in got["message"]
        ws.send({"type": "run.join", "run_id": run_id, "last_event_id": end["id"]})
        assert ws.recv(10) == end
        assert ws.request({"type": "ping"}) == {"type": "pong"}


def test_a2_two_runs_on_one_socket(cluster: Cluster) -> None:
    """A2: one socket follows two runs at once; each gets all its tokens and its own end;
    following the same run twice is refused."""
    t1, t2 = new_thread(cluster), new_thread(cluster)
    with WS(cluster.url) as ws:
        r1 = ws.request(create_frame(tokens=30, delay_ms=10, thread_id=t1))["run"]["run_id"]
        r2 = ws.request(create_frame(tokens=20, delay_ms=10, thread_id=t2))["run"]["run_id"]
        again = ws.request({"type": "run.join", "thread_id": t1, "run_id": r1})
        assert again["code"] == "already_subscribed"
        per = ws.follow({r1, r2})
    assert len(tokens(per[r1])) == 30 and len(tokens(per[r2])) == 20
    assert per[r1][-1]["status"] == per[r2][-1]["status"] == "success"
    assert all(f["run_id"] == r1 for f in per[r1]) and all(f["run_id"] == r2 for f in per[r2])


def test_r6_closing_the_socket_cancels_on_disconnect_runs_and_stops_its_threads(
    cluster: Cluster,
) -> None:
    """A2, R6: a socket that closes (cleanly, or by just vanishing) cancels the runs it created
    with on_disconnect=cancel or joined with cancel_on_disconnect (like SSE), leaves the others
    running, and stops every subscription thread (no leak in the web process)."""
    baseline = idle_threads(cluster)
    t1, t2, t3, t4 = (new_thread(cluster) for _ in range(4))
    with api(cluster) as h:
        body = {
            "assistant_id": "lead_agent",
            "input": human("bg"),
            "stream_mode": ["messages-tuple"],
            "config": knobs(400, 10),
        }
        joined = h.post(f"/threads/{t3}/runs", json=body).json()["run_id"]
    with WS(cluster.url) as ws:
        doomed = ws.request(create_frame(400, 10, thread_id=t1, on_disconnect="cancel"))
        kept = ws.request(create_frame(250, 10, thread_id=t2))["run"]["run_id"]
        ws.send(
            {"type": "run.join", "thread_id": t3, "run_id": joined, "cancel_on_disconnect": True}
        )
        ws.until(lambda f: f.get("run_id") == joined and len(tokens([f])) > 0)
        if cluster.web_worker_class == "gthread":  # under gevent they are greenlets
            assert web_threads(cluster) >= baseline + 4  # reader + three subscription threads
    with WS(cluster.url) as ws:
        dropped = ws.request(create_frame(400, 10, thread_id=t4, on_disconnect="cancel"))
        ws.until(lambda f: len(tokens([f])) > 0)
        ws.client.sock.shutdown(socket.SHUT_RDWR)  # no close frame: the client just vanishes
    for tid, run_id in (
        (t1, doomed["run"]["run_id"]),
        (t3, joined),
        (t4, dropped["run"]["run_id"]),
    ):
        wait_status(cluster, tid, run_id, "interrupted", timeout=10)
    assert status(cluster, t2, kept) == "running"
    assert_threads_back(cluster, baseline)
    wait_status(cluster, t2, kept, "success")


# --- a cluster with tiny retention and a fast heartbeat -------------------------------------------

TINY = {"THREADRUN_STREAM_MAXLEN": "5", "THREADRUN_STREAM_HEARTBEAT_S": "0.5"}


@pytest.fixture(scope="module")
def tiny(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """Web + one worker, 5 retained events per run, 0.5 s heartbeat, own database and prefix."""
    with private_cluster("ws-tiny", TINY) as c:
        yield c.start(workers=["ws-tiny"])


def test_b5_gap_when_the_cursor_was_trimmed(tiny: Cluster) -> None:
    """A2, B5: joining after the run with a cursor whose successors were trimmed gives one `gap`
    frame with the retained bounds, then that subscription ends; `-1` replays the tail (B7)."""
    tid = new_thread(tiny)
    with WS(tiny.url, f"/threads/{tid}/ws") as ws:
        run_id = ws.request(create_frame(tokens=30, delay_ms=5))["run"]["run_id"]
        first = ws.until(lambda f: f["type"] == "event")[-1]
    assert first["event"] == "metadata"
    wait_status(tiny, tid, run_id, "success")
    with WS(tiny.url, f"/threads/{tid}/ws") as ws:
        ws.send({"type": "run.join", "run_id": run_id, "last_event_id": "-1"})
        tail = ws.follow({run_id})[run_id]
        ws.send({"type": "run.join", "run_id": run_id, "last_event_id": first["id"]})
        gap = ws.recv()
        assert ws.request({"type": "ping"}, timeout=2) == {"type": "pong"}
        with pytest.raises(AssertionError, match="no frame"):
            ws.recv(timeout=1.2)  # the gap ended the subscription: not even a heartbeat
    ids = event_ids(tail)
    assert tail[-1]["type"] == "end" and len(ids) <= 6
    assert gap == {
        "type": "gap",
        "code": "stream_replay_gap",
        "run_id": run_id,
        "requested_event_id": first["id"],
        "earliest_available_event_id": ids[0],
        "latest_available_event_id": ids[-1],
        "recovery": "reload_durable_state",
    }


def test_b6_heartbeat_frames_while_a_run_is_idle(tiny: Cluster) -> None:
    """A2, B6: a followed run that is silent for the heartbeat interval gets `heartbeat` frames
    carrying its run_id."""
    tid = new_thread(tiny)
    with WS(tiny.url, f"/threads/{tid}/ws") as ws:
        run_id = ws.request(create_frame(tokens=2, delay_ms=1500, stream_mode=["messages-tuple"]))[
            "run"
        ]["run_id"]
        frames = ws.follow({run_id})[run_id]
    beats = [f for f in frames if f["type"] == "heartbeat"]
    assert len(beats) >= 2 and all(f == {"type": "heartbeat", "run_id": run_id} for f in beats)
    assert frames[-1]["type"] == "end" and len(tokens(frames)) == 2
