"""The ops page answers "is anything wrong?" first, in headless Chromium against real processes.

One private cluster (web, a memory-only worker, short leases, an ops key, a fast page
refresh). It starts with no worker on the runs queue, so the first test sees the health
strip red for that reason, and a lost dispatch (R4) as a stuck run that the page offers to
requeue; then a runs worker joins and the strip turns green. Later tests share the cluster:
a failing run is listed with its error text (G4), cancel asks for confirmation (R5),
requeue is not offered to a run waiting its turn behind another (R3 enqueue), rows keep
their DOM nodes across refreshes, and the CLI resolves the short ids the page shows.

Screenshots go to tests/output/ops-*.png (ignored by git).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from shared.db import make_pool
from shared.redis_keys import Keys
from shared.runs.store import RunStore
from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, API_KEYS, FAST_LEASES, ClusterFactory
from tests.e2e.test_browser import CHROMIUM, CHROMIUM_ARGS, OUTPUT
from tests.e2e.test_ops import OPS, client, new_run, wait_status

pytestmark = pytest.mark.e2e

PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")


@pytest.fixture(scope="module")
def cluster(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """Web + a memory-only worker: the runs queue has no consumer until a test starts one."""
    env = {
        **FAST_LEASES,
        "THREADRUN_API_KEYS": f"{API_KEYS},{OPS}:ops-user:ops",
        "THREADRUN_OPS_INSPECT_CACHE_S": "0",
        "THREADRUN_OPS_REFRESH_S": "0.7",
        "THREADRUN_OPS_REPORT_S": "0.5",
    }
    with private_cluster("opspage", env) as c:
        c.side_by_side(c.start_web, lambda: c.start_worker("opsmem", queues="memory"))
        yield c


@pytest.fixture(scope="module")
def store(cluster: Cluster) -> Iterator[RunStore]:
    pool = make_pool(cluster.settings, name="test-ops-page", max_size=2)
    yield RunStore(pool)
    pool.close()


def runs_worker(c: Cluster) -> None:
    """Start the runs worker once (the first test starts it on purpose, later ones need it)."""
    if not any(p.name == "opsruns" for p in c.procs):
        c.start_worker("opsruns")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class OpsPage:
    """The ops page in a fresh context; script errors are collected."""

    def __init__(self, browser: Any, c: Cluster) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 860})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.goto(f"{c.url}/ops?api_key={OPS}")

    def tile(self, key: str) -> Any:
        return self.page.locator(f'#tiles [data-key="{key}"]')

    def wait_tile(self, key: str, state: str, timeout_s: float = 20) -> Any:
        sel = f'#tiles [data-key="{key}"][data-state="{state}"]'
        self.page.wait_for_selector(sel, timeout=timeout_s * 1000)
        return self.tile(key)

    def row(self, table: str, run_id: str) -> Any:
        return self.page.locator(f'#{table} tbody tr[data-key="{run_id}"]')

    def refreshed(self, times: int = 2) -> None:
        """Wait until the page has refreshed `times` more times."""
        for _ in range(times):
            before = self.page.locator("#status").inner_text()
            self.page.wait_for_function(
                "t => document.getElementById('status').textContent !== t", arg=before
            )
            # the clock has a one-second resolution: a second refresh in the same second
            # is seen by the next change
            time.sleep(0.05)

    def shot(self, name: str, full: bool = False) -> Path:
        OUTPUT.mkdir(parents=True, exist_ok=True)
        path = OUTPUT / f"ops-{name}.png"
        self.page.screenshot(path=str(path), full_page=full)
        return path

    def close(self) -> None:
        self.context.close()


def lose_dispatch(c: Cluster, run_id: str) -> None:
    """As if the run's dispatch had been lost (R4): not in the run queue, no message in the
    runs queue, and its row says it was never dispatched."""
    r = redis.Redis.from_url(c.settings.redis_url)
    keys = Keys(c.settings.redis_prefix)
    r.delete(*[keys.celery_queue("runs") + s for s in PRIORITY_SUFFIXES], keys.run_queue())
    r.close()
    with psycopg.connect(c.settings.dsn, autocommit=True) as conn:
        conn.execute("UPDATE runs SET dispatched_at = NULL WHERE run_id = %s", [run_id])


def test_r4_health_strip_red_without_a_runs_worker_and_stuck_run_requeued_then_green(
    cluster: Cluster, store: RunStore, browser: Any
) -> None:
    """R4: with no worker on the runs queue the strip is red and says so in words; a run
    whose dispatch was lost is a stuck run the page offers to requeue (with confirmation);
    once a runs worker joins, the strip turns green and the run finishes."""
    run = new_run(cluster, tokens=3)
    rid = run["run_id"]
    with client(cluster) as ops:
        health = ops.get("/ops/api/health").json()
    tiles = {t["key"]: t for t in health["tiles"]}
    assert health["ok"] is False
    assert tiles["workers.runs"]["state"] == "bad" and tiles["workers.runs"]["value"] == 0
    assert "no worker consumes the runs queue" in tiles["workers.runs"]["reason"]
    assert tiles["workers.memory"]["state"] == "ok"
    assert any("runs queue" in p for p in health["problems"])

    page = OpsPage(browser, cluster)
    try:
        tile = page.wait_tile("workers.runs", "bad")
        assert "no worker consumes the runs queue" in tile.inner_text()
        assert "problem" in page.page.locator("#verdict").inner_text()
        banner = page.page.locator("#problems")
        assert banner.is_visible() and "runs queue" in banner.inner_text()
        # In the queue, waiting for a worker: not stuck, nothing to requeue.
        row = page.row("runs", rid)
        row.wait_for(timeout=10_000)
        assert row.locator("button", has_text="requeue").count() == 0
        page.shot("1-no-runs-worker")

        lose_dispatch(cluster, rid)
        page.wait_tile("stuck", "bad")
        assert "never dispatched" in page.tile("stuck").inner_text()
        requeue = row.locator("button", has_text="requeue")
        requeue.wait_for(timeout=10_000)
        assert "stuck" in row.inner_text()
        page.shot("2-stuck-run")
        requeue.click()
        dialog = page.page.locator("#confirm")
        assert dialog.is_visible() and "Requeue this stuck run?" in dialog.inner_text()
        page.page.locator("#confirm-yes").click()
        page.page.locator("#action-result", has_text="dispatched").wait_for(timeout=10_000)

        runs_worker(cluster)
        assert wait_status(store, rid) == "success"
        page.wait_tile("workers.runs", "ok")
        page.wait_tile("stuck", "ok")
        page.page.wait_for_selector("#verdict.ok, #verdict.warn", timeout=20_000)
        assert page.page.locator("#problems").is_hidden()
        page.shot("3-healthy")
    finally:
        page.close()
    assert page.errors == []


def test_g4_failures_list_shows_the_error_text(
    cluster: Cluster, store: RunStore, browser: Any
) -> None:
    """G4 for operators: a run that ended `error` is listed by GET /ops/api/failures and on the
    page with its error type and message; the failure-rate tile counts it."""
    runs_worker(cluster)
    run = new_run(cluster, tokens=-1)  # the built-in model refuses this: ValueError
    rid = run["run_id"]
    assert wait_status(store, rid) == "error"
    with client(cluster) as ops:
        doc = ops.get("/ops/api/failures", params={"limit": 5}).json()
        bad = ops.get("/ops/api/failures", params={"limit": 0})
        assert bad.status_code == 422 and bad.json()["field"] == "limit"
        bad = ops.get("/ops/api/failures", params={"hours": "soon"})
        assert bad.status_code == 422 and bad.json()["field"] == "hours"
        health = ops.get("/ops/api/health").json()
    mine = next(f for f in doc["failures"] if f["run_id"] == rid)
    assert mine["status"] == "error" and mine["user_id"] == "alice"
    assert mine["error"]["error"] == "ValueError" and "tokens" in mine["error"]["message"]
    failures = next(t for t in health["tiles"] if t["key"] == "failures")
    assert failures["state"] in ("warn", "bad") and "ended error/timeout" in failures["reason"]
    with client(cluster, ALICE) as alice:
        assert alice.get("/ops/api/failures").status_code == 403

    page = OpsPage(browser, cluster)
    try:
        row = page.row("failures", rid)
        row.wait_for(timeout=10_000)
        text = row.inner_text()
        assert "ValueError" in text and "tokens" in text, text
        assert page.tile("failures").get_attribute("data-state") in ("warn", "bad")
        page.shot("4-failure-listed")
    finally:
        page.close()
    assert page.errors == []


def test_r3_r5_requeue_not_offered_to_a_queued_run_cancel_confirms_rows_kept(
    cluster: Cluster, store: RunStore, browser: Any
) -> None:
    """R3/R5 on the page: a run queued behind another run of its thread is not offered
    requeue (and the server refuses it: `queued_behind`); cancel asks first, and "keep it"
    cancels nothing; the rows are the same DOM nodes across refreshes (updated in place)."""
    runs_worker(cluster)
    first = new_run(cluster, tokens=1000, delay_ms=50)
    a, tid = first["run_id"], first["thread_id"]
    wait_status(store, a, frozenset({"running"}))
    b = new_run(cluster, tokens=2, thread=tid)["run_id"]  # enqueue: waits behind `a`

    with client(cluster) as ops:
        listed = {r["run_id"]: r for r in ops.get("/ops/api/runs").json()["runs"]}
        assert listed[b]["requeue"] == {
            "eligible": False,
            "outcome": "queued_behind",
            "why": "waiting its turn behind another run of its thread",
        }
        assert listed[a]["requeue"]["eligible"] is False
        assert listed[a]["requeue"]["outcome"] == "lease_held"
        refused = ops.post(f"/ops/api/runs/{b}/requeue")
        assert refused.status_code == 409 and refused.json()["outcome"] == "queued_behind"

    page = OpsPage(browser, cluster)
    try:
        row_a, row_b = page.row("runs", a), page.row("runs", b)
        row_a.wait_for(timeout=10_000)
        row_b.wait_for(timeout=10_000)
        assert row_b.locator("button", has_text="requeue").count() == 0
        assert row_a.locator("button", has_text="requeue").count() == 0
        assert "waiting its turn" in row_b.inner_text()
        # The full id is on the row (clipped on screen) and selected whole by one click.
        assert row_a.locator("code.id").first.inner_text() == a
        row_a.locator("code.id").first.click()
        assert page.page.evaluate("getSelection().toString()") == a

        # Rows are updated in place: mark the nodes, let the page refresh, find the marks.
        page.page.evaluate(
            """([a, b]) => {
                for (const id of [a, b]) {
                    const tr = document.querySelector(`#runs tr[data-key="${id}"]`);
                    tr.__kept = id;
                    tr.querySelector("button").__kept = id;
                }
            }""",
            [a, b],
        )
        row_a.hover()
        box = row_a.bounding_box()
        assert box is not None
        page.refreshed(3)
        kept = page.page.evaluate(
            """([a, b]) => [a, b].map((id) => {
                const tr = document.querySelector(`#runs tr[data-key="${id}"]`);
                return [tr && tr.__kept, tr && tr.querySelector("button").__kept];
            })""",
            [a, b],
        )
        assert kept == [[a, a], [b, b]], kept
        # The hover survives the refresh: the row under the pointer is still `:hover` (a
        # health tile whose sentence grew may have moved the rows under a still pointer).
        under = page.page.evaluate(
            """([x, y]) => {
                const tr = document.elementFromPoint(x, y)?.closest("#runs tr[data-key]");
                return tr ? [tr.dataset.key, tr.matches(":hover")] : null;
            }""",
            [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2],
        )
        assert under is None or under[1] is True, under

        # Cancel asks first; "keep it" cancels nothing.
        row_a.locator("button", has_text="cancel").click()
        dialog = page.page.locator("#confirm")
        assert dialog.is_visible()
        assert "Cancel this run?" in dialog.inner_text() and a in dialog.inner_text()
        page.shot("5-cancel-confirm")
        page.page.locator("#confirm-no").click()
        assert not dialog.is_visible()
        time.sleep(1.0)
        assert store.run_status(a) == "running"
        with client(cluster) as ops:
            assert ops.get("/ops/api/audit", params={"run_id": a}).json()["audit"] == []
        page.shot("6-inflight-queued-behind")

        row_a.locator("button", has_text="cancel").click()
        page.page.locator("#confirm-yes").click()
        page.page.locator("#action-result", has_text="requested").wait_for(timeout=10_000)
    finally:
        page.close()
    assert wait_status(store, a) == "interrupted"
    assert wait_status(store, b) == "success"
    assert page.errors == []


def test_cli_accepts_a_unique_run_id_prefix_and_refuses_an_ambiguous_one(
    cluster: Cluster, store: RunStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 8-character ids the page shows work in `threadrun runs show|cancel|requeue`; a
    prefix shared by several runs is refused with the candidates listed; `runs failures`
    prints the error text. GET /ops/api/runs?prefix= is ops-only and validated."""
    from threadrun.cli import main

    runs_worker(cluster)
    base = ["--url", cluster.url, "--api-key", OPS]
    run = new_run(cluster, tokens=2)
    rid = run["run_id"]
    wait_status(store, rid)

    assert main(["runs", "show", rid[:8], *base]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == rid
    assert main(["runs", "requeue", rid[:8], *base]) == 1  # resolved, then refused: it ended
    assert f"requeue {rid}: not_inflight" in capsys.readouterr().out

    # Runs until two of them share their first hex digit (at most 17: pigeonhole).
    firsts: dict[str, list[str]] = {rid[0]: [rid]}
    while all(len(v) < 2 for v in firsts.values()):
        made = str(new_run(cluster, tokens=1)["run_id"])
        wait_status(store, made)
        firsts.setdefault(made[0], []).append(made)
    digit = next(d for d, v in firsts.items() if len(v) >= 2)
    with client(cluster) as ops:
        ids = [
            r["run_id"] for r in ops.get("/ops/api/runs", params={"prefix": digit}).json()["runs"]
        ]
        assert set(firsts[digit]) <= set(ids)
        assert ops.get("/ops/api/runs", params={"prefix": "xyz"}).json()["field"] == "prefix"
        assert (
            ops.get("/ops/api/runs", params={"prefix": rid.upper()}).json()["runs"][0]["run_id"]
            == rid
        )
    with client(cluster, ALICE) as alice:
        assert alice.get("/ops/api/runs", params={"prefix": rid[:8]}).status_code == 403

    assert main(["runs", "show", digit, *base]) == 1
    err = capsys.readouterr().err
    assert "ambiguous" in err and all(i in err for i in ids), err
    assert main(["runs", "show", "0" * 31, *base]) == 1
    assert "no run id starts with" in capsys.readouterr().err
    assert main(["runs", "failures", *base]) == 0
    assert "ValueError" in capsys.readouterr().out


def test_overdue_crons_turn_the_scheduler_tile_red(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """This cluster runs no cron scheduler: an enabled cron due well in the past makes the
    crons tile red, asking whether the scheduler runs; `threadrun status` prints the same
    problem first. Without overdue crons the tile is green."""
    from threadrun.cli import main

    late = cluster.settings.ops_cron_late_s + 30
    with psycopg.connect(cluster.settings.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO crons (cron_id, user_id, assistant_id, schedule, request, next_run_at)"
            " VALUES (gen_random_uuid(), 'alice', 'lead_agent', '* * * * *', '{}'::jsonb,"
            " now() - make_interval(secs => %s))",
            [late],
        )
        try:
            with client(cluster) as ops:
                tiles = {t["key"]: t for t in ops.get("/ops/api/health").json()["tiles"]}
            crons = tiles["crons"]
            assert crons["state"] == "bad" and crons["value"] == 1
            assert "is the cron scheduler running?" in crons["reason"]
            assert main(["status", "--url", cluster.url, "--api-key", OPS]) == 0
            out = capsys.readouterr().out
            assert out.startswith("health    PROBLEMS\n"), out
            assert "cron scheduler running?" in out.splitlines()[1]
        finally:
            conn.execute("DELETE FROM crons")
    with client(cluster) as ops:
        tiles = {t["key"]: t for t in ops.get("/ops/api/health").json()["tiles"]}
    assert tiles["crons"]["state"] == "ok" and tiles["crons"]["reason"] == "no cron is enabled"


def test_webhooks_tile_warns_without_a_consumer_red_when_deliveries_wait(
    cluster: Cluster, browser: Any
) -> None:
    """The health strip has a tile per queue, webhooks too: with no worker on the webhooks
    queue it warns (a run's webhook would wait in the outbox); a due delivery waiting in the
    outbox turns it red, in words; once a webhooks worker joins it is green."""
    with client(cluster) as ops:
        o = ops.get("/ops/api/overview").json()
    assert set(o["queues"]) == {"runs", "memory", "webhooks"}
    assert o["workers_online"]["webhooks"] == 0
    tiles = {t["key"]: t for t in o["health"]["tiles"]}
    hooks = tiles["workers.webhooks"]
    assert hooks["state"] == "warn" and hooks["value"] == 0, hooks
    assert "no worker consumes the webhooks queue" in hooks["reason"]

    page = OpsPage(browser, cluster)
    try:
        tile = page.wait_tile("workers.webhooks", "warn")
        assert "webhooks workers" in tile.inner_text().lower()
        page.shot("7-webhooks-no-consumer")
        with psycopg.connect(cluster.settings.dsn, autocommit=True) as conn:
            # A delivery whose run has ended (here: is gone) is due at once.
            conn.execute(
                "INSERT INTO webhook_deliveries (run_id, thread_id, url, created_at)"
                " VALUES (gen_random_uuid(), gen_random_uuid(), 'http://127.0.0.1:9/hook',"
                " now() - interval '42 seconds')"
            )
            try:
                tile = page.wait_tile("workers.webhooks", "bad")
                assert "1 webhook waits in the outbox (oldest 4" in tile.inner_text()
                banner = page.page.locator("#problems")
                assert banner.is_visible() and "webhooks queue" in banner.inner_text()
                with client(cluster) as ops:
                    doc = ops.get("/ops/api/queues").json()
                assert doc["webhooks"]["outbox_due"] == 1
                assert doc["webhooks"]["oldest_age_s"] >= 42
                page.shot("8-webhooks-waiting", full=True)
            finally:
                conn.execute("DELETE FROM webhook_deliveries")
        cluster.start_webhooks_worker(concurrency=1)
        tile = page.wait_tile("workers.webhooks", "ok")
        assert "1 worker consumes the webhooks queue" in tile.inner_text()
    finally:
        page.close()
    assert page.errors == []
