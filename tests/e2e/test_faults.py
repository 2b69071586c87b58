"""Run lifecycle under faults: Redis and PostgreSQL restarted mid-run, 50 concurrent creates on one
thread from several processes through two web processes, a cancel sent to the web process that
did not create the run, a run whose attempts are exhausted after its owner died, and a run that
waits in its thread's queue longer than a heartbeat interval.

Every scenario checks the two rules of the fault path: nothing committed before the fault is
lost (checkpoints, earlier runs' messages, lifecycle events), and no run ends with two outcomes
(one terminal lifecycle event, one `end` event, the row's status). The machine's Redis and
PostgreSQL are never restarted: the restart tests start private servers (tests/e2e/faults.py).
Every cluster here has its own database, because a reaper scans every run of its database and
would take over another cluster's runs (their leases live under another Redis prefix).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row
from pydantic import SecretStr

from shared.db.migrate import migrate
from shared.runs.model import TERMINAL_STATUSES
from shared.settings import Settings
from shared.tools import testing
from shared.tools.testing import Cluster, SseEvent, iter_sse, open_stream, read_stream
from tests.conftest import create_database, drop_database
from tests.e2e.conftest import ALICE, FAST_LEASES, e2e_cluster
from tests.e2e.faults import PrivatePostgres, PrivateRedis, private_servers

pytestmark = pytest.mark.e2e

FAST = {**FAST_LEASES, "THREADRUN_SHUTDOWN_GRACE_S": "1"}
STREAM_MODES = ["messages-tuple", "values"]
SERVICE_ERRORS = (httpx.HTTPError, psycopg.OperationalError)
"""What a check may raise while a restarted service comes back."""

# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def private_database(name: str, template: str) -> Iterator[str]:
    """A migrated database of our own on the shared test server (a copy of `template`, the
    `template_database` fixture), dropped at the end."""
    dsn = create_database(name, template)
    try:
        migrate(Settings(database_url=dsn))  # type: ignore[arg-type]
        yield dsn
    finally:
        drop_database(name)


@contextlib.contextmanager
def running_cluster(
    settings: Settings,
    logs: Path,
    *,
    webs: int = 1,
    workers: int = 1,
    env: dict[str, str] | None = None,
) -> Iterator[Cluster]:
    """Web and runs-worker processes with short leases, started side by side; all of them
    stopped at the end, also on failure."""
    with e2e_cluster(settings, logs, {**FAST, **(env or {})}) as c:
        yield c.start(webs=webs, workers=[f"w{i + 1}" for i in range(workers)], concurrency=4)


def wait_for(check: Callable[[], Any], timeout: float, what: str, c: Cluster | None = None) -> Any:
    """`shared.tools.testing.wait_for` through a service restart, with the cluster's logs on timeout."""
    detail = c.tails if c is not None else None
    return testing.wait_for(check, timeout, what=what, retry_on=SERVICE_ERRORS, detail=detail)


def sql(dsn: str, query: str, params: Any = ()) -> list[dict[str, Any]]:
    """One query on a fresh connection (survives a database restart between calls)."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row, connect_timeout=5) as conn:
        return conn.execute(query, params).fetchall()


def api(url: str, timeout: float = 30) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"x-api-key": ALICE}, timeout=timeout)


def run_body(text: str, tokens: int = 5, delay_ms: float = 0, **extra: Any) -> dict[str, Any]:
    return {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": text}]},
        "stream_mode": STREAM_MODES,
        "config": {"configurable": {"tokens": tokens, "token_delay_ms": delay_ms}},
        **extra,
    }


def new_thread(client: httpx.Client) -> str:
    res = client.post("/threads", json={})
    assert res.status_code == 200, res.text
    return str(res.json()["thread_id"])


def running_run(
    c: Cluster, dsn: str, web: httpx.Client, text: str, *, tokens: int, delay_ms: float
) -> tuple[str, str]:
    """A new thread with a slow run created through `web`, once it is `running`."""
    tid = new_thread(web)
    res = web.post(f"/threads/{tid}/runs", json=run_body(text, tokens=tokens, delay_ms=delay_ms))
    assert res.status_code == 200, res.text
    run_id = str(res.json()["run_id"])
    wait_for(lambda: run_row(dsn, run_id)["status"] == "running", 20, "the run to start", c)
    return tid, run_id


def run_row(dsn: str, run_id: str) -> dict[str, Any]:
    return sql(dsn, "SELECT * FROM runs WHERE run_id = %s", (run_id,))[0]


def terminal_status(dsn: str, run_id: str) -> str | None:
    status = run_row(dsn, run_id)["status"]
    return str(status) if status in TERMINAL_STATUSES else None


def checkpoint_ids(dsn: str, tid: str) -> set[str]:
    rows = sql(dsn, "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s", (tid,))
    return {r["checkpoint_id"] for r in rows}


def lifecycle(dsn: str, run_id: str) -> list[str]:
    """The run's audit (lifecycle) event types in order."""
    rows = sql(dsn, "SELECT type FROM run_events WHERE run_id = %s ORDER BY seq", (run_id,))
    return [r["type"] for r in rows]


def assert_one_outcome(dsn: str, run_id: str) -> str:
    """The run is terminal, its audit log holds exactly one terminal transition, the same one."""
    row = run_row(dsn, run_id)
    kinds = lifecycle(dsn, run_id)
    assert row["status"] in TERMINAL_STATUSES, row
    assert [k for k in kinds if k in TERMINAL_STATUSES] == [row["status"]], (row["status"], kinds)
    assert row["ended_at"] is not None
    return str(row["status"])


def assert_nothing_inflight(dsn: str) -> None:
    """No run of the database is left pending or running (R1: every run settles)."""
    stuck = sql(
        dsn,
        "SELECT run_id, status, attempt, owner FROM runs WHERE status IN ('pending', 'running')",
    )
    assert stuck == [], stuck


def assert_single_end(events: list[SseEvent], status: str) -> None:
    """One `end`, last, naming the committed status; ids strictly increasing (B2)."""
    names = [e.event for e in events]
    assert names.count("end") == 1 and names[-1] == "end", names[-5:]
    assert events[-1].data["status"] == status
    ids = [tuple(map(int, e.id.split("-"))) for e in events if e.id]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def humans(state: dict[str, Any]) -> list[str]:
    return [m["content"] for m in state["values"]["messages"] if m["type"] == "human"]


# --------------------------------------------------------------------------------------
# 4. Redis restarted mid-run
# --------------------------------------------------------------------------------------


def test_redis_restart_mid_run_recovers(
    settings: Settings,
    session_id: str,
    template_database: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """R4, L1, L2, L4, L5, B5, B9, R1: Redis (broker, leases, streams) is killed and restarted
    empty while a run streams. Web and workers reconnect (a new run on a new thread succeeds);
    a client rejoining with a cursor of the lost stream gets one `gap` and reloads durable state;
    the interrupted run is settled by lease expiry + reaper (success on a later attempt, or error
    after max attempts), with one outcome; checkpoints and the earlier run committed before the
    fault are intact; no run is left pending or running."""
    logs = tmp_path_factory.mktemp("faults-redis")
    with (
        private_servers("redis") as servers,
        private_database(f"threadrun_t_{session_id}_fredis", template_database) as dsn,
    ):
        red: PrivateRedis = servers["redis"]
        s = settings.model_copy(
            update={
                "redis_url": red.url,
                "database_url": SecretStr(dsn),
                "redis_prefix": f"{settings.redis_prefix}fredis:",
            }
        )
        with running_cluster(s, logs, webs=1, workers=2) as c, api(c.url) as client:
            tid = new_thread(client)
            # Committed before the fault: a finished run.
            first = client.post(f"/threads/{tid}/runs/wait", json=run_body("before the fault"))
            assert first.status_code == 200, first.text
            # The victim: ~6 s of tokens.
            res = client.post(
                f"/threads/{tid}/runs", json=run_body("during the fault", tokens=300, delay_ms=20)
            )
            assert res.status_code == 200, res.text
            run_id = res.json()["run_id"]

            # A live follower, connected through the fault.
            follower: list[SseEvent] = []
            follower_error: list[BaseException] = []

            def follow() -> None:
                try:
                    with api(c.url, timeout=40) as fc:
                        follower.extend(read_stream(fc, tid, run_id, within=45))
                except BaseException as exc:  # noqa: BLE001 - recorded and judged below
                    follower_error.append(exc)

            pool = ThreadPoolExecutor(1)
            fut = pool.submit(follow)
            # A cursor inside the stream that Redis will lose.
            cursor = ""
            with open_stream(client, tid, run_id) as live:
                seen = 0
                for e in iter_sse(live.iter_lines()):
                    if e.event == "messages":
                        seen += 1
                        cursor = e.id
                    if seen >= 10:
                        break
            assert cursor
            before = checkpoint_ids(dsn, tid)
            assert before
            state_before = client.get(f"/threads/{tid}/state").json()
            assert terminal_status(dsn, run_id) is None  # still running when Redis dies

            red.crash_restart(downtime_s=1.0)

            # B5/B9: the rejoin gets exactly one gap, then the thread's durable state.
            rejoin = read_stream(client, tid, run_id, last_event_id=cursor)
            assert [e.event for e in rejoin] == ["gap"], (rejoin, c.tails())
            gap = rejoin[0].data
            assert gap["code"] == "stream_replay_gap" and gap["requested_event_id"] == cursor
            assert gap["recovery"] == "reload_durable_state"
            state = client.get(f"/threads/{tid}/state")
            assert state.status_code == 200, state.text
            committed = ["before the fault", "during the fault"]
            assert humans(state.json())[:2] == humans(state_before)[:2] == committed

            # Web and workers serve again: a new run on a new thread, dispatched through the
            # new broker, executed by a reconnected worker.
            tid2 = new_thread(client)
            after = client.post(
                f"/threads/{tid2}/runs/wait", json=run_body("after the fault"), timeout=60
            )
            assert after.status_code == 200, after.text
            assert after.json()["messages"][-1]["type"] == "ai", (after.json(), c.tails())

            # The victim settles: never stuck.
            status = wait_for(lambda: terminal_status(dsn, run_id), 60, "the victim to settle", c)
            row = run_row(dsn, run_id)
            if status == "success":
                assert row["attempt"] >= 2, row
                msgs = client.get(f"/threads/{tid}/state").json()["values"]["messages"]
                assert [m["type"] for m in msgs] == ["human", "ai", "human", "ai"]
                assert len(msgs[-1]["content"].split()) == 300  # the whole reply, once
            else:
                assert status == "error" and row["error"]["error"] == "MaxAttemptsExceeded", row
            assert assert_one_outcome(dsn, run_id) == status
            events = read_stream(client, tid, run_id)
            assert_single_end(events, status)
            metas = [e.data["attempt"] for e in events if e.event == "metadata"]
            assert metas and min(metas) >= 2  # attempt 1's events were lost with Redis

            # The follower never silently skipped the lost events: it ended with a gap (or the
            # connection broke), and never took events of the next attempt without a gap first.
            fut.result(timeout=45)
            pool.shutdown()
            names = [e.event for e in follower]
            if follower_error:
                assert isinstance(follower_error[0], httpx.HTTPError), follower_error
                assert "gap" not in names
            else:
                assert names and names[-1] in ("gap", "end"), names
            first_gap = names.index("gap") if "gap" in names else len(names)
            assert all(
                e.data["attempt"] == 1 for e in follower[:first_gap] if e.event == "metadata"
            )

            # Nothing committed before the fault was lost; nothing left inflight.
            assert before <= checkpoint_ids(dsn, tid)
            assert_nothing_inflight(dsn)
            print(
                f"redis restart: victim ended {status}, attempt {row['attempt']}, lifecycle "
                f"{lifecycle(dsn, run_id)}; follower ended with {names[-1:]} {follower_error[:1]}"
            )


# --------------------------------------------------------------------------------------
# 5. PostgreSQL restarted mid-run
# --------------------------------------------------------------------------------------


def test_postgres_restart_mid_run_never_false_success(
    settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """R1, L2, L4, L5, S3, J5: a private PostgreSQL (threads, runs, checkpoints) is shut down
    immediately (SIGQUIT), down 3 s, and restarted while a run is between two checkpoints and a
    burst of 8 short runs is claiming, checkpointing and finishing. Within bounded time every run
    ends either `success` (the same attempt, once the pools reconnect, or a later one after its
    lease expired), with every step in its state, or `error` with a reason: never `success`
    with a missing step, never stuck `running`; one outcome and one `end` each; checkpoints
    committed before the fault are intact; web and worker pools reconnect (a new run succeeds)."""
    logs = tmp_path_factory.mktemp("faults-postgres")
    with private_servers("postgres") as servers:
        pg: PrivatePostgres = servers["postgres"]
        dsn = pg.create_database("threadrun")
        s = settings.model_copy(
            update={
                "database_url": SecretStr(dsn),
                "redis_prefix": f"{settings.redis_prefix}fpg:",
            }
        )
        migrate(s)
        with running_cluster(s, logs, webs=1, workers=1) as c, api(c.url) as client:
            tid = new_thread(client)
            first = client.post(f"/threads/{tid}/runs/wait", json=run_body("before the fault"))
            assert first.status_code == 200, first.text
            # The victim asks for an artifact: model (tool call) -> tool -> model, 3 s each model
            # call, so it commits checkpoints of its own before the fault and more after it.
            res = client.post(
                f"/threads/{tid}/runs",
                json=run_body("please write notes.md", tokens=150, delay_ms=20),
            )
            assert res.status_code == 200, res.text
            run_id = res.json()["run_id"]

            def own_checkpoints() -> int:
                rows = sql(
                    dsn,
                    "SELECT count(*) AS n FROM checkpoints "
                    "WHERE thread_id = %s AND metadata->>'run_id' = %s",
                    (tid, run_id),
                )
                return int(rows[0]["n"])

            # input, model (tool call) and tools steps are committed: the second model call runs.
            wait_for(lambda: own_checkpoints() >= 3, 30, "the tool step's checkpoint", c)
            before = checkpoint_ids(dsn, tid)
            assert terminal_status(dsn, run_id) is None
            # A burst of short runs on other threads, so that the crash also hits claims,
            # checkpoint writes and terminal writes in flight.
            burst = []
            for i in range(8):
                btid = new_thread(client)
                r = client.post(
                    f"/threads/{btid}/runs",
                    json=run_body(f"burst {i}: write b{i}.md", tokens=30, delay_ms=5),
                )
                assert r.status_code == 200, r.text
                burst.append((btid, r.json()["run_id"]))
            time.sleep(0.3)

            pg.crash_restart(downtime_s=3.0)

            status = wait_for(lambda: terminal_status(dsn, run_id), 60, "the victim to settle", c)
            row = run_row(dsn, run_id)
            state = wait_for(
                lambda: client.get(f"/threads/{tid}/state").json(), 20, "state readable", c
            )
            kinds = [m["type"] for m in state["values"]["messages"]]
            if status == "success":
                # No false success: every step of the run is in the durable state, once.
                assert kinds == ["human", "ai", "human", "ai", "tool", "ai"], (kinds, row)
                assert state["values"]["messages"][-1]["content"].split()[2] == "Saved"
                assert len(state["values"]["messages"][-1]["content"].split()) == 150
            else:
                assert status == "error" and row["error"], row
                assert kinds[:4] == ["human", "ai", "human", "ai"], kinds
            assert assert_one_outcome(dsn, run_id) == status
            assert_single_end(read_stream(client, tid, run_id), status)
            assert before <= checkpoint_ids(dsn, tid)

            outcomes = []
            for btid, brid in burst:
                bstatus = wait_for(
                    lambda brid=brid: terminal_status(dsn, brid), 60, "a burst run to settle", c
                )
                brow = run_row(dsn, brid)
                outcomes.append((bstatus, brow["attempt"], (brow["error"] or {}).get("error")))
                bstate = client.get(f"/threads/{btid}/state").json()
                # A run that failed before its first checkpoint leaves the thread empty.
                bkinds = [m["type"] for m in bstate["values"].get("messages", [])]
                if bstatus == "success":
                    assert bkinds == ["human", "ai", "tool", "ai"], (bkinds, brow)
                else:
                    assert bstatus == "error" and brow["error"], brow
                assert assert_one_outcome(dsn, brid) == bstatus
                assert_single_end(read_stream(client, btid, brid), bstatus)
            print(f"postgres restart: burst outcomes {outcomes}")

            after = client.post(f"/threads/{tid}/runs/wait", json=run_body("after"), timeout=60)
            assert after.status_code == 200, after.text
            assert after.json()["messages"][-1]["type"] == "ai", after.json()
            assert_nothing_inflight(dsn)
            print(f"postgres restart: victim ended {status}, attempt {row['attempt']}")


# --------------------------------------------------------------------------------------
# 6, 7 and the end of a run: two web processes, two workers, one database
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def duo(
    settings: Settings,
    session_id: str,
    template_database: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Cluster, str]]:
    """Two web processes and two runs workers on a database of their own; max_attempts 1, so
    that the reaper ends a run whose owner is gone `error` at once (the last two tests)."""
    with private_database(f"threadrun_t_{session_id}_fduo", template_database) as dsn:
        s = settings.model_copy(
            update={"database_url": SecretStr(dsn), "redis_prefix": f"{settings.redis_prefix}fduo:"}
        )
        logs = tmp_path_factory.mktemp("faults-duo")
        env = {"THREADRUN_MAX_ATTEMPTS": "1"}
        with running_cluster(s, logs, webs=2, workers=2, env=env) as c:
            yield c, dsn


CLIENT_SCRIPT = r"""
import json, sys, threading, time
import httpx
cfg = json.loads(sys.argv[1])
n, proc = cfg["threads"], cfg["proc"]
results = [None] * n
clients = [httpx.Client(base_url=cfg["urls"][(proc * n + i) % len(cfg["urls"])],
                        headers={"x-api-key": cfg["key"]}, timeout=60) for i in range(n)]
for cl in clients:
    cl.get("/ok")  # connected before the start signal
barrier = threading.Barrier(n)

def post(i):
    body = dict(cfg["body"])
    body["input"] = {"messages": [{"role": "user", "content": f"p{proc}-t{i}"}]}
    barrier.wait()
    t0 = time.time()
    res = clients[i].post(f"/threads/{cfg['tid']}/runs", json=body)
    out = res.json()
    results[i] = {"status": res.status_code, "sent": t0, "done": time.time(),
                  "run_id": out.get("run_id"), "text": f"p{proc}-t{i}",
                  "web": (proc * n + i) % len(cfg["urls"])}

workers = [threading.Thread(target=post, args=(i,)) for i in range(n)]
print("ready", flush=True)
sys.stdin.readline()
for w in workers:
    w.start()
for w in workers:
    w.join()
for cl in clients:
    cl.close()
print(json.dumps(results), flush=True)
"""


def concurrent_creates(
    urls: list[str], tid: str, body: dict[str, Any], procs: int = 5, threads: int = 10
) -> list[dict[str, Any]]:
    """`procs` processes x `threads` threads POST a run on one thread at once, spread over
    the web processes; returns every response."""
    children = []
    try:
        for p in range(procs):
            cfg = {"urls": urls, "tid": tid, "body": body, "key": ALICE, "proc": p}
            cfg["threads"] = threads
            children.append(
                subprocess.Popen(
                    [sys.executable, "-c", CLIENT_SCRIPT, json.dumps(cfg)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for ch in children:
            assert ch.stdout is not None and ch.stdout.readline().strip() == "ready"
        for ch in children:  # all at once: every thread is already waiting on its barrier
            assert ch.stdin is not None
            ch.stdin.write("go\n")
            ch.stdin.flush()
        results: list[dict[str, Any]] = []
        for ch in children:
            out, _ = ch.communicate(timeout=60)
            assert ch.returncode == 0, out
            results.extend(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for ch in children:
            if ch.poll() is None:
                ch.kill()
                ch.wait(5)


def test_r2_50_concurrent_creates_reject_admits_exactly_one(duo: tuple[Cluster, str]) -> None:
    """R2, R3 (reject): 50 creates at once on one idle thread, from 5 processes x 10 threads
    through 2 web processes: exactly one is admitted, 49 get 409 and create nothing."""
    c, dsn = duo
    with api(c.urls[0]) as client:
        tid = new_thread(client)
        body = run_body("x", tokens=200, delay_ms=25, multitask_strategy="reject")
        results = concurrent_creates(c.urls, tid, body)
        statuses = sorted(r["status"] for r in results)
        assert statuses == [200] + [409] * 49, statuses
        assert {r["web"] for r in results} == {0, 1}
        admitted = next(r for r in results if r["status"] == 200)
        rows = sql(dsn, "SELECT run_id::text, status FROM runs WHERE thread_id = %s", (tid,))
        assert [r["run_id"] for r in rows] == [admitted["run_id"]]
        # The admitted run was inflight for the whole burst, so one admission is the right count.
        assert terminal_status(dsn, admitted["run_id"]) is None
        res = client.post(
            f"/threads/{tid}/runs/{admitted['run_id']}/cancel", params={"wait": 1}, timeout=30
        )
        assert res.status_code == 200 and res.json()["status"] == "interrupted", res.text
        assert assert_one_outcome(dsn, admitted["run_id"]) == "interrupted"


def test_r3_50_concurrent_creates_enqueue_run_one_at_a_time_in_order(
    duo: tuple[Cluster, str],
) -> None:
    """R2, R3 (enqueue), R1: 50 creates at once on one thread, from 5 processes x 10 threads
    through 2 web processes, 2 workers: all 50 are admitted and succeed, one at a time
    (started_at/ended_at never overlap), in creation order (execution order = created_at order,
    and the state's human messages are in that order)."""
    c, dsn = duo
    with api(c.urls[1], timeout=60) as client:
        tid = new_thread(client)
        results = concurrent_creates(c.urls, tid, run_body("x", tokens=2))
        assert sorted(r["status"] for r in results) == [200] * 50, results
        ids = {r["run_id"] for r in results}
        assert len(ids) == 50
        for rid in ids:
            wait_for(lambda rid=rid: terminal_status(dsn, rid), 90, f"run {rid} to finish", c)
        runs = client.get(f"/threads/{tid}/runs", params={"limit": 100}).json()
        assert {r["run_id"] for r in runs} == ids
        assert all(r["status"] == "success" for r in runs), [r["status"] for r in runs]
        for r in runs:
            assert_one_outcome(dsn, r["run_id"])
        by_start = sorted(runs, key=lambda r: r["started_at"])
        for a, b in zip(by_start, by_start[1:], strict=False):
            assert a["ended_at"] <= b["started_at"], (a, b)  # never two at once
        by_created = sorted(runs, key=lambda r: r["created_at"])
        text = {r["run_id"]: r["kwargs"]["input"]["messages"][0]["content"] for r in runs}
        seq = {
            r["run_id"]: r["seq"]
            for r in sql(dsn, "SELECT run_id::text, seq FROM runs WHERE thread_id = %s", (tid,))
        }
        created_order = [r["run_id"] for r in by_created]
        run_order = [r["run_id"] for r in by_start]
        fifo_order = sorted(ids, key=lambda r: seq[r])
        assert run_order == fifo_order  # FIFO by admission
        state = client.get(f"/threads/{tid}/state").json()
        assert humans(state) == [text[r] for r in run_order]
        assert_nothing_inflight(dsn)
        # Creation order as a client sees it (created_at, also the order GET …/runs lists by)
        # must be the order the runs were admitted and ran in.
        inversions = [
            (a["created_at"], seq[a["run_id"]], b["created_at"], seq[b["run_id"]])
            for a, b in zip(by_created, by_created[1:], strict=False)
            if seq[a["run_id"]] > seq[b["run_id"]]
        ]
        assert created_order == run_order, (
            f"{len(inversions)} adjacent pairs of runs have created_at in the opposite order "
            f"of their admission (seq) and execution, e.g. (created_at, seq, created_at, seq): "
            f"{inversions[:3]}"
        )


def test_r5_cancel_from_the_other_web_process(duo: tuple[Cluster, str]) -> None:
    """R5, L2, B7, A1: a run created through web process 0 is cancelled (interrupt, wait=1)
    through web process 1: status interrupted, exactly one terminal status, the stream's `end`
    (read through web 0) says interrupted, progress is kept and the thread is usable again."""
    c, dsn = duo
    with api(c.urls[0]) as web0, api(c.urls[1]) as web1:
        tid = new_thread(web0)
        res = web0.post(f"/threads/{tid}/runs", json=run_body("stop me", tokens=400, delay_ms=20))
        assert res.status_code == 200, res.text
        run_id = res.json()["run_id"]
        got: list[SseEvent] = []
        started = threading.Event()

        def follow() -> None:
            with open_stream(web0, tid, run_id) as live:
                for item in iter_sse(live.iter_lines()):
                    got.append(item)
                    if sum(1 for e in got if e.event == "messages") >= 5:
                        started.set()

        pool = ThreadPoolExecutor(1)
        fut = pool.submit(follow)
        assert started.wait(30), c.tails()
        t0 = time.monotonic()
        cancel = web1.post(
            f"/threads/{tid}/runs/{run_id}/cancel",
            params={"action": "interrupt", "wait": 1},
            timeout=30,
        )
        took = time.monotonic() - t0
        assert cancel.status_code == 200, cancel.text
        body = cancel.json()
        assert body["status"] == "interrupted" and body["cancel"] == "requested", body
        assert took < 10, took
        fut.result(timeout=30)
        pool.shutdown()
        assert_single_end(got, "interrupted")
        assert assert_one_outcome(dsn, run_id) == "interrupted"
        assert sum(1 for e in got if e.event == "messages") < 400  # stopped early
        # Progress kept (R5), thread usable again.
        assert humans(web1.get(f"/threads/{tid}/state").json()) == ["stop me"]
        again = web1.post(f"/threads/{tid}/runs/wait", json=run_body("again"))
        assert again.status_code == 200 and again.json()["messages"][-1]["type"] == "ai"
        assert_nothing_inflight(dsn)


def run_to_undo(c: Cluster, dsn: str, web: httpx.Client) -> tuple[str, dict[str, Any], int, str]:
    """A thread with one finished run ("keep me"), its state and checkpoint count then, and
    a second, long run ("undo me") that has already written checkpoints: (tid, state,
    checkpoints, run_id)."""
    tid = new_thread(web)
    first = web.post(f"/threads/{tid}/runs/wait", json=run_body("keep me"))
    assert first.status_code == 200, first.text
    before = web.get(f"/threads/{tid}/state").json()
    n = len(checkpoint_ids(dsn, tid))
    res = web.post(f"/threads/{tid}/runs", json=run_body("undo me", tokens=400, delay_ms=20))
    assert res.status_code == 200, res.text
    run_id = res.json()["run_id"]
    wait_for(lambda: len(checkpoint_ids(dsn, tid)) > n, 30, "the run's checkpoints", c)
    return tid, before, n, run_id


def test_r5_rollback_from_the_other_web_process(duo: tuple[Cluster, str]) -> None:
    """R5, S5: a run created through web 0 that wrote several checkpoints is cancelled with
    action=rollback through web 1: it ends interrupted (one outcome, `end` on its stream), the
    thread's state equals the state before the run, the restore is one new head checkpoint
    (linear history) that names the run it undid, and the next run starts from it."""
    c, dsn = duo
    with api(c.urls[0]) as web0, api(c.urls[1]) as web1:
        tid, before, n_hist, run_id = run_to_undo(c, dsn, web0)
        cancel = web1.post(
            f"/threads/{tid}/runs/{run_id}/cancel",
            params={"action": "rollback", "wait": 1},
            timeout=30,
        )
        assert cancel.status_code == 200, cancel.text
        assert cancel.json()["status"] == "interrupted", cancel.json()
        assert assert_one_outcome(dsn, run_id) == "interrupted"
        events = read_stream(web0, tid, run_id)
        assert_single_end(events, "interrupted")
        after = web1.get(f"/threads/{tid}/state").json()
        assert humans(after) == humans(before) == ["keep me"]
        assert after["values"]["messages"] == before["values"]["messages"]
        assert after["metadata"]["threadrun_rollback_of"] == run_id
        hist = web1.post(f"/threads/{tid}/history", json={"limit": 100}).json()
        assert hist[0]["parent_checkpoint"]["checkpoint_id"] == hist[1]["checkpoint_id"]
        assert len(hist) > n_hist + 1  # the undone run's checkpoints stay in the history
        again = web1.post(f"/threads/{tid}/runs/wait", json=run_body("next"))
        assert again.status_code == 200, again.text
        assert humans(web1.get(f"/threads/{tid}/state").json()) == ["keep me", "next"]
        assert_nothing_inflight(dsn)


def test_l1_j5_slow_terminal_write_keeps_the_lease_and_ends_the_stream(
    duo: tuple[Cluster, str],
) -> None:
    """L1, L2, J5, B7, A1: while a run finishes, its row is locked by another transaction for
    twice the lease TTL (a slow database: a lock wait, a stalled commit, a pool reconnecting
    after a restart). The owner must hold its lease until it has finalized: the run ends
    `success` (it did finish) with one outcome, and its stream ends with `end` {success},
    neither fenced after the status is committed (no `end`: the stream stays open for ever)
    nor taken over by the reaper and failed."""
    c, dsn = duo
    with api(c.urls[0]) as web0, api(c.urls[1]) as web1:
        tid, run_id = running_run(c, dsn, web0, "slow", tokens=100, delay_ms=15)
        pool = ThreadPoolExecutor(1)
        fut = pool.submit(read_stream, web1, tid, run_id, within=25)
        blocker = psycopg.connect(dsn)  # a transaction: the row lock lasts until rollback
        try:
            # FOR NO KEY UPDATE blocks UPDATEs of the row (the terminal write, a requeue), not
            # the inserts that reference it.
            blocker.execute("SELECT 1 FROM runs WHERE run_id = %s FOR NO KEY UPDATE", (run_id,))
            time.sleep(2 * float(FAST["THREADRUN_LEASE_TTL_S"]))  # the graph ends meanwhile
        finally:
            blocker.rollback()
            blocker.close()
        try:
            followed = fut.result(timeout=40)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        status = wait_for(lambda: terminal_status(dsn, run_id), 20, "the run to end", c)
        row = run_row(dsn, run_id)
        assert status == "success" and row["attempt"] == 1, (row, lifecycle(dsn, run_id))
        assert assert_one_outcome(dsn, run_id) == "success"
        assert_single_end(followed, "success")
        assert_nothing_inflight(dsn)


def test_r5_rollback_survives_the_owner_dying(duo: tuple[Cluster, str]) -> None:
    """R5, L4, L5: a rollback is requested of a run whose owner is frozen, then the owner is
    killed. Even with max_attempts exhausted (1), the reaper gives the run one more attempt,
    which restores the pre-run state instead of running the graph: the run ends
    `interrupted` (not MaxAttemptsExceeded), once, and the state is the one before it."""
    c, dsn = duo
    with api(c.urls[0]) as web0, api(c.urls[1]) as web1:
        tid, before, _, run_id = run_to_undo(c, dsn, web0)
        pid = int(run_row(dsn, run_id)["owner"].split(":")[1])
        victim = c.process(pid)
        os.kill(pid, signal.SIGSTOP)
        cancel = web1.post(
            f"/threads/{tid}/runs/{run_id}/cancel", params={"action": "rollback"}, timeout=30
        )
        assert cancel.status_code in (200, 202), cancel.text
        os.kill(pid, signal.SIGKILL)
        victim.popen.wait(timeout=10)
        c.start_worker("w3", 4)  # the next tests need two workers
        status = wait_for(lambda: terminal_status(dsn, run_id), 40, "the rollback attempt", c)
        row = run_row(dsn, run_id)
        assert status == "interrupted" and row["attempt"] == 2, row
        assert assert_one_outcome(dsn, run_id) == "interrupted"
        after = web1.get(f"/threads/{tid}/state").json()
        assert after["values"]["messages"] == before["values"]["messages"]
        assert after["metadata"]["threadrun_rollback_of"] == run_id
        assert_single_end(read_stream(web0, tid, run_id, within=15), "interrupted")
        assert_nothing_inflight(dsn)


def test_l5_max_attempts_exhausted_run_ends_its_stream(duo: tuple[Cluster, str]) -> None:
    """L5, B7, A1, R1: the owner of a streaming run is killed (-9) and max_attempts (1) is
    exhausted, so the reaper ends the run `error` (MaxAttemptsExceeded). One outcome, and every
    stream of the run ends: the follower connected before the kill and a client joining after
    the end both get `end` {status: error} within a bounded time (no heartbeats forever)."""
    c, dsn = duo
    with api(c.urls[0]) as web0, api(c.urls[1]) as web1:
        tid, run_id = running_run(c, dsn, web0, "die", tokens=400, delay_ms=20)
        pool = ThreadPoolExecutor(1)
        fut = pool.submit(read_stream, web1, tid, run_id, within=18)
        time.sleep(1.0)  # the follower is live, tokens are flowing
        pid = int(run_row(dsn, run_id)["owner"].split(":")[1])
        victim = c.process(pid)
        os.kill(pid, signal.SIGKILL)
        victim.popen.wait(timeout=10)
        status = wait_for(lambda: terminal_status(dsn, run_id), 20, "the reaper to end it", c)
        row = run_row(dsn, run_id)
        assert status == "error" and row["error"]["error"] == "MaxAttemptsExceeded", row
        assert assert_one_outcome(dsn, run_id) == "error"
        try:
            followed = fut.result(timeout=40)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        assert_single_end(followed, "error")
        assert_single_end(read_stream(web0, tid, run_id, within=15), "error")
        assert_nothing_inflight(dsn)


def test_b6_a_queued_runs_stream_carries_heartbeats_until_it_runs(
    settings: Settings,
    session_id: str,
    template_database: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """B6, R3, A1: with the heartbeat set to 6 s (B6: configurable; the seeds use 15 s), a run
    created with /runs/stream behind an 8 s run of the same thread (enqueue) has no stream for
    longer than one heartbeat interval. Its SSE response stays open with `: heartbeat` comments
    while it waits, then delivers metadata ... end {success}: a wait in the queue never breaks
    a client's stream."""
    with private_database(f"threadrun_t_{session_id}_fhb", template_database) as dsn:
        s = settings.model_copy(
            update={"database_url": SecretStr(dsn), "redis_prefix": f"{settings.redis_prefix}fhb:"}
        )
        logs = tmp_path_factory.mktemp("faults-heartbeat")
        env = {"THREADRUN_STREAM_HEARTBEAT_S": "6"}
        with running_cluster(s, logs, env=env) as c, api(c.url, timeout=60) as client:
            tid = new_thread(client)
            ahead = client.post(
                f"/threads/{tid}/runs", json=run_body("ahead", tokens=400, delay_ms=20)
            )
            assert ahead.status_code == 200, ahead.text
            heartbeats = 0
            items: list[SseEvent] = []
            t0 = time.monotonic()
            try:
                with client.stream(
                    "POST", f"/threads/{tid}/runs/stream", json=run_body("queued behind")
                ) as live:
                    if live.status_code != 200:
                        live.read()
                        raise AssertionError(
                            f"POST /runs/stream of the queued run answered {live.status_code} "
                            f"after {time.monotonic() - t0:.1f} s\n{c.tails(12, only='web')}"
                        )
                    for e in iter_sse(live.iter_lines(), heartbeats=True):
                        if e.heartbeat:
                            heartbeats += 1
                        else:
                            items.append(e)
            except httpx.HTTPError as exc:
                raise AssertionError(
                    f"the stream of the queued run broke after {time.monotonic() - t0:.1f} s "
                    f"({exc!r}); received {items[:3]}, {heartbeats} heartbeats\n{c.tails(12, only='web')}"
                ) from exc
            names = [e.event for e in items]
            assert heartbeats >= 1 and names and names[0] == "metadata", (heartbeats, names[:3])
            assert names[-1] == "end" and items[-1].data["status"] == "success"
            assert_nothing_inflight(dsn)
