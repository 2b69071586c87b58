"""H1, H2: the supervisor's children reach the ops view (shared/ops/supervision.py).

A real Supervisor over real child processes (one that sleeps, one that exits at once) with a
restart policy that gives up after one restart: its states go `restarting` then
`crash_loop` with the exit named, the sleeper stays `running`; the reporter writes them to
Redis and the reader (what the ops collector serves) gives them back, and the health
strip's verdict turns `bad` naming the child. A supervisor that stops reporting drops out.
"""

from __future__ import annotations

import io
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from shared import serde
from shared.ops.supervision import (
    CRASH_LOOP,
    RUNNING,
    ChildState,
    SupervisionReporter,
    read_supervisors,
    supervision_tile,
)
from shared.ops.timed_records import STALE_PERIODS
from shared.redis_keys import Keys
from shared.tools.restart_policy import RestartPolicy
from shared.tools.supervisor import ChildSpec, Output, Supervisor

SLEEPER = ChildSpec("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
CRASHER = ChildSpec("crasher", [sys.executable, "-c", "raise SystemExit(3)"])


@pytest.fixture
def keys(rclient: redis.Redis) -> Iterator[Keys]:
    """A key prefix of this test's own, removed after it."""
    k = Keys(f"test-supervision-{uuid.uuid4().hex[:8]}:")
    yield k
    rclient.delete(k.ops_supervisors())


def test_h1_h2_a_crash_loop_reaches_the_ops_view_and_turns_the_strip_bad(
    rclient: redis.Redis, keys: Keys
) -> None:
    reporter = SupervisionReporter(rclient, keys, host="host-a")
    seen: list[list[ChildState]] = []

    def report(states: list[ChildState]) -> None:
        seen.append(states)
        reporter.publish(states, supervisor_pid=4242)

    sup = Supervisor(
        [SLEEPER, CRASHER],
        env={"PATH": "/usr/bin:/bin"},
        output=Output(io.StringIO()),
        grace_s=2,
        poll_s=0.05,
        policy=lambda: RestartPolicy(backoff_s=0.1, backoff_max_s=0.2, max_restarts=1, window_s=60),
        report=report,
    )
    sup.start()
    watcher = threading.Thread(target=sup.watch, daemon=True)
    watcher.start()
    try:
        deadline = time.monotonic() + 30
        while not any(s.state == CRASH_LOOP for states in seen for s in states):
            assert time.monotonic() < deadline, seen[-1:]
            time.sleep(0.05)
        states = {s.name: s for s in seen[-1]}
        assert states["sleeper"].state == RUNNING and states["sleeper"].pid
        crasher = states["crasher"]
        assert (crasher.state, crasher.restarts, crasher.last_exit) == (CRASH_LOOP, 1, "code 3")
        assert any(s.name == "crasher" and s.state == "restarting" for st in seen for s in st)
        # What ops reads back: the children, and a bad strip naming the child.
        deadline = time.monotonic() + 10
        while True:
            records = read_supervisors(rclient, keys)
            children = {c["name"]: c for r in records for c in r["children"]}
            if children.get("crasher", {}).get("state") == CRASH_LOOP:
                break
            assert time.monotonic() < deadline, records
            time.sleep(0.05)
        assert records[0]["host"] == "host-a" and records[0]["pid"] == 4242
        assert [c["name"] for c in records[0]["children"]] == ["sleeper", "crasher"]
        verdict = supervision_tile(records)
        assert verdict == ("bad", "crash loop, not restarted: crasher (code 3)")
    finally:
        sup.request_stop()
        watcher.join(timeout=10)
        sup.stop()
    reporter.remove()
    assert read_supervisors(rclient, keys) == []


def test_h2_a_supervisor_that_stopped_reporting_drops_out(rclient: redis.Redis, keys: Keys) -> None:
    old = {"host": "gone", "pid": 1, "at": time.time() - 2.0 * STALE_PERIODS - 1, "children": []}
    ancient = {**old, "host": "ancient", "at": time.time() - 7200}
    rclient.hset(keys.ops_supervisors(), "gone", serde.dumps(old))
    rclient.hset(keys.ops_supervisors(), "ancient", serde.dumps(ancient))
    rclient.hset(keys.ops_supervisors(), "broken", b"not json")
    assert read_supervisors(rclient, keys) == []
    assert rclient.hkeys(keys.ops_supervisors()) == [b"gone"]  # pruned: ancient, broken
    assert supervision_tile([]) is None


def test_h2_restarting_children_warn_and_running_ones_are_ok() -> None:
    def record(*states: str) -> dict[str, object]:
        children = [{"name": f"c{i}", "state": s} for i, s in enumerate(states)]
        return {"host": "h", "children": children}

    assert supervision_tile([record("running", "running")]) == (
        "ok",
        "2 supervised processes running",
    )
    assert supervision_tile([record("running", "restarting")]) == ("warn", "restarting: c1")
