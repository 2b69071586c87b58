"""The Python client and the `threadrun chat` CLI against real processes (B9, B4, B5, A1, A2).

Every scenario runs over both transports (SSE and WebSocket). Drops are forced with the
client's fault hook, which closes the live connection after K events; gaps come from a
second cluster that retains only 5 events per run (THREADRUN_STREAM_MAXLEN=5) with its
own database and Redis prefix (so its reaper never sees the session cluster's runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from shared.redis_keys import Keys
from shared.settings import Settings
from shared.tools.testing import Cluster
from tests.conftest import private_settings
from tests.e2e.conftest import ALICE, e2e_cluster
from threadrun.client import (
    ConnectionInfo,
    Reconnecting,
    RecoveryPolicy,
    RunEnded,
    RunStream,
    StateReloaded,
    StreamEvent,
    StreamReplayGapError,
    ThreadrunClient,
    message_delta,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
FAST = RecoveryPolicy(backoff_initial_s=0.2, jitter=0.0, read_timeout_s=15.0)


@pytest.fixture(params=["sse", "ws"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def knobs(tokens: int, delay_ms: float = 0) -> dict[str, Any]:
    return {"configurable": {"tokens": tokens, "token_delay_ms": delay_ms}}


def make_client(
    c: Cluster, transport: str, policy: RecoveryPolicy = FAST, **kw: Any
) -> ThreadrunClient:
    return ThreadrunClient(c.url, ALICE, transport=transport, policy=policy, **kw)  # type: ignore[arg-type]


def tokens(items: list[Any]) -> list[str]:
    out = []
    for i in items:
        if isinstance(i, StreamEvent):
            delta = message_delta(i)
            if delta is not None:
                out.append(delta[1])
    return out


def event_ids(items: list[Any]) -> list[str]:
    return [i.id for i in items if isinstance(i, StreamEvent)]


def replay(c: Cluster, tid: str, run_id: str) -> list[tuple[str, str]]:
    """(id, event) of everything retained, read with plain httpx (B4: Last-Event-ID -1)."""
    with httpx.Client(base_url=c.url, headers={"x-api-key": ALICE}, timeout=30) as h:
        res = h.get(f"/threads/{tid}/runs/{run_id}/stream", headers={"Last-Event-ID": "-1"})
    out = []
    for block in res.text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "id" in fields:
            out.append((fields["id"], fields["event"]))
    return out


def wait_terminal(client: ThreadrunClient, tid: str, run_id: str, timeout: float = 30) -> str:
    end = time.monotonic() + timeout
    while True:
        status = str(client.get_run(tid, run_id)["status"])
        if status not in ("pending", "running") or time.monotonic() > end:
            return status
        time.sleep(0.1)


def last_ai(values: Any) -> str:
    msgs = values["messages"]
    return str(next(m["content"] for m in reversed(msgs) if m["type"] == "ai"))


def drop_first_connection_after(k: int) -> Callable[[ConnectionInfo], bool]:
    def hook(info: ConnectionInfo) -> bool:
        return info.number == 1 and info.events >= k

    return hook


# --- the session cluster (default retention) ----------------------------------------------------
def test_b9_a1_stream_a_run_and_count_tokens(cluster: Cluster, transport: str) -> None:
    """B9/A1: metadata first, every token once, RunEnded(success); the streamed text equals the
    durable reply."""
    with make_client(cluster, transport) as client:
        tid = client.create_thread()["thread_id"]
        stream = client.stream_run(tid, "lead_agent", input=human("hi"), config=knobs(12))
        items = list(stream)
        state = client.get_state(tid)
    assert isinstance(items[0], StreamEvent) and items[0].event == "metadata"
    assert items[0].data["run_id"] == stream.run_id
    assert len(tokens(items)) == 12
    assert items[-1] == RunEnded(str(stream.run_id), "success")
    assert not any(isinstance(i, Reconnecting | StateReloaded) for i in items)
    assert stream.partial_text == last_ai(state["values"]) == "".join(tokens(items))
    assert stream.values == state["values"]


def test_b9_b4_forced_drop_resumes_with_every_event_exactly_once(
    cluster: Cluster, transport: str
) -> None:
    """B9/B4: the connection is closed after 10 events; the client reconnects with the last id
    and the events it delivers equal a full replay (`Last-Event-ID: -1`), in order, once."""
    hook = drop_first_connection_after(10)
    with make_client(cluster, transport, fault_hook=hook) as client:
        tid = client.create_thread()["thread_id"]
        stream = client.stream_run(tid, "lead_agent", input=human("x"), config=knobs(60, 15))
        items = list(stream)
    run_id = str(stream.run_id)
    recon = [i for i in items if isinstance(i, Reconnecting)]
    assert len(recon) == 1 and recon[0].last_event_id == event_ids(items)[9]
    assert stream.connections == 2
    full = replay(cluster, tid, run_id)
    assert event_ids(items) == [eid for eid, name in full if name != "end"]
    assert full[-1][1] == "end" and items[-1] == RunEnded(run_id, "success")
    assert len(tokens(items)) == 60


def test_b9_b5_expired_stream_of_an_ended_run_reloads_then_ends(
    cluster: Cluster, transport: str
) -> None:
    """B5/B9: the stream is gone (a gap with null bounds); the run is terminal, so the client
    reloads the durable state and ends with the run's status."""
    with make_client(cluster, transport) as client:
        tid = client.create_thread()["thread_id"]
        first = list(client.stream_run(tid, "lead_agent", input=human("x"), config=knobs(4)))
        run_id = first[0].data["run_id"]  # type: ignore[union-attr]
        keys = Keys(cluster.settings.redis_prefix)
        r = redis.Redis.from_url(cluster.settings.redis_url)
        try:
            assert r.delete(keys.stream(run_id), keys.stream_meta(run_id)) == 2
        finally:
            r.close()
        items = list(client.join_run(tid, run_id, last_event_id=event_ids(first)[1]))
        state = client.get_state(tid)
    assert [type(i) for i in items] == [StateReloaded, RunEnded]
    reloaded, ended = items
    assert isinstance(reloaded, StateReloaded) and reloaded.state == state
    assert reloaded.gap.latest_available_event_id is None
    assert reloaded.gap.requested_event_id == event_ids(first)[1]
    assert ended == RunEnded(run_id, "success")


def test_b9_cancel_is_run_ended_interrupted_not_a_reload(cluster: Cluster, transport: str) -> None:
    """B9/R5: a cancelled run ends with RunEnded(interrupted) — distinct from StateReloaded."""
    with make_client(cluster, transport) as client:
        tid = client.create_thread()["thread_id"]
        stream = client.stream_run(tid, "lead_agent", input=human("x"), config=knobs(400, 10))
        items: list[Any] = []
        for item in stream:
            items.append(item)
            if len(tokens(items)) == 5:
                client.cancel(tid, str(stream.run_id))
    assert items[-1] == RunEnded(str(stream.run_id), "interrupted")
    assert not any(isinstance(i, StateReloaded) for i in items)
    assert 5 <= len(tokens(items)) < 400


def run_cli(c: Cluster, transport: str, *args: str, stdin: str | None = None) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADRUN_")}
    return subprocess.run(
        [sys.executable, "-m", "threadrun", "chat", "--url", c.url, "--api-key", ALICE]
        + ["--transport", transport, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
        check=False,
    )


def cli_thread(stderr: str) -> str:
    line = next(x for x in stderr.splitlines() if x.startswith("thread "))
    return line.split()[1]


def test_b9_cli_message_prints_the_streamed_reply(cluster: Cluster, transport: str) -> None:
    """B9: `threadrun chat --message` prints the assistant's tokens and exits 0."""
    res = run_cli(
        cluster, transport, "--message", "hello cli", "--config", '{"configurable": {"tokens": 7}}'
    )
    assert res.returncode == 0, res.stderr
    with make_client(cluster, transport) as client:
        state = client.get_state(cli_thread(res.stderr))
    assert res.stdout == last_ai(state["values"]) + "\n"
    assert "[reconnecting" not in res.stderr and "[view incomplete" not in res.stderr


def test_b9_cli_interactive_reads_one_message_per_line(cluster: Cluster) -> None:
    """B9: without --message, each stdin line is one turn on the same thread."""
    res = run_cli(
        cluster, "ws", "--config", '{"configurable": {"tokens": 3}}', stdin="one\n\ntwo\n"
    )
    assert res.returncode == 0, res.stderr
    with make_client(cluster, "sse") as client:
        msgs = client.get_state(cli_thread(res.stderr))["values"]["messages"]
    assert [m["content"] for m in msgs if m["type"] == "human"] == ["one", "two"]
    replies = [m["content"] for m in msgs if m["type"] == "ai"]
    assert res.stdout.splitlines() == replies


def test_b9_cli_refused_request_exits_1(cluster: Cluster, transport: str) -> None:
    """A3: a refused request (unknown assistant) is a clear error and exit status 1."""
    res = run_cli(cluster, transport, "--assistant", "nope", "--message", "x")
    assert res.returncode == 1 and "nope" in res.stderr and res.stdout == ""


# --- a cluster with tiny retention (gaps) --------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(
    settings: Settings,
    redis_url: str,
    template_database: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    """Web + one worker retaining 5 events per run, on their own database and Redis prefix."""
    with private_settings(settings, redis_url, template_database) as s:
        s = s.model_copy(update={"data_dir": tmp_path_factory.mktemp("client-tiny-data")})
        logs = tmp_path_factory.mktemp("client-tiny-logs")
        with e2e_cluster(s, logs, {"THREADRUN_STREAM_MAXLEN": "5"}) as c:
            c.side_by_side(c.start_web, lambda: c.start_worker("client-tiny"))
            yield c


class AwayAfterTokens:
    """Fault hook: close the first connection once the reader has seen `n` tokens (then the
    reader is "away" for the back-off while the run keeps publishing); optionally close every
    rejoin after a gap before it reads anything."""

    def __init__(self, n: int, *, drop_rejoins: bool = False) -> None:
        self.n = n
        self.drop_rejoins = drop_rejoins
        self.items: list[Any] = []

    def __call__(self, info: ConnectionInfo) -> bool:
        if info.number == 1:
            return len(tokens(self.items)) >= self.n
        return self.drop_rejoins and info.reason == "rejoin"


def key(event_id: str) -> tuple[int, int]:
    ms, seq = event_id.split("-")
    return int(ms), int(seq)


def test_b9_b5_gap_reloads_state_and_still_ends_with_success(tiny: Cluster, transport: str) -> None:
    """B9/B5: the reader is away while more than the retained 5 events pass: the client drops
    its partial text, reloads the durable state (StateReloaded), rejoins after the latest
    retained id, ends with RunEnded(success), and its final view equals GET /state."""
    reload_partial: list[str] = []
    hook = AwayAfterTokens(3)
    policy = RecoveryPolicy(backoff_initial_s=0.6, jitter=0.0, read_timeout_s=15.0)
    with make_client(tiny, transport, policy, fault_hook=hook) as client:
        tid = client.create_thread()["thread_id"]
        stream: RunStream = client.stream_run(
            tid, "lead_agent", input=human("x"), config=knobs(60, 20)
        )
        items = hook.items
        for item in stream:
            items.append(item)
            if isinstance(item, StateReloaded):
                reload_partial.append(stream.partial_text)
        state = client.get_state(tid)
        run = client.get_run(tid, str(stream.run_id))
    reloads = [n for n, i in enumerate(items) if isinstance(i, StateReloaded)]
    assert reloads and reload_partial[0] == ""
    gap = items[reloads[0]].gap
    assert gap.code == "stream_replay_gap" and gap.run_id == stream.run_id
    before, after = event_ids(items[: reloads[0]]), event_ids(items[reloads[0] :])
    assert gap.requested_event_id == before[-1] and len(tokens(items[: reloads[0]])) == 3
    assert gap.latest_available_event_id is not None
    assert all(key(e) > key(gap.latest_available_event_id) for e in after)
    ids = [key(e) for e in event_ids(items)]
    assert ids == sorted(set(ids))
    assert items[-1] == RunEnded(str(stream.run_id), "success") and run["status"] == "success"
    assert stream.values == state["values"]
    assert len(tokens(items)) < 60  # the trimmed ones were never delivered


def test_b9_three_consecutive_gaps_raise_while_the_run_finishes(
    tiny: Cluster, transport: str
) -> None:
    """B9: every rejoin after a gap is dropped before it reads anything and the reader stays
    away past the retention, three times in a row: StreamReplayGapError, which says the run
    keeps going — and the run does finish with success."""
    hook = AwayAfterTokens(3, drop_rejoins=True)
    policy = RecoveryPolicy(backoff_initial_s=0.6, backoff_factor=1.0, jitter=0.0)
    with make_client(tiny, transport, policy, fault_hook=hook) as client:
        tid = client.create_thread()["thread_id"]
        stream = client.stream_run(tid, "lead_agent", input=human("x"), config=knobs(200, 20))
        items = hook.items
        with pytest.raises(StreamReplayGapError) as info:
            for item in stream:
                items.append(item)
        run_id = str(stream.run_id)
        assert client.get_run(tid, run_id)["status"] == "running"
        assert wait_terminal(client, tid, run_id) == "success"
    err = info.value
    assert err.run_id == run_id and len(err.gaps) == 3 and "keeps going" in str(err)
    assert sum(isinstance(i, StateReloaded) for i in items) == 2
    assert err.gaps[0].requested_event_id == event_ids(items)[-1]
    assert err.gaps[1].requested_event_id == err.gaps[0].latest_available_event_id
    assert err.gaps[2].requested_event_id == err.gaps[1].latest_available_event_id
