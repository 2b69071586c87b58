"""The ops view, /metrics, JSON logs and Flower against real processes.

One private cluster: a web process and one Celery worker consuming both queues, short
leases, JSON logs, an ops key (`key-ops:ops-user:ops`) beside the user keys, and its own
metrics directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.db import make_pool
from shared.runs.model import TERMINAL_STATUSES
from shared.runs.store import RunStore
from shared.runs.taskqueue import RUN_TASK
from shared.settings import Settings
from shared.tools.testing import Cluster, free_port, settings_env, wait_for
from tests.e2e.conftest import ALICE, API_KEYS, FAST_LEASES, ClusterFactory

pytestmark = pytest.mark.e2e

OPS = "key-ops"
FLOWER_AUTH = "flower:flower-pw"
CONTRACT = {
    "threadrun_runs": "gauge",
    "threadrun_runs_stuck": "gauge",
    "threadrun_fenced_writes": "counter",
    "threadrun_queue_depth": "gauge",
    "threadrun_queue_oldest_age_seconds": "gauge",
    "threadrun_workers_online": "gauge",
    "threadrun_stream_gaps": "counter",
    "threadrun_connections_open": "gauge",
    "threadrun_memory_backlog": "gauge",
    "threadrun_memory_updates_skipped": "counter",
    "threadrun_tokens": "counter",
    "threadrun_run_duration_seconds": "histogram",
    "threadrun_runs_started": "counter",
    "threadrun_runs_finished": "counter",
}


@pytest.fixture(scope="module")
def ops_cluster(
    private_cluster: ClusterFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Web + one worker on both queues, with an ops key and JSON logs."""
    env = {
        **FAST_LEASES,
        "THREADRUN_API_KEYS": f"{API_KEYS},{OPS}:ops-user:ops",
        "THREADRUN_LOG_FORMAT": "json",
        "THREADRUN_METRICS_DIR": str(tmp_path_factory.mktemp("prom")),
        "THREADRUN_OPS_REPORT_S": "0.5",
        "THREADRUN_OPS_INSPECT_CACHE_S": "0",
        "THREADRUN_FLOWER_BASIC_AUTH": FLOWER_AUTH,
        "THREADRUN_WORKER_METRICS_PORT": str(free_port()),
    }
    with private_cluster("ops", env) as c:
        c.env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # its own THREADRUN_METRICS_DIR instead
        c.side_by_side(
            c.start_web, lambda: c.start_worker("ops", queues="runs,runs.background,memory")
        )
        yield c


@pytest.fixture(scope="module")
def store(ops_cluster: Cluster) -> Iterator[RunStore]:
    pool = make_pool(ops_cluster.settings, name="test-ops", max_size=2)
    yield RunStore(pool)
    pool.close()


def client(c: Cluster, key: str | None = OPS) -> httpx.Client:
    headers = {"x-api-key": key} if key else {}
    return httpx.Client(base_url=c.url, headers=headers, timeout=30)


def new_run(c: Cluster, tokens: int = 5, delay_ms: int = 0, thread: str | None = None) -> dict:
    with client(c, ALICE) as http:
        tid = thread or http.post("/threads", json={}).json()["thread_id"]
        body = {
            "assistant_id": "lead_agent",
            "input": {"messages": [{"role": "user", "content": "ops"}]},
            "config": {"configurable": {"tokens": tokens, "token_delay_ms": delay_ms}},
        }
        res = http.post(f"/threads/{tid}/runs", json=body)
        assert res.status_code == 200, res.text
        return {"thread_id": tid, **res.json()}


def wait_status(store: RunStore, run_id: str, statuses: frozenset[str] = TERMINAL_STATUSES) -> str:
    return str(
        wait_for(
            lambda: (store.run_status(run_id) in statuses) and store.run_status(run_id),
            30,
            what=f"run {run_id} to reach {sorted(statuses)}",
        )
    )


def test_ops_api_and_page_need_the_ops_role(ops_cluster: Cluster) -> None:
    """A4 for ops: no key 401, a user key 403, the ops key 200 (API, page and `?api_key=`)."""
    with client(ops_cluster, None) as anon:
        assert anon.get("/ops/api/overview").status_code == 401
        assert anon.get("/ops").status_code == 401
    with client(ops_cluster, ALICE) as alice:
        for path in ("/ops/api/overview", "/ops/api/runs", "/ops/api/audit", "/ops"):
            res = alice.get(path)
            assert res.status_code == 403, (path, res.text)
            assert res.json()["error"] == "forbidden"
        assert (
            alice.post(f"/ops/api/runs/{'0' * 8}-0000-0000-0000-{'0' * 12}/cancel").status_code
            == 403
        )
    with client(ops_cluster, None) as anon:
        page = anon.get("/ops", params={"api_key": OPS})
        assert page.status_code == 200
        assert "threadrun ops" in page.text
        assert "script-src 'self'" in page.headers["Content-Security-Policy"]
        assert anon.get("/ops/static/ops.js").status_code == 200
        assert anon.get("/ops/static/../ops.html").status_code == 404


def test_ops_bad_input_is_a_4xx_naming_the_field(ops_cluster: Cluster) -> None:
    """A3 on the ops API: a bad id, status or body is a 4xx naming the field, never a 500."""
    with client(ops_cluster) as ops:
        res = ops.post("/ops/api/runs/not-a-uuid/cancel")
        assert res.status_code == 422 and res.json()["field"] == "run_id"
        res = ops.get("/ops/api/runs", params={"status": "bogus"})
        assert res.status_code == 422 and res.json()["field"] == "status"
        rid = "7d0f3c4e-0000-4000-8000-000000000000"
        res = ops.post(f"/ops/api/runs/{rid}/cancel", json={"action": "explode"})
        assert res.status_code == 422 and res.json()["field"] == "action"
        res = ops.post(f"/ops/api/runs/{rid}/requeue", json={"reason": ""})
        assert res.status_code == 422 and res.json()["field"] == "reason"
        assert ops.post(f"/ops/api/runs/{rid}/requeue").status_code == 404
        assert ops.get(f"/ops/api/runs/{rid}").status_code == 404


def test_overview_shows_runs_queues_workers_tokens_and_memory(
    ops_cluster: Cluster, store: RunStore
) -> None:
    """The overview after a finished run: by status, queues, workers on both queues, tokens."""
    run = new_run(ops_cluster)
    assert wait_status(store, run["run_id"]) == "success"
    with client(ops_cluster) as ops:
        o = ops.get("/ops/api/overview").json()
    assert o["runs"]["by_status"]["success"] >= 1
    assert set(o["queues"]) == {"runs", "memory", "webhooks"}
    for q in o["queues"].values():
        assert q["depth"] >= 0
    names = [w["name"] for w in o["workers"]]
    assert any(n.startswith("ops-") for n in names), names
    worker = next(w for w in o["workers"] if w["name"].startswith("ops-"))
    assert worker["queues"] == ["memory", "runs", "runs.background"]
    assert o["workers_online"] == {"runs": 1, "memory": 1, "webhooks": 0, "runs.background": 1}
    assert o["memory"]["available"] is True and "backlog" in o["memory"]
    assert len(o["tokens_per_hour"]) == ops_cluster.settings.ops_token_hours
    assert sum(h["output"] for h in o["tokens_per_hour"]) >= 5
    detail = client(ops_cluster).get(f"/ops/api/runs/{run['run_id']}").json()
    assert detail["status"] == "success" and detail["attempt"] == 1
    assert detail["owner_epoch"] == 1 and detail["lease"]["held"] is False
    assert detail["stream"]["length"] > 0


def test_inflight_run_lease_stream_and_sse_subscriber(
    ops_cluster: Cluster, store: RunStore
) -> None:
    """A running run shows owner/epoch/lease time left/attempt; an SSE join is counted as an
    open connection and as a subscriber of the run's stream."""
    run = new_run(ops_cluster, tokens=1000, delay_ms=20)  # runs until cancelled at the end
    rid, tid = run["run_id"], run["thread_id"]
    wait_status(store, rid, frozenset({"running"}))
    with (
        client(ops_cluster, ALICE) as alice,
        alice.stream(
            "GET", f"/threads/{tid}/runs/{rid}/stream", headers={"Last-Event-ID": "-1"}
        ) as sse,
    ):
        next(sse.iter_lines())  # the stream is open
        with client(ops_cluster) as ops:

            def seen() -> dict | None:
                o = ops.get("/ops/api/overview").json()
                stream = next((s for s in o["streams"] if s["run_id"] == rid), None)
                ok = o["connections"]["open"]["sse"] >= 1 and stream and stream["subscribers"] >= 1
                return o if ok else None

            o = wait_for(seen, 10, what="the SSE connection in the ops view")
        mine = next(r for r in o["runs"]["inflight"] if r["run_id"] == rid)
        assert mine["status"] == "running" and mine["user_id"] == "alice"
        assert mine["owner"].count(":") == 2 and mine["attempt"] == 1
        assert mine["lease"]["held"] and mine["lease"]["epoch"] == mine["owner_epoch"]
        assert 0 < mine["lease"]["ttl_s"] <= 3
        worker = next(w for w in o["workers"] if w["name"].startswith("ops-"))
        assert rid in worker["active_runs"]
        with client(ops_cluster) as ops:
            streams = ops.get("/ops/api/streams").json()
            mine_s = next(s for s in streams["streams"] if s["run_id"] == rid)
            assert mine_s["length"] > 0 and mine_s["subscribers"] >= 1
            assert streams["connections"]["web_processes"] == 1
            # A Celery inspect broadcast can miss its timeout on a loaded machine (it then
            # counts nobody): ask again rather than read one broadcast as the truth.
            workers = wait_for(
                lambda: (w := ops.get("/ops/api/workers").json())["online"]["runs"] and w,
                20,
                what="the worker in /ops/api/workers",
            )
            assert workers["online"] == {
                "runs": 1,
                "memory": 1,
                "webhooks": 0,
                "runs.background": 1,
            }
            assert rid in workers["workers"][0]["active_runs"]
            assert set(ops.get("/ops/api/queues").json()) == {"runs", "memory", "webhooks"}
    with client(ops_cluster) as ops:
        ops.post(f"/ops/api/runs/{rid}/cancel")
    wait_status(store, rid)


def test_cancel_is_audited(ops_cluster: Cluster, store: RunStore) -> None:
    """Ops cancel of alice's running run: requested, the run ends interrupted, audit lists it."""
    run = new_run(ops_cluster, tokens=200, delay_ms=20)
    rid = run["run_id"]
    wait_status(store, rid, frozenset({"running"}))
    with client(ops_cluster) as ops:
        res = ops.post(f"/ops/api/runs/{rid}/cancel", json={"action": "interrupt"})
        assert res.status_code == 200, res.text
        assert res.json()["outcome"] == "requested" and res.json()["ok"] is True
        assert wait_status(store, rid) == "interrupted"
        again = ops.post(f"/ops/api/runs/{rid}/cancel").json()
        assert again["outcome"] == "already_done" and again["ok"] is False
        audit = ops.get("/ops/api/audit", params={"run_id": rid}).json()["audit"]
    assert [(a["action"], a["result"], a["actor"]) for a in audit] == [
        ("cancel", "already_done", "ops-user"),
        ("cancel", "requested", "ops-user"),
    ]
    assert audit[1]["params"] == {"action": "interrupt"}
    assert audit[1]["detail"]["status_before"] == "running"


def test_requeue_only_stuck_runs_and_audit(ops_cluster: Cluster, store: RunStore) -> None:
    """Requeue refuses a run whose lease is held, a run queued behind another run of its
    thread (waiting its turn, R3, not stuck) and a finished run (409, audited)."""
    first = new_run(ops_cluster, tokens=200, delay_ms=20)
    rid, tid = first["run_id"], first["thread_id"]
    wait_status(store, rid, frozenset({"running"}))
    queued = new_run(ops_cluster, tokens=3, thread=tid)  # enqueue: waits behind `first`
    with client(ops_cluster) as ops:
        held = ops.post(f"/ops/api/runs/{rid}/requeue", json={"reason": "test"})
        assert held.status_code == 409 and held.json()["outcome"] == "lease_held"
        res = ops.post(f"/ops/api/runs/{queued['run_id']}/requeue")
        assert res.status_code == 409 and res.json()["outcome"] == "queued_behind"
        assert store.run_status(queued["run_id"]) == "pending"
        ops.post(f"/ops/api/runs/{rid}/cancel")
        assert wait_status(store, queued["run_id"]) == "success"
        done = ops.post(f"/ops/api/runs/{rid}/requeue")
        assert done.status_code == 409 and done.json()["outcome"] == "not_inflight"
        audit = ops.get("/ops/api/audit", params={"run_id": rid}).json()["audit"]
    assert [a["result"] for a in audit if a["action"] == "requeue"] == [
        "not_inflight",
        "lease_held",
    ]


def test_requeue_of_a_run_whose_owner_froze(ops_cluster: Cluster, store: RunStore) -> None:
    """L4 by hand: the only worker is frozen (so no reaper runs), its lease expires, the run
    shows as stuck; ops requeues it; once thawed the old attempt is fenced and a new attempt
    finishes the run."""
    run = new_run(ops_cluster, tokens=60, delay_ms=40)
    rid = run["run_id"]
    wait_status(store, rid, frozenset({"running"}))
    running = store.get_run_by_id(rid)
    assert running is not None and running.owner is not None
    pid = int(running.owner.split(":")[1])
    freeze_outside_a_transaction(pid, ops_cluster.settings)
    try:
        with client(ops_cluster) as ops:

            def stuck() -> dict | None:
                o = ops.get("/ops/api/runs").json()
                mine = next((r for r in o["runs"] if r["run_id"] == rid), None)
                return o if mine and mine["lease_expired"] and o["summary"]["stuck"] else None

            wait_for(stuck, 15, what="the run to show as stuck")
            res = ops.post(f"/ops/api/runs/{rid}/requeue", json={"reason": "owner frozen"})
            assert res.status_code == 200, res.text
            assert res.json()["outcome"] == "requeued"
            assert res.json()["audit"]["detail"]["epoch"] == 1
            assert store.run_status(rid) == "pending"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_status(store, rid) == "success"
    final = store.get_run_by_id(rid)
    assert final is not None and final.attempt == 2 and final.owner_epoch == 2


def freeze_outside_a_transaction(pid: int, settings: Settings) -> None:
    """SIGSTOP the worker at a moment none of its database sessions is inside a transaction
    (a session frozen mid-transaction keeps its row locks; see the `locked` test)."""
    for _ in range(50):
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.3)
        with psycopg.connect(settings.dsn) as conn:
            row = conn.execute(BUSY_SESSIONS_SQL).fetchone()
        if row is not None and row[0] == 0:
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("the worker was always inside a transaction")


BUSY_SESSIONS_SQL = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND state IN ('active', 'idle in transaction')
"""


def test_actions_on_a_locked_run_answer_locked(ops_cluster: Cluster, store: RunStore) -> None:
    """A transaction holding the run's rows (as an owner frozen mid-write does): ops cancel
    gives up after ops_lock_timeout_s with `locked` (409, audited) instead of hanging."""
    run = new_run(ops_cluster, tokens=1000, delay_ms=50)
    rid = run["run_id"]
    wait_status(store, rid, frozenset({"running"}))
    with psycopg.connect(ops_cluster.settings.dsn) as holder:
        holder.execute("SELECT 1 FROM threads WHERE thread_id = %s FOR UPDATE", [run["thread_id"]])
        with client(ops_cluster) as ops:
            res = ops.post(f"/ops/api/runs/{rid}/cancel")
            assert res.status_code == 409 and res.json()["outcome"] == "locked"
        holder.rollback()
    with client(ops_cluster) as ops:
        assert ops.post(f"/ops/api/runs/{rid}/cancel").json()["outcome"] == "requested"
        audit = ops.get("/ops/api/audit", params={"run_id": rid}).json()["audit"]
    assert [a["result"] for a in audit] == ["requested", "locked"]
    assert wait_status(store, rid) == "interrupted"


def test_metrics_parse_and_have_the_contract(ops_cluster: Cluster, store: RunStore) -> None:
    """GET /metrics parses and exports every metric of the contract, with counts after runs."""
    run = new_run(ops_cluster, tokens=4)
    wait_status(store, run["run_id"])
    with client(ops_cluster, None) as anon:
        res = anon.get("/metrics")
    assert res.status_code == 200
    assert res.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(res.text)}
    for name, kind in CONTRACT.items():
        assert name in families, name
        assert families[name].type == kind, (name, families[name].type)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert samples[("threadrun_runs_started_total", ())] >= 1
    assert samples[("threadrun_runs_finished_total", (("status", "success"),))] >= 1
    assert samples[("threadrun_tokens_total", (("kind", "output"),))] >= 4
    assert samples[("threadrun_run_duration_seconds_count", ())] >= 1
    assert samples[("threadrun_runs", (("status", "success"),))] >= 1
    assert samples[("threadrun_workers_online", (("queue", "runs"),))] == 1
    assert samples[("threadrun_workers_online", (("queue", "memory"),))] == 1
    for sink in ("stream", "status", "checkpoint", "receipt"):
        assert ("threadrun_fenced_writes_total", (("sink", sink),)) in samples
    for transport in ("sse", "ws"):
        assert ("threadrun_connections_open", (("transport", transport),)) in samples
    # The worker serves the same counters itself (k8s scrapes each worker pod).
    port = ops_cluster.env["THREADRUN_WORKER_METRICS_PORT"]
    own = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    names = {f.name for f in text_string_to_metric_families(own.text)}
    assert {"threadrun_runs_started", "threadrun_tokens", "threadrun_fenced_writes"} <= names
    assert "threadrun_queue_depth" not in names  # gauges come from the web processes


def test_worker_logs_are_json_with_run_identities(ops_cluster: Cluster, store: RunStore) -> None:
    """log_format=json: one JSON object per line; a run's lines carry its ids and the worker id."""
    run = new_run(ops_cluster, tokens=3)
    wait_status(store, run["run_id"])
    worker = next(p for p in ops_cluster.procs if p.role == "worker")
    records = []
    for line in worker.log.read_text().splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    mine = [r for r in records if r.get("run_id") == run["run_id"]]
    assert mine, "no log line of the run"
    assert all(r["thread_id"] == run["thread_id"] for r in mine)
    assert any(r.get("attempt") == 1 and r.get("worker_id") for r in mine)
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)


def test_flower_sees_our_workers_with_auth(ops_cluster: Cluster) -> None:
    """Flower starts against our Celery app with basic auth and lists the worker's queues;
    it turns on the task events of a worker started without them (the default) and then
    sees the runs' tasks."""
    from shared.tools.supervisor import flower_env, flower_spec

    port = free_port()
    flower = Settings(flower_port=port, flower_basic_auth=FLOWER_AUTH)  # type: ignore[arg-type]
    proc = ops_cluster.spawn("flower", list(flower_spec(flower).argv), flower_env(flower))
    try:
        url = f"http://127.0.0.1:{port}"
        started = time.monotonic()

        def up() -> bool:
            try:
                return httpx.get(f"{url}/healthcheck", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 10, what="flower to start")
        assert time.monotonic() - started < 10
        assert httpx.get(f"{url}/api/workers", timeout=5).status_code == 401
        auth = tuple(FLOWER_AUTH.split(":"))

        def queues() -> list[str] | None:
            res = httpx.get(f"{url}/api/workers", params={"refresh": 1}, auth=auth, timeout=10)
            assert res.status_code == 200, res.text
            for name, info in res.json().items():
                if name.startswith("ops-") and info.get("active_queues"):
                    return sorted(q["name"] for q in info["active_queues"])
            return None

        assert wait_for(queues, 10, what="flower to list the worker") == [
            "memory",
            "runs",
            "runs.background",
        ]

        def run_task_seen() -> bool:
            new_run(ops_cluster, tokens=1)  # the events of an earlier one may be on their way
            res = httpx.get(f"{url}/api/tasks", auth=auth, timeout=5)
            assert res.status_code == 200, res.text
            return any(t.get("name") == RUN_TASK for t in res.json().values())

        wait_for(run_task_seen, 30, 1, what="flower to turn task events on and see a run")
    finally:
        proc.stop()


def test_ops_page_draws_live_figures_and_cancels(ops_cluster: Cluster, store: RunStore) -> None:
    """The page in headless Chromium: it fills the panels from the API, refreshes live, and
    its cancel button cancels a running run (audited) with no script error."""
    from playwright.sync_api import sync_playwright

    from tests.e2e.test_browser import CHROMIUM, CHROMIUM_ARGS

    run = new_run(ops_cluster, tokens=1000, delay_ms=50)  # runs until cancelled
    rid = run["run_id"]
    wait_status(store, rid, frozenset({"running"}))
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(f"{ops_cluster.url}/ops?api_key={OPS}")
            row = page.locator("#runs tbody tr", has_text=rid[:8])
            row.wait_for(timeout=10_000)
            assert page.locator("#queues tbody tr").count() == 3  # runs, memory, webhooks
            row.locator("button", has_text="cancel").click()
            page.locator("#confirm-yes").click()  # the page asks first
            page.locator("#action-result", has_text="requested").wait_for(timeout=10_000)
            page.locator("#audit tbody tr", has_text="requested").first.wait_for(timeout=10_000)
            first = page.locator("#status").inner_text()
            page.wait_for_function(
                "t => document.getElementById('status').textContent !== t", arg=first
            )  # refreshed live
            assert page.locator("#status").inner_text().startswith("updated")
        finally:
            browser.close()
    assert wait_status(store, rid) == "interrupted"
    assert errors == []


def _metric(c: Cluster, name: str) -> float:
    text = httpx.get(f"{c.url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and not s.labels:
                return float(s.value)
    raise AssertionError(f"{name} not exported")


def test_gaps_sent_are_counted_over_sse_and_ws(ops_cluster: Cluster, store: RunStore) -> None:
    """B5 + metrics: a join on a finished run whose stream expired gets a gap, over SSE and
    over the WebSocket; /metrics and the ops view count both."""
    import redis
    from websockets.sync.client import connect

    from shared.redis_keys import Keys

    run = new_run(ops_cluster, tokens=2)
    rid, tid = run["run_id"], run["thread_id"]
    wait_status(store, rid)
    r = redis.Redis.from_url(ops_cluster.settings.redis_url)
    keys = Keys(ops_cluster.settings.redis_prefix)
    r.delete(keys.stream(rid), keys.stream_meta(rid))  # as if it had expired
    r.close()
    before = _metric(ops_cluster, "threadrun_stream_gaps_total")
    with client(ops_cluster, ALICE) as alice:
        body = alice.get(f"/threads/{tid}/runs/{rid}/stream", headers={"Last-Event-ID": "-1"})
        assert "event: gap" in body.text
    ws_url = ops_cluster.url.replace("http://", "ws://") + f"/threads/{tid}/ws?api_key={ALICE}"
    with connect(ws_url, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "run.join", "run_id": rid, "last_event_id": "-1"}))
        frame = json.loads(ws.recv(timeout=10))
        while frame["type"] not in ("gap", "error", "end"):
            frame = json.loads(ws.recv(timeout=10))
    assert frame["type"] == "gap" and frame["run_id"] == rid, frame
    assert _metric(ops_cluster, "threadrun_stream_gaps_total") == before + 2
    with client(ops_cluster) as ops:
        assert ops.get("/ops/api/overview").json()["gaps_sent_this_host"] == before + 2


def test_cli_status_runs_workers_queues_and_actions(
    ops_cluster: Cluster, store: RunStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """`threadrun status|runs|workers|queues|migrate` against the cluster with the ops key;
    a user key is refused with exit 1."""
    from threadrun.cli import main

    base = ["--url", ops_cluster.url, "--api-key", OPS]
    run = new_run(ops_cluster, tokens=1000, delay_ms=50)
    rid = run["run_id"]
    wait_status(store, rid, frozenset({"running"}))

    assert main(["status", *base]) == 0
    out = capsys.readouterr().out
    assert "running 1" in out and "queue     runs:" in out and "memory    backlog" in out
    assert main(["runs", "list", *base]) == 0
    assert rid in capsys.readouterr().out
    assert main(["runs", "show", rid, *base]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == rid
    assert main(["workers", *base]) == 0
    assert "memory,runs" in capsys.readouterr().out
    assert main(["queues", "--json", *base]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"runs", "memory", "webhooks"}
    assert main(["runs", "requeue", rid, *base]) == 1  # its lease is held
    assert "lease_held" in capsys.readouterr().out
    assert main(["runs", "cancel", rid, *base]) == 0
    assert f"cancel {rid}: requested" in capsys.readouterr().out
    assert main(["status", "--url", ops_cluster.url, "--api-key", ALICE]) == 1
    assert "403" in capsys.readouterr().err
    assert wait_status(store, rid) == "interrupted"
    env = {**os.environ, **settings_env(ops_cluster.settings)}
    done = subprocess.run(
        [sys.executable, "-m", "threadrun", "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0 and "schema up to date" in done.stdout, done.stderr
