"""H2: a run ends with the cause of its last attempt, not a generic lease expiry.

A private cluster whose web serves the default graphs and whose only runs worker serves
another graphs file (the approval graph alone): a run of `lead_agent` reaches a worker that
does not serve its graph.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.runs.model import TERMINAL_STATUSES
from shared.tools.testing import Cluster, read_stream, wait_for
from shared.tools.testing.cluster import worker_argv
from tests.e2e.conftest import ALICE, FAST_LEASES, ClusterFactory

pytestmark = pytest.mark.e2e

APPROVAL = Path(__file__).resolve().parents[1] / "graphs" / "approval.py"


@pytest.fixture(scope="module")
def causes(
    private_cluster: ClusterFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Web serving lead_agent; one runs worker serving only `approval`."""
    config = tmp_path_factory.mktemp("other-graphs") / "langgraph.json"
    config.write_text(json.dumps({"graphs": {"approval": f"{APPROVAL}:graph"}}))
    with private_cluster("opscauses", dict(FAST_LEASES)) as c:
        c.start_web()
        env = {"THREADRUN_CONFIG": str(config), "THREADRUN_WORKER_CONCURRENCY": "4"}
        proc = c.spawn("other", worker_argv("other", 4), env, role="worker")
        c.wait_log(proc, "ready.")
        yield c


def test_h2_a_run_of_an_unserved_graph_fails_at_once_with_graph_not_found(causes: Cluster) -> None:
    """H2: a run whose graph the worker does not serve ends `error` with `GraphNotFound`
    (GET /runs/{id} and the stream's `error` event) after one attempt."""
    with httpx.Client(base_url=causes.url, headers={"x-api-key": ALICE}, timeout=30) as user:
        tid = user.post("/threads", json={}).json()["thread_id"]
        body = {
            "assistant_id": "lead_agent",
            "input": {"messages": [{"role": "user", "content": "hi"}]},
        }
        run_id = user.post(f"/threads/{tid}/runs", json=body).json()["run_id"]
        events = read_stream(user, tid, run_id, within=60)
        run = wait_for(
            lambda: (
                (r := user.get(f"/threads/{tid}/runs/{run_id}").json())["status"]
                in TERMINAL_STATUSES
                and r
            ),
            60,
            what="the run to end",
        )
    assert run["status"] == "error" and run["error"]["error"] == "GraphNotFound", run
    assert "lead_agent" in run["error"]["message"]
    assert run["attempt"] == 1, run  # failed at once, never retried
    errors = [e.data for e in events if e.event == "error"]
    assert [e["error"] for e in errors] == ["GraphNotFound"], events
    assert [e.data["attempt"] for e in events if e.event == "metadata"] == [1]
    assert events[-1].event == "end" and events[-1].data["status"] == "error"
