"""`durability` (`sync` | `async` | `exit`, LangGraph's own meaning) end to end (L5, R1, B2).

Recorded on the run (`kwargs.durability`, as the official server shows it) whatever path
admitted it: runs.create / stream / wait through the official SDK, a stateless run, a batch,
a WebSocket `run.create`, a cron's firing, an assistant's default (`config.durability`), the
deprecated `checkpoint_during`; a bad value is a 422 (an `error` frame) naming the field.

Then the owner of a five-step run (tests/e2e/durability_graph.py) is killed (-9) as the run's
fourth step starts, under each mode, and the other worker finishes the run (attempt 2):
`sync` resumes after the third step's checkpoint, `async` too or one step earlier (its
checkpoint may still have been in flight), `exit` from the checkpoint before the run, so the
thread's state is exactly the pre-run state plus one run's result, never a mix. The stream
replays the same events every time, one `end` last. docs/guarantees.md states the rule.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient

from shared.tools.testing import Cluster, read_stream
from tests.e2e.conftest import ClusterFactory
from tests.e2e.conftest import run_sdk as run
from tests.e2e.durability_graph import STEPS
from tests.e2e.test_crons_e2e import EVERY_SECOND, FAST_CRONS
from tests.e2e.test_faults import (
    FAST,
    api,
    assert_one_outcome,
    assert_single_end,
    checkpoint_ids,
    run_row,
    sql,
    terminal_status,
    wait_for,
)
from tests.e2e.test_ws import WS

pytestmark = pytest.mark.e2e

GRAPH, FANOUT = "steps", "fanout"
STEP_S = 1.0
"""Each step's pause: the kill lands while the fourth step sleeps, long after the third
step's checkpoint write started (a few ms)."""


@pytest.fixture(scope="module")
def steps(
    private_cluster: ClusterFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A web process, two runs workers and the cron scheduler serving the steps graph, with
    short leases (a killed owner's run is taken over within seconds) and fast cron ticks."""
    project = tmp_path_factory.mktemp("durability-project") / "langgraph.json"
    here = Path(__file__).resolve().parent
    module = here / "durability_graph.py"
    agent = here.parents[1] / "shared" / "agent" / "lead_agent.py"
    graphs = {GRAPH: f"{module}:graph", FANOUT: f"{module}:fanout", "lead_agent": f"{agent}:graph"}
    project.write_text(json.dumps({"graphs": graphs}))
    env = {**FAST, **FAST_CRONS, "THREADRUN_CONFIG": str(project)}
    with private_cluster("durability", env) as c:
        c.side_by_side(
            c.start_web,
            lambda: c.start_worker("w1", concurrency=4),
            lambda: c.start_worker("w2", concurrency=4),
            c.start_scheduler,
        )
        yield c


def body(durability: str | None = None, *, step_s: float = 0, trace: Path | None = None,
         first: str = "in", **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A run of the steps graph."""
    configurable: dict[str, Any] = {"step_s": step_s}
    if trace is not None:
        configurable["trace"] = str(trace)
    out = {
        "assistant_id": GRAPH,
        "input": {"log": [first]},
        "stream_mode": ["values", "updates"],
        "config": {"configurable": configurable},
        **extra,
    }
    if durability is not None:
        out["durability"] = durability
    return out


def recorded(client: httpx.Client, tid: str, run_id: str) -> Any:
    """The `durability` GET /threads/{id}/runs/{run_id} shows."""
    res = client.get(f"/threads/{tid}/runs/{run_id}")
    assert res.status_code == 200, res.text
    return res.json()["kwargs"]["durability"]


def test_l5_durability_is_recorded_on_every_path(steps: Cluster) -> None:
    """L5, R1: every run-creating call records the durability it asked for (or its
    assistant's, or LangGraph's `async`) in the run's kwargs; the mode reaches the graph
    (an `exit` run commits one checkpoint, a `sync` one a checkpoint per step)."""

    async def sdk(client: LangGraphClient) -> dict[str, Any]:
        tid = (await client.threads.create())["thread_id"]
        made = await client.runs.create(tid, GRAPH, input={"log": ["a"]}, durability="exit")
        await client.runs.join(tid, made["run_id"])
        waited = await client.runs.wait(tid, GRAPH, input={"log": ["b"]}, durability="sync")
        streamed = [
            part.event
            async for part in client.runs.stream(
                tid, GRAPH, input={"log": ["c"]}, durability="async"
            )
        ]
        mine = await client.assistants.create(GRAPH, config={"durability": "exit"})
        on_default = await client.runs.create(tid, mine["assistant_id"], input={"log": ["d"]})
        await client.runs.join(tid, on_default["run_id"])
        overridden = await client.runs.create(
            tid, mine["assistant_id"], input={"log": ["e"]}, durability="sync"
        )
        await client.runs.join(tid, overridden["run_id"])
        stateless = await client.runs.create(None, GRAPH, input={"log": ["f"]}, durability="exit")
        runs = await client.runs.list(tid, limit=10)
        return {
            "tid": tid,
            "made": made["run_id"],
            "waited": waited,
            "streamed": streamed,
            "assistant": dict(mine),
            "on_default": on_default["run_id"],
            "overridden": overridden["run_id"],
            "stateless": dict(stateless),
            "runs": {r["run_id"]: r["kwargs"]["durability"] for r in runs},
        }

    got = run(sdk, steps.url)
    tid = got["tid"]
    assert got["assistant"]["config"]["durability"] == "exit"
    assert got["stateless"]["kwargs"]["durability"] == "exit"
    assert "values" in got["streamed"] and got["waited"]["log"]
    assert sorted(got["runs"].values()) == ["async", "exit", "exit", "sync", "sync"]
    with api(steps.url) as client:
        assert recorded(client, tid, got["made"]) == "exit"
        assert recorded(client, tid, got["on_default"]) == "exit"  # the assistant's default
        assert recorded(client, tid, got["overridden"]) == "sync"  # the run's own wins
        # LangGraph's default, and the deprecated checkpoint_during mapped onto durability
        for extra, want in (({}, "async"), ({"checkpoint_during": False}, "exit"),
                            ({"checkpoint_during": True}, "async")):  # fmt: skip
            res = client.post(f"/threads/{tid}/runs/wait", json=body(None, **extra))
            assert res.status_code == 200, res.text
            last = client.get(f"/threads/{tid}/runs", params={"limit": 1}).json()[0]
            assert last["kwargs"]["durability"] == want, (extra, last["kwargs"])
            assert "durability" not in last["kwargs"]["config"]
        batch = client.post(
            "/runs/batch",
            json=[{**body("exit"), "thread_id": tid}, body("sync"), body()],
        )
        assert batch.status_code == 200, batch.text
        assert [r["kwargs"]["durability"] for r in batch.json()] == ["exit", "sync", "async"]
        # The mode reaches the graph: five steps commit one checkpoint under `exit`, and
        # the input's, START's and one per step under `sync`.
        counts = {}
        for mode in ("exit", "sync"):
            fresh = client.post("/threads", json={}).json()["thread_id"]
            res = client.post(f"/threads/{fresh}/runs/wait", json=body(mode))
            assert res.status_code == 200 and res.json()["log"] == ["in", *STEPS], res.text
            counts[mode] = len(checkpoint_ids(steps.settings.dsn, fresh))
        assert counts == {"exit": 1, "sync": len(STEPS) + 2}

    with WS(steps.url) as ws:
        frame = {
            "type": "run.create",
            "request_id": 1,
            "thread_id": tid,
            **body("exit", multitask_strategy="enqueue"),  # the batch's run may be running
        }
        created = ws.request(frame)
        assert created["type"] == "run.created", created
        assert created["run"]["kwargs"]["durability"] == "exit"
        bad = ws.request({**frame, "durability": "later"})
        assert bad["type"] == "error" and bad["field"] == "durability", bad

    # The thread streaming protocol's run.start has no durability of its own: its config's.
    with api(steps.url) as client:
        params = {"assistant_id": GRAPH, "input": {"log": ["p"]}, "config": {"durability": "exit"}}
        res = client.post(
            f"/threads/{tid}/commands", json={"id": 1, "method": "run.start", "params": params}
        )
        assert res.status_code == 200 and res.json()["type"] == "success", res.text
        assert recorded(client, tid, res.json()["result"]["run_id"]) == "exit"
        params["config"] = {"durability": "never"}
        res = client.post(
            f"/threads/{tid}/commands", json={"id": 2, "method": "run.start", "params": params}
        )
        assert res.json()["error"] == "invalid_argument" and "durability" in res.json()["message"]

    # A cron's payload keeps the mode, and each firing's run records it.
    async def cron(client: LangGraphClient) -> dict[str, Any]:
        made = await client.crons.create_for_thread(
            tid, GRAPH, schedule=EVERY_SECOND, input={"log": ["tick"]}, durability="exit",
            multitask_strategy="enqueue",
        )  # fmt: skip
        return dict(made)

    made = run(cron, steps.url)
    assert made["payload"]["durability"] == "exit"
    with api(steps.url) as client:
        fired = wait_for(
            lambda: [
                r
                for r in client.get(f"/threads/{tid}/runs", params={"limit": 50}).json()
                if r["metadata"].get("cron_id") == made["cron_id"]
            ],
            30,
            "a run fired by the cron",
            steps,
        )
        patched = client.patch(f"/runs/crons/{made['cron_id']}", json={"durability": "x"})
        assert patched.status_code == 422 and patched.json()["field"] == "durability"
        patched = client.patch(f"/runs/crons/{made['cron_id']}", json={"durability": "sync"})
        assert patched.status_code == 200 and patched.json()["payload"]["durability"] == "sync"
        assert client.delete(f"/runs/crons/{made['cron_id']}").status_code in (200, 204)
        assert fired[0]["kwargs"]["durability"] == "exit"


@pytest.mark.parametrize(
    ("where", "payload", "field"),
    [
        ("/threads/{tid}/runs", body("eventually"), "durability"),
        ("/threads/{tid}/runs/stream", body("SYNC"), "durability"),
        ("/runs/wait", body("always"), "durability"),
        ("/runs/batch", [body("later")], "durability"),
        ("/threads/{tid}/runs/crons", {**body("1"), "schedule": "0 * * * *"}, "durability"),
        ("/assistants", {"graph_id": GRAPH, "config": {"durability": "x"}}, "config.durability"),
    ],
)
def test_l5_bad_durability_is_422_naming_the_field(
    steps: Cluster, where: str, payload: Any, field: str
) -> None:
    """L5: a durability that is not sync, async or exit is refused (422) naming the field."""
    with api(steps.url) as client:
        tid = client.post("/threads", json={}).json()["thread_id"]
        res = client.post(where.format(tid=tid), json=payload)
        assert res.status_code == 422, res.text
        assert res.json()["field"].endswith(field), res.json()
        assert client.get(f"/threads/{tid}/runs").json() == []


# --------------------------------------------------------------------------------------
# kill -9 mid-run under each mode
# --------------------------------------------------------------------------------------

REDONE = {
    "sync": ({"s1": 1, "s2": 1, "s3": 1, "s4": 2, "s5": 1},),
    "async": (
        {"s1": 1, "s2": 1, "s3": 1, "s4": 2, "s5": 1},
        {"s1": 1, "s2": 1, "s3": 2, "s4": 2, "s5": 1},  # s3's checkpoint was in flight
    ),
    "exit": ({"s1": 2, "s2": 2, "s3": 2, "s4": 2, "s5": 1},),
}
"""How many times each step ran when the owner was killed as s4 started."""
NEW_CHECKPOINTS = {"sync": len(STEPS) + 2, "async": len(STEPS) + 2, "exit": 1}
"""Checkpoints the killed run leaves on its thread: the input's, START's and one per step, each once
(attempt 2 writes only those attempt 1 had not), or under `exit` only the final one."""


def owner_pid(c: Cluster, run_id: str) -> int:
    owner = run_row(c.settings.dsn, run_id)["owner"]
    assert owner, "the run has no owner"
    return int(str(owner).split(":")[1])


def executions(trace: Path) -> dict[str, int]:
    return dict(collections.Counter(trace.read_text().split()))


@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
def test_l5_kill_9_mid_run_loses_what_its_durability_allows(
    steps: Cluster, tmp_path: Path, mode: str
) -> None:
    """L5, L4, R1, B2: the owner is killed as step 4 of 5 starts; attempt 2 on the other
    worker resumes from the last checkpoint its durability committed (`exit`: the one
    before the run), the thread's state is the pre-run state plus exactly one run's
    result, and the stream replays identically with one `end`."""
    dsn = steps.settings.dsn
    trace = tmp_path / "trace"
    trace.touch()
    with api(steps.url) as client:
        tid = client.post("/threads", json={}).json()["thread_id"]
        res = client.post(f"/threads/{tid}/runs/wait", json=body("sync", first="before"))
        assert res.status_code == 200, res.text
        pre_values = client.get(f"/threads/{tid}/state").json()["values"]
        pre_checkpoints = checkpoint_ids(dsn, tid)

        res = client.post(f"/threads/{tid}/runs", json=body(mode, step_s=STEP_S, trace=trace))
        assert res.status_code == 200, res.text
        run_id = res.json()["run_id"]
        wait_for(lambda: "s4" in trace.read_text().split(), 30, "step 4 to start", steps)
        pid = owner_pid(steps, run_id)
        os.kill(pid, signal.SIGKILL)
        steps.process(pid).popen.wait(timeout=10)

        wait_for(lambda: terminal_status(dsn, run_id), 60, "attempt 2 to finish", steps)
        assert assert_one_outcome(dsn, run_id) == "success"
        row = client.get(f"/threads/{tid}/runs/{run_id}").json()
        assert row["attempt"] == 2 and row["kwargs"]["durability"] == mode, row
        assert executions(trace) in REDONE[mode], executions(trace)

        state = client.get(f"/threads/{tid}/state").json()
        assert state["values"]["log"] == [*pre_values["log"], "in", *STEPS], state["values"]
        assert state["next"] == [] and state["tasks"] == []
        new = checkpoint_ids(dsn, tid) - pre_checkpoints
        assert len(new) == NEW_CHECKPOINTS[mode], sorted(new)
        assert pre_checkpoints <= checkpoint_ids(dsn, tid)

        events = read_stream(client, tid, run_id)
        assert_single_end(events, "success")
        metas = [e for e in events if e.event == "metadata"]
        assert ['"attempt":1' in metas[0].text, '"attempt":2' in metas[1].text] == [True, True]
        again = read_stream(client, tid, run_id)
        assert [(e.id, e.event, e.text) for e in again] == [(e.id, e.event, e.text) for e in events]
        last_values = [e for e in events if e.event == "values"][-1]
        assert json.loads(last_values.text) == state["values"]
        middle = events[len(events) // 2]
        tail = read_stream(client, tid, run_id, middle.id)
        assert [e.id for e in tail] == [e.id for e in events[len(events) // 2 + 1 :]]
    steps.start_worker(f"w-{mode}", concurrency=4)  # keep two workers for the next test


FANOUT_REDONE = {
    "sync": {"fast": 1, "slow": 2},
    "async": {"fast": 1, "slow": 2},
    "exit": {"fast": 2, "slow": 2},
}
"""How many times each task of the one step ran when the owner was killed during `slow`."""


def fast_writes(dsn: str, tid: str) -> int:
    """The pending-write rows the `fast` task committed on the thread."""
    rows = sql(
        dsn,
        "SELECT count(*) AS n FROM checkpoint_writes WHERE thread_id = %s AND task_path LIKE %s",
        (tid, "%fast"),
    )
    return int(rows[0]["n"])


@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
def test_l5_kill_9_beside_a_finished_task_keeps_only_committed_writes(
    steps: Cluster, tmp_path: Path, mode: str
) -> None:
    """L5, L2: one step of two tasks, the owner killed while `slow` runs after `fast` ended.
    Under `sync` and `async` fast's writes were committed on their own (held writes no
    checkpoint followed, shared/state/held_writes.py) and attempt 2 runs only `slow`; under
    `exit` nothing of the attempt was written and both run again. Either way the thread's
    state is the pre-run state plus one run's result."""
    dsn = steps.settings.dsn
    trace = tmp_path / "trace"
    trace.touch()
    with api(steps.url) as client:
        tid = client.post("/threads", json={}).json()["thread_id"]
        pre = body("sync", first="before", assistant_id=FANOUT)
        assert client.post(f"/threads/{tid}/runs/wait", json=pre).status_code == 200
        pre_log = client.get(f"/threads/{tid}/state").json()["values"]["log"]
        before = fast_writes(dsn, tid)

        res = client.post(
            f"/threads/{tid}/runs",
            json=body(mode, step_s=STEP_S, trace=trace, assistant_id=FANOUT),
        )
        assert res.status_code == 200, res.text
        run_id = res.json()["run_id"]
        if mode == "exit":
            wait_for(lambda: {"fast", "slow"} <= set(trace.read_text().split()), 30, "both tasks")
            time.sleep(0.5)  # past the held writes' linger: under sync fast's would be written
            assert fast_writes(dsn, tid) == before  # `exit` writes nothing before the end
        else:
            wait_for(lambda: fast_writes(dsn, tid) > before, 30, "fast's writes", steps)
        pid = owner_pid(steps, run_id)
        os.kill(pid, signal.SIGKILL)
        steps.process(pid).popen.wait(timeout=10)

        wait_for(lambda: terminal_status(dsn, run_id), 60, "attempt 2 to finish", steps)
        assert assert_one_outcome(dsn, run_id) == "success"
        assert executions(trace) == FANOUT_REDONE[mode], executions(trace)
        state = client.get(f"/threads/{tid}/state").json()
        assert state["values"]["log"] == [*pre_log, "in", *pre_log[1:]], state["values"]
        assert state["next"] == [] and state["tasks"] == []
        events = read_stream(client, tid, run_id)
        assert_single_end(events, "success")
        again = read_stream(client, tid, run_id)
        assert [(e.id, e.text) for e in again] == [(e.id, e.text) for e in events]
    steps.start_worker(f"w-fanout-{mode}", concurrency=4)  # keep two workers


@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
def test_r5_l5_a_stop_keeps_the_question_and_the_partial_answer_under_each_mode(
    steps: Cluster, mode: str
) -> None:
    """R5, L5: cancel(interrupt) mid-answer under each mode: LangGraph commits what the run
    did as it stops (under `exit` too: its one checkpoint is written on the way out), so the
    stopped answer lands after its question, never on the pre-run state alone."""

    async def scenario(c: LangGraphClient) -> tuple[list[Any], Any]:
        tid = (await c.threads.create())["thread_id"]
        knobs = {"configurable": {"tokens": 400, "token_delay_ms": 10}}
        r = await c.runs.create(
            tid,
            "lead_agent",
            input={"messages": [{"role": "user", "content": "long"}]},
            config=knobs,  # type: ignore[arg-type]
            stream_mode=["messages-tuple"],
            durability=mode,  # type: ignore[arg-type]
        )
        chunks = 0
        async for part in c.runs.join_stream(tid, r["run_id"], last_event_id="-1"):
            chunks += part.event == "messages"
            if chunks >= 10:
                break
        await c.runs.cancel(tid, r["run_id"], wait=True, action="interrupt")
        state = await c.threads.get_state(tid)
        got = await c.runs.get(tid, r["run_id"])
        return state["values"]["messages"], got  # type: ignore[index, call-overload]

    msgs, got = run(scenario, steps.url)
    assert got["status"] == "interrupted" and got["kwargs"]["durability"] == mode
    assert [m["type"] for m in msgs] == ["human", "ai"], msgs
    assert msgs[1]["response_metadata"]["stopped"] is True
