"""Thread expiry (P6) on real PostgreSQL and Redis: `checkpointer.ttl` and the SDK's `ttl`.

The sweep is driven directly, with its clock (`at`) moved past the TTLs: no sleeps. Each
test module gets a database of its own, so the row counts cover every table there is.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import operator
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import httpx
import pytest
import redis
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import StateGraph
from langgraph_sdk.client import SyncLangGraphClient

from app import create_app
from shared import workspaces
from shared.db import DictPool, make_pool
from shared.redis_keys import Keys
from shared.retention.policy import SweepPolicy
from shared.retention.removal import ThreadRemover
from shared.retention.sweeper import ThreadSweeper
from shared.runs.model import MultitaskStrategy, RunRequest, ThreadTTL
from shared.runs.store import Doomed, ExpiryOutcome, RunStore
from shared.settings import PROJECT_ROOT, Settings
from shared.tools.testing import settings_env
from shared.vocab import PruneStrategy
from tests.conftest import private_settings

OWNER = "ttl-owner"
LATER = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
"""The sweep's clock in these tests: every TTL of minutes has passed by then."""
OUTLIVING = {"ops_audit", "cron_firings"}
"""Tables that name a thread and outlive it by design (shared/retention/removal.py)."""


@pytest.fixture(scope="module")
def tsettings(settings: Settings, redis_url: str, template_database: str) -> Iterator[Settings]:
    with private_settings(settings, redis_url, template_database) as s:
        yield s


@pytest.fixture(scope="module")
def tpool(tsettings: Settings) -> Iterator[DictPool]:
    p = make_pool(tsettings, name="test-thread-ttl", max_size=8)
    yield p
    p.close()


@pytest.fixture
def tstore(tpool: DictPool) -> RunStore:
    return RunStore(tpool)


@pytest.fixture
def remover(tstore: RunStore, tsettings: Settings, rclient: redis.Redis) -> ThreadRemover:
    return ThreadRemover(tstore, rclient, Keys(tsettings.redis_prefix), tsettings.workspace_dir)


POLICY = SweepPolicy(interval_s=300, limit=1000, lock_timeout_s=2, audit_retention_days=90)


def sweeper(remover: ThreadRemover, **kw: Any) -> ThreadSweeper:
    return ThreadSweeper(remover, dataclasses.replace(POLICY, **kw))


class _S(TypedDict):
    n: Annotated[int, operator.add]


def checkpoint_thread(pool: DictPool, thread_id: str, turns: int = 2) -> None:
    """Real checkpoints and writes of `thread_id` (a tiny graph run `turns` times)."""
    g = StateGraph(_S)
    g.add_node("inc", lambda s: {"n": 1})
    g.set_entry_point("inc")
    g.set_finish_point("inc")
    with pool.connection() as conn:
        graph = g.compile(checkpointer=PostgresSaver(conn))
        for _ in range(turns):
            graph.invoke({"n": 1}, {"configurable": {"thread_id": thread_id}})


def full_thread(
    store: RunStore, pool: DictPool, s: Settings, r: redis.Redis, ttl: ThreadTTL
) -> tuple[str, str]:
    """A thread with something in every place a thread has things: an ended run with its
    journal rows, checkpoints, a head copy, a cron, a delivered webhook, workspace files
    and Redis keys. (thread id, run id)."""
    tid = store.create_thread(None, OWNER, {"k": "v"}, "raise", ttl).thread_id
    run_id = str(uuid.uuid4())
    store.admit(
        RunRequest(thread_id=tid, assistant_id="lead_agent", webhook="https://example.com/h"),
        run_id=run_id,
        owner=OWNER,
        graph_id="lead_agent",
        strategy=MultitaskStrategy.ENQUEUE,
    )
    checkpoint_thread(pool, tid)
    with pool.connection() as conn:
        conn.execute(
            "UPDATE runs SET status = 'success', ended_at = now() WHERE run_id = %s", (run_id,)
        )
        conn.execute(
            "UPDATE webhook_deliveries SET state = 'delivered' WHERE run_id = %s", (run_id,)
        )
        conn.execute("INSERT INTO thread_heads (thread_id, checkpoint_id) VALUES (%s, 'x')", (tid,))
        conn.execute(
            "INSERT INTO crons (cron_id, user_id, assistant_id, thread_id, schedule, request)"
            " VALUES (%s, %s, 'lead_agent', %s, '* * * * *', '{}')",
            (str(uuid.uuid4()), OWNER, tid),
        )
        # its expiry: the run's admission refreshed it, the sweep's clock is a day on
    folder = workspaces.thread_workspace(s.workspace_dir, OWNER, tid)
    (folder / "out").mkdir(parents=True, exist_ok=True)
    (folder / "out" / "a.txt").write_text("artifact")
    (folder / "b.txt").write_text("artifact")
    k = Keys(s.redis_prefix)
    r.xadd(k.thread_runs(tid), {"r": run_id})
    r.xadd(k.stream(run_id), {"e": "x"})
    r.hset(k.stream_meta(run_id), "count", 1)
    r.set(k.result(run_id), "{}")
    return tid, run_id


def rows_of(pool: DictPool, tid: str, run_ids: list[str]) -> dict[str, int]:
    """Rows naming the thread (or one of its runs) in every table that has such a column."""
    out: dict[str, int] = {}
    with pool.connection() as conn:
        cols = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'public' AND column_name IN ('thread_id', 'run_id')"
        ).fetchall()
        for c in cols:
            table, col = c["table_name"], c["column_name"]
            wanted = [tid] if col == "thread_id" else run_ids
            if table == "ops_audit":
                n = conn.execute(
                    "SELECT count(*) AS n FROM ops_audit WHERE params->>'thread_id' = %s", (tid,)
                ).fetchone()
            else:
                n = conn.execute(
                    f"SELECT count(*) AS n FROM {table} WHERE {col}::text = ANY(%s)",
                    (wanted,),
                ).fetchone()
            assert n is not None
            out[table] = out.get(table, 0) + int(n["n"])
    return out


def keys_of(r: redis.Redis, s: Settings, tid: str, run_id: str) -> list[Any]:
    return [*r.keys(f"{s.redis_prefix}*{tid}*"), *r.keys(f"{s.redis_prefix}*{run_id}*")]


def test_p6_expired_thread_goes_with_every_row_file_and_key(
    tstore: RunStore, tpool: DictPool, tsettings: Settings, rclient: redis.Redis,
    remover: ThreadRemover,
) -> None:  # fmt: skip
    """P6: past its TTL a thread goes with all its rows (every table that names it or its
    runs), its workspace files and its Redis keys; the audit record of the expiry stays."""
    tid, run_id = full_thread(tstore, tpool, tsettings, rclient, ThreadTTL(PruneStrategy.DELETE, 1))
    before = rows_of(tpool, tid, [run_id])
    for table in ("threads", "runs", "run_events", "checkpoints", "checkpoint_writes",
                  "checkpoint_blobs", "thread_heads", "crons", "webhook_deliveries"):  # fmt: skip
        assert before[table] > 0, table
    assert keys_of(rclient, tsettings, tid, run_id)
    folder = workspaces.thread_workspace(tsettings.workspace_dir, OWNER, tid)
    assert folder.exists()

    assert sweeper(remover).sweep().count(ExpiryOutcome.SKIPPED) == 0  # not yet expired: none
    report = sweeper(remover).sweep(at=LATER)

    assert report.count(ExpiryOutcome.DELETED) == 1 and report.failed == 0
    after = rows_of(tpool, tid, [run_id])
    assert {t: n for t, n in after.items() if n and t not in OUTLIVING} == {}
    assert after["ops_audit"] == 1
    assert not folder.exists()
    assert keys_of(rclient, tsettings, tid, run_id) == []
    with tpool.connection() as conn:
        audit = conn.execute(
            "SELECT actor, action, result, detail FROM ops_audit WHERE params->>'thread_id' = %s",
            (tid,),
        ).fetchone()
    assert audit is not None and (audit["actor"], audit["action"]) == ("retention", "thread.expire")
    assert audit["detail"] == {"workspace_files_removed": 2, "runs": 1}
    # idempotent: a second sweep finds nothing
    assert sweeper(remover).sweep(at=LATER).outcomes == {}


def test_p6_thread_without_ttl_never_expires(tstore: RunStore, remover: ThreadRemover) -> None:
    """P6: a thread with no TTL (and no default) has no expiry."""
    t = tstore.create_thread(None, OWNER, {}, "raise")
    assert t.ttl is None and t.expires_at is None
    sweeper(remover).sweep(at=LATER + dt.timedelta(days=36_500))
    assert tstore.get_thread(t.thread_id, OWNER).thread_id == t.thread_id


def test_p6_thread_with_a_run_in_flight_survives_until_after_the_run(
    tstore: RunStore, tpool: DictPool, remover: ThreadRemover
) -> None:
    """P6: never under an active run (pending, then running): the sweep leaves it (BUSY);
    the first sweep after the run ended takes it."""
    tid = tstore.create_thread(
        None, OWNER, {}, "raise", ThreadTTL(PruneStrategy.DELETE, 1)
    ).thread_id
    run_id = str(uuid.uuid4())
    tstore.admit(
        RunRequest(thread_id=tid, assistant_id="lead_agent"),
        run_id=run_id,
        owner=OWNER,
        graph_id="lead_agent",
        strategy=MultitaskStrategy.ENQUEUE,
    )
    assert sweeper(remover).sweep(at=LATER).count(ExpiryOutcome.BUSY) == 1  # pending
    claim = tstore.claim(run_id, "worker-ttl")
    assert claim.run is not None
    assert sweeper(remover).sweep(at=LATER).count(ExpiryOutcome.BUSY) == 1  # running
    assert tstore.get_thread(tid, OWNER).thread_id == tid
    with tpool.connection() as conn:
        conn.execute(
            "UPDATE runs SET status = 'success', ended_at = now() WHERE run_id = %s", (run_id,)
        )
    assert sweeper(remover).sweep(at=LATER).count(ExpiryOutcome.DELETED) == 1
    assert rows_of(tpool, tid, [run_id])["runs"] == 0


def test_p6_activity_refreshes_the_expiry(tstore: RunStore) -> None:
    """P6: a patch (and a run's admission) starts the TTL again from now; a patch with a ttl
    replaces it."""
    t = tstore.create_thread(None, OWNER, {}, "raise", ThreadTTL(PruneStrategy.DELETE, 10))
    assert t.expires_at is not None
    p = tstore.patch_thread(t.thread_id, OWNER, {"a": 1})
    assert p.expires_at is not None and p.expires_at > t.expires_at and p.ttl == t.ttl
    q = tstore.patch_thread(t.thread_id, OWNER, {}, ThreadTTL(PruneStrategy.KEEP_LATEST, 60))
    assert q.ttl == ThreadTTL(PruneStrategy.KEEP_LATEST, 60.0)
    assert q.expires_at is not None and q.expires_at - p.expires_at > dt.timedelta(minutes=49)
    tstore.delete_thread(t.thread_id, OWNER)


def test_p6_keep_latest_leaves_exactly_one_checkpoint_and_the_thread_readable(
    tstore: RunStore, tpool: DictPool, remover: ThreadRemover
) -> None:
    """P6: `keep_latest` prunes the thread to its newest checkpoint instead of deleting it;
    its state reads as before; no further prune until its next activity."""
    ttl = ThreadTTL(PruneStrategy.KEEP_LATEST, 1)
    tid = tstore.create_thread(None, OWNER, {}, "raise", ttl).thread_id
    checkpoint_thread(tpool, tid, turns=3)
    with tpool.connection() as conn:
        saver = PostgresSaver(conn)
        before = saver.get_tuple({"configurable": {"thread_id": tid}})
        assert (
            before is not None and len(list(saver.list({"configurable": {"thread_id": tid}}))) > 1
        )

    assert sweeper(remover).sweep(at=LATER).count(ExpiryOutcome.PRUNED) == 1

    with tpool.connection() as conn:
        saver = PostgresSaver(conn)
        kept = list(saver.list({"configurable": {"thread_id": tid}}))
        after = saver.get_tuple({"configurable": {"thread_id": tid}})
    assert len(kept) == 1
    assert after is not None and after.checkpoint["id"] == before.checkpoint["id"]
    assert after.checkpoint["channel_values"]["n"] == before.checkpoint["channel_values"]["n"] == 6
    thread = tstore.get_thread(tid, OWNER)
    assert thread.expires_at is None and thread.ttl == ttl
    assert sweeper(remover).sweep(at=LATER).outcomes == {}


def test_p6_two_sweepers_at_once_sweep_once(
    tstore: RunStore, tpool: DictPool, tsettings: Settings, rclient: redis.Redis
) -> None:
    """P6: exactly one sweeper at a time: while one sweeps (the advisory lock), a second,
    with its own pool and session, does nothing; every thread is deleted once, no error."""
    tids = [
        tstore.create_thread(None, OWNER, {}, "raise", ThreadTTL(PruneStrategy.DELETE, 1)).thread_id
        for _ in range(20)
    ]
    other_pool = make_pool(tsettings, name="test-ttl-second", max_size=3)
    try:
        first = sweeper(
            ThreadRemover(tstore, rclient, Keys(tsettings.redis_prefix), tsettings.workspace_dir)
        )
        second = sweeper(
            ThreadRemover(
                RunStore(other_pool), rclient, Keys(tsettings.redis_prefix), tsettings.workspace_dir
            )
        )
        inside, done = threading.Event(), threading.Event()

        def hold(_: Doomed) -> None:
            inside.set()
            done.wait(10)

        reports: dict[str, Any] = {}
        t = threading.Thread(
            target=lambda: reports.update(first=first.sweep(at=LATER, before_delete=hold))
        )
        t.start()
        assert inside.wait(10)
        reports["second"] = second.sweep(at=LATER)
        done.set()
        t.join(30)
    finally:
        other_pool.close()
    assert reports["second"].skipped and reports["second"].outcomes == {}
    assert (
        reports["first"].count(ExpiryOutcome.DELETED) == len(tids) and reports["first"].failed == 0
    )
    with tpool.connection() as conn:
        n = conn.execute(
            "SELECT count(*) AS n FROM ops_audit WHERE action = 'thread.expire'"
            " AND params->>'thread_id' = ANY(%s)",
            (tids,),
        ).fetchone()
        left = conn.execute(
            "SELECT count(*) AS n FROM threads WHERE thread_id::text = ANY(%s)", (tids,)
        ).fetchone()
    assert n is not None and n["n"] == len(tids)  # each deleted exactly once
    assert left is not None and left["n"] == 0


def test_p6_a_failure_between_steps_leaves_no_half_deleted_thread(
    tstore: RunStore, tpool: DictPool, tsettings: Settings, rclient: redis.Redis,
    remover: ThreadRemover,
) -> None:  # fmt: skip
    """P6: an exception after the purge (checkpoints deleted, files removed) and before the
    row's delete stops the sweep: that thread is whole in the database (rolled back), the
    next sweep deletes it entirely."""
    tid, run_id = full_thread(tstore, tpool, tsettings, rclient, ThreadTTL(PruneStrategy.DELETE, 1))
    before = rows_of(tpool, tid, [run_id])

    def crash(_: Doomed) -> None:
        raise RuntimeError("injected between the purge and the delete")

    with pytest.raises(RuntimeError):
        sweeper(remover).sweep(at=LATER, before_delete=crash)
    assert rows_of(tpool, tid, [run_id]) == before  # nothing half: every row is there

    assert sweeper(remover).sweep(at=LATER).count(ExpiryOutcome.DELETED) == 1
    after = rows_of(tpool, tid, [run_id])
    assert {t: n for t, n in after.items() if n and t not in OUTLIVING} == {}


KILLED_SWEEPER = """
import sys, time
from shared.db import make_pool
from shared.redis_keys import Keys
from shared.redis_clients import sync_client
from shared.retention.removal import ThreadRemover
from shared.retention.sweeper import ThreadSweeper
from shared.retention.policy import SweepPolicy
from shared.runs.store import RunStore
from shared.settings import Settings
import datetime as dt

s = Settings()
remover = ThreadRemover(RunStore(make_pool(s, name="killed", max_size=3)), sync_client(s),
                        Keys(s.redis_prefix), s.workspace_dir)

def stall(doomed):
    print("purged", doomed.thread_id, flush=True)
    time.sleep(600)

ThreadSweeper(remover, SweepPolicy(300, 1000, 2, 90)).sweep(
    at=dt.datetime.fromisoformat(sys.argv[1]), before_delete=stall)
"""


def test_p6_a_sweeper_killed_mid_batch_leaves_no_half_deleted_thread(
    tstore: RunStore, tpool: DictPool, tsettings: Settings, rclient: redis.Redis,
    remover: ThreadRemover,
) -> None:  # fmt: skip
    """P6: a sweeper process SIGKILLed inside a thread's delete transaction: the database
    rolls it back (the thread whole), its advisory lock goes with its session, and the next
    sweep (not skipped) deletes everything."""
    tid, run_id = full_thread(tstore, tpool, tsettings, rclient, ThreadTTL(PruneStrategy.DELETE, 1))
    before = rows_of(tpool, tid, [run_id])
    env = {**os.environ, **settings_env(tsettings)}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_SWEEPER, LATER.isoformat()],
        env=env,
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("purged"), line
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close() if proc.stdout else None
    assert rows_of(tpool, tid, [run_id]) == before  # rolled back: the thread is whole

    report = sweeper(remover).sweep(at=LATER)
    assert not report.skipped and report.count(ExpiryOutcome.DELETED) >= 1
    after = rows_of(tpool, tid, [run_id])
    assert {t: n for t, n in after.items() if n and t not in OUTLIVING} == {}


def test_p6_old_audit_records_are_pruned(tpool: DictPool, remover: ThreadRemover) -> None:
    """P6: the audit records of thread deletions outlive their threads for
    `audit_retention_days`, then the sweep prunes them; other audit records stay."""
    with tpool.connection() as conn:
        conn.execute(
            "INSERT INTO ops_audit (at, actor, action, params, result) VALUES"
            " (now() - interval '100 days', 'a', 'thread.delete', '{\"thread_id\": \"old\"}', 'deleted'),"
            " (now() - interval '100 days', 'a', 'run.cancel', '{}', 'ok'),"
            " (now() - interval '10 days', 'a', 'thread.delete', '{\"thread_id\": \"new\"}', 'deleted')"
        )
    assert sweeper(remover).sweep().audit_pruned == 1
    with tpool.connection() as conn:
        rows = conn.execute(
            "SELECT action, params->>'thread_id' AS t FROM ops_audit WHERE actor = 'a' ORDER BY 1, 2"
        ).fetchall()
    assert [(r["action"], r["t"]) for r in rows] == [("run.cancel", None), ("thread.delete", "new")]


# --- the API, with the official SDK against the real web app --------------------------


@pytest.fixture(scope="module")
def sdk(
    tsettings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SyncLangGraphClient]:
    """The web app (in process, over WSGI) of a project whose `checkpointer.ttl` gives a
    default TTL of 30 minutes, `keep_latest`; the official SDK client on it."""
    folder = tmp_path_factory.mktemp("ttl-project")
    project = {
        "graphs": {"lead_agent": str(PROJECT_ROOT / "shared/agent/lead_agent.py") + ":graph"},
        "checkpointer": {"ttl": {"strategy": "keep_latest", "default_ttl": 30}},
    }
    (folder / "langgraph.json").write_text(json.dumps(project))
    app = create_app(tsettings.model_copy(update={"config": folder / "langgraph.json"}))
    http = httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://127.0.0.1")
    yield SyncLangGraphClient(http)
    http.close()


def test_p6_sdk_create_and_update_take_a_ttl(sdk: SyncLangGraphClient) -> None:
    """P6/A1: `threads.create(ttl=...)` (minutes, or {strategy, ttl}) and
    `threads.update(ttl=...)`; `get(include=["ttl"])` shows it as the official server does."""
    t = sdk.threads.create(ttl=5)
    got: Any = sdk.threads.get(t["thread_id"], include=["ttl"])
    assert got["ttl"]["strategy"] == "delete" and got["ttl"]["ttl_minutes"] == 5
    assert got["ttl"]["expires_at"]
    sdk.threads.update(
        t["thread_id"], metadata={"a": 1}, ttl={"strategy": "keep_latest", "ttl": 60}
    )
    got = sdk.threads.get(t["thread_id"], include=["ttl"])
    assert got["ttl"]["strategy"] == "keep_latest" and got["ttl"]["ttl_minutes"] == 60
    assert "ttl" not in sdk.threads.get(t["thread_id"])  # only when asked, as the official


def test_p6_default_ttl_from_the_project(sdk: SyncLangGraphClient) -> None:
    """P6: a thread created without a ttl, by POST /threads or by a run with
    `if_not_exists=create`, gets `checkpointer.ttl.default_ttl` and its strategy."""
    t = sdk.threads.create()
    got: Any = sdk.threads.get(t["thread_id"], include=["ttl"])
    assert got["ttl"]["strategy"] == "keep_latest" and got["ttl"]["ttl_minutes"] == 30
    new = str(uuid.uuid4())
    sdk.runs.create(new, "lead_agent", input={"messages": []}, if_not_exists="create")
    got = sdk.threads.get(new, include=["ttl"])
    assert got["ttl"]["strategy"] == "keep_latest" and got["ttl"]["ttl_minutes"] == 30


@pytest.mark.parametrize(
    "ttl",
    [
        -1,
        0,
        "soon",
        True,
        {"ttl": -5},
        {"ttl": 5, "strategy": "archive"},
        {"strategy": "delete"},
    ],  # fmt: skip (an unknown field beside these is ignored, as everywhere: A3)
)
def test_p6_a_bad_ttl_is_a_422_naming_the_field(sdk: SyncLangGraphClient, ttl: Any) -> None:
    """A3/P6: a negative, mistyped or unknown-strategy ttl is a 422 naming `ttl`, on create
    and on update, and nothing is written."""
    before = sdk.threads.count()
    r = sdk.http.client.post("/threads", json={"ttl": ttl})
    assert r.status_code == 422, r.text
    assert "ttl" in r.text
    assert sdk.threads.count() == before
    t = sdk.threads.create(ttl=5)
    r = sdk.http.client.patch(f"/threads/{t['thread_id']}", json={"metadata": {}, "ttl": ttl})
    assert r.status_code == 422 and "ttl" in r.text
