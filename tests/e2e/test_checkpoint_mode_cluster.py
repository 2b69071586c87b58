"""S4 with real processes: a deployment running in `delta` mode serves threads end to end,
and a process started with another mode refuses to start against its database."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from shared.tools.testing import Cluster, iter_sse, open_stream
from tests.e2e.conftest import ALICE, ClusterFactory

pytestmark = pytest.mark.e2e

DELTA = {"THREADRUN_CHECKPOINT_MODE": "delta", "THREADRUN_CHECKPOINT_SNAPSHOT_EVERY": "3"}


@pytest.fixture(scope="module")
def delta(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """A web process and a runs worker in delta mode, on a database of their own."""
    with private_cluster("delta", DELTA) as c:
        yield c.start(workers=["delta"])


def _wait(client: httpx.Client, tid: str, text: str) -> dict[str, Any]:
    body = {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": text}]},
        "config": {"configurable": {"tokens": 6}},
    }
    res = client.post(f"/threads/{tid}/runs/wait", json=body)
    assert res.status_code == 200, res.text
    return dict(res.json())


def test_s4_a_delta_deployment_serves_threads(delta: Cluster) -> None:
    """S4: in delta mode every run's checkpoints say so, the conversation survives past the
    snapshot frequency, and a rollback restores it exactly."""
    with httpx.Client(base_url=delta.url, headers={"x-api-key": ALICE}, timeout=60) as client:
        tid = client.post("/threads", json={}).json()["thread_id"]
        for i in range(5):
            _wait(client, tid, f"turn {i}")
        state = client.get(f"/threads/{tid}/state").json()
        humans = [m["content"] for m in state["values"]["messages"] if m["type"] == "human"]
        assert humans == [f"turn {i}" for i in range(5)]
        assert len(state["values"]["messages"]) == 10
        history = client.post(f"/threads/{tid}/history", json={"limit": 100}).json()
        assert {h["metadata"]["threadrun_checkpoint_mode"] for h in history} == {"delta"}
        body = {
            "assistant_id": "lead_agent",
            "input": {"messages": [{"role": "user", "content": "undo me"}]},
            "config": {"configurable": {"tokens": 400, "token_delay_ms": 10}},
        }
        run = client.post(f"/threads/{tid}/runs", json=body).json()
        with open_stream(client, tid, run["run_id"], last_event_id=None) as live:
            for event in iter_sse(live.iter_lines()):
                if event.event.startswith("values"):
                    break  # the run has written its input checkpoint
        cancel = client.post(
            f"/threads/{tid}/runs/{run['run_id']}/cancel", params={"action": "rollback", "wait": 1}
        )
        assert cancel.status_code == 200 and cancel.json()["status"] == "interrupted"
        after = client.get(f"/threads/{tid}/state").json()
        assert after["values"]["messages"] == state["values"]["messages"]
    with psycopg.connect(delta.settings.dsn) as conn:
        row = conn.execute("SELECT mode, snapshot_every FROM threadrun_checkpoint_mode").fetchone()
    assert row == ("delta", 3)


def test_s4_a_process_in_another_mode_refuses_to_start(delta: Cluster) -> None:
    """S4: a web process started in full mode against the delta deployment's database exits
    with a message that says how to migrate, instead of serving delta threads as empty."""
    env = {**delta.env, "THREADRUN_CHECKPOINT_MODE": "full"}
    proc = subprocess.run(
        [sys.executable, "-c", "from app import create_app; create_app()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "CheckpointModeRecordMismatch" in proc.stderr
    assert "migrate --to delta" in proc.stderr
