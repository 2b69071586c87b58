"""Crons on real PostgreSQL and Redis: the firing transaction.

Exactly one run per due tick, enforced by the database: two firers racing over the same
due crons, a firer that reads a stale cron (the firing row's primary key refuses the second
firing, not a lock), and a firer process SIGKILLed while it holds the firing transaction;
missed ticks fire once; disabled, ended, deleted crons and crons of a deleted thread do not
fire; a busy thread under `reject` spends the tick; firings count against their owner's
per-user run limits like every admission.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from psycopg_pool import ConnectionPool

from shared.agent.graphs import GraphRegistry
from shared.assistants.manager import AssistantManager
from shared.assistants.store import AssistantStore
from shared.crons.manager import CronManager, TickReport
from shared.crons.model import CronSpec, FiringOutcome
from shared.crons.store import CronStore
from shared.db import make_pool
from shared.errors import LimitExceeded, ThreadNotFound
from shared.redis_keys import Keys
from shared.runs.limits import RunLimits
from shared.runs.manager import RunManager
from shared.runs.model import MultitaskStrategy, OnCompletion, RunRequest
from shared.runs.store import RunStore
from shared.runs.taskqueue import Dispatcher
from shared.settings import PROJECT_ROOT, Settings
from shared.tools.testing import settings_env

OWNER = "cron-owner"


@pytest.fixture(scope="module")
def cpool(settings: Settings) -> Iterator[ConnectionPool]:
    """Two firers at once: a firing transaction and an assistant lookup each."""
    p = make_pool(settings, name="test-crons", max_size=8)
    yield p
    p.close()


@pytest.fixture(scope="module")
def crons(cpool: ConnectionPool, settings: Settings) -> Iterator[CronManager]:
    assistants = AssistantManager(
        AssistantStore(cpool), GraphRegistry.from_config(PROJECT_ROOT / "langgraph.json")
    )
    assistants.ensure_system()
    client = redis.Redis.from_url(settings.redis_url)
    runs = RunManager(
        RunStore(cpool),
        Dispatcher.of(settings, client),
        client,
        Keys(settings.redis_prefix),
        assistants=assistants,
    )
    yield CronManager(CronStore(cpool), runs, max_per_user=10_000, batch_size=7)
    client.close()


def spec(thread_id: str | None = None, **kw: object) -> CronSpec:
    stateless = thread_id is None
    request = RunRequest(
        thread_id="",
        assistant_id="lead_agent",
        input={"messages": [{"role": "user", "content": "tick"}]},
        create_thread=stateless,
        on_completion=OnCompletion.KEEP if stateless else None,
        multitask_strategy=kw.pop("strategy", None),  # type: ignore[arg-type]
    )
    return CronSpec(
        assistant_id="lead_agent",
        schedule="* * * * *",
        request=request,
        payload={"assistant_id": "lead_agent"},
        thread_id=thread_id,
        on_run_completed=OnCompletion.KEEP if stateless else None,
        **kw,  # type: ignore[arg-type]
    )


def make_due(
    cpool: ConnectionPool, cron_ids: list[str], ago_s: float = 1.0, at: dt.datetime | None = None
) -> None:
    """Set the crons' next tick `ago_s` seconds ago (whole seconds), or `at`."""
    with cpool.connection() as conn:
        conn.execute(
            "UPDATE crons SET next_run_at = coalesce(%s, date_trunc('second', now())"
            " - make_interval(secs => %s)) WHERE cron_id = ANY(%s::uuid[])",
            (at, ago_s, cron_ids),
        )


def runs_of(cpool: ConnectionPool, cron_id: str) -> list[dict[str, object]]:
    with cpool.connection() as conn:
        return list(
            conn.execute(
                "SELECT run_id, thread_id, metadata FROM runs WHERE metadata->>'cron_id' = %s",
                (cron_id,),
            ).fetchall()
        )


def firings_per_tick(cpool: ConnectionPool, cron_ids: list[str]) -> dict[str, list[int]]:
    """Per cron: for each fired tick, how many runs carry the cron's id and that tick's run."""
    out: dict[str, list[int]] = {}
    with cpool.connection() as conn:
        for cid in cron_ids:
            rows = conn.execute(
                "SELECT f.tick_at, count(r.run_id) AS n FROM cron_firings f"
                " LEFT JOIN runs r ON r.metadata->>'cron_id' = f.cron_id::text"
                "  AND r.run_id = f.run_id WHERE f.cron_id = %s GROUP BY f.tick_at",
                (cid,),
            ).fetchall()
            out[cid] = [int(r["n"]) for r in rows]
    return out


def test_two_concurrent_firers_fire_each_tick_once(
    crons: CronManager, cpool: ConnectionPool
) -> None:
    """Crons: two firers over the same 40 due crons (batches of 7, SKIP LOCKED) produce
    exactly one run per cron per tick, twice over (two ticks)."""
    ids = [crons.create(OWNER, spec()).cron_id for _ in range(40)]
    base = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(minutes=5)
    for tick in range(2):
        make_due(cpool, ids, at=base + dt.timedelta(minutes=tick))  # two distinct ticks
        barrier = threading.Barrier(2)

        def fire(_: int, barrier: threading.Barrier = barrier) -> TickReport:
            barrier.wait()
            return crons.tick()

        with ThreadPoolExecutor(2) as pool:
            reports = list(pool.map(fire, range(2)))  # an error in either is raised here
        assert sum(r.admitted for r in reports) == 40, reports
    per_tick = firings_per_tick(cpool, ids)
    assert all(counts == [1, 1] for counts in per_tick.values()), per_tick
    for cid in ids:
        runs = runs_of(cpool, cid)
        assert len(runs) == 2
        assert len({r["thread_id"] for r in runs}) == 2  # a new thread per firing
        cron = crons.get(OWNER, cid)
        assert cron.next_run_at is not None and cron.next_run_at > dt.datetime.now(dt.UTC)


def test_a_stale_firing_admits_nothing(crons: CronManager, cpool: ConnectionPool) -> None:
    """Crons: the uniqueness is the database's — a firer holding a stale copy of a cron
    whose tick already fired (no lock involved) inserts no run: the firing row conflicts."""
    cron = crons.create(OWNER, spec())
    make_due(cpool, [cron.cron_id])
    stale = crons.get(OWNER, cron.cron_id)
    assert crons.tick().admitted >= 1
    after = crons.get(OWNER, cron.cron_id).next_run_at
    with cpool.connection() as conn, conn.transaction():
        now = conn.execute("SELECT now() AS now").fetchone()["now"]  # type: ignore[index]
        fired = crons.store.fire_locked(conn, stale, now, crons._admit, crons._advance)
    assert fired.outcome is None and fired.admission is None
    assert len(runs_of(cpool, cron.cron_id)) == 1
    assert crons.get(OWNER, cron.cron_id).next_run_at == after  # never moved back


HOLDER = """
import sys, time
from shared.settings import Settings
from workers.cron_beat import build_cron_manager

def hold(fired):
    print("HOLDING", len(fired), flush=True)
    time.sleep(120)

build_cron_manager(Settings()).tick(before_commit=hold)
"""


def test_firer_killed_mid_tick_leaves_exactly_one_run(
    crons: CronManager, cpool: ConnectionPool, settings: Settings
) -> None:
    """Crons: a scheduler SIGKILLed while it holds the firing transaction (runs inserted,
    firing rows written, not committed) leaves nothing; meanwhile the other firer skips the
    locked crons; after the kill it fires each of them exactly once."""
    ids = [crons.create(OWNER, spec()).cron_id for _ in range(5)]
    make_due(cpool, ids)
    env = {
        **os.environ,
        **settings_env(settings),
        "THREADRUN_CRON_BATCH_SIZE": "1000",
        "PYTHONPATH": f"{PROJECT_ROOT}:{PROJECT_ROOT / 'clients' / 'python'}",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER], env=env, stdout=subprocess.PIPE, cwd=PROJECT_ROOT
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("HOLDING"), line
        assert int(line.split()[1]) >= 5
        assert crons.tick().admitted == 0  # locked by the holder: skipped, not waited for
        assert all(not runs_of(cpool, cid) for cid in ids)  # nothing committed yet
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the server notices the dead backend quickly
        if crons.tick().admitted or all(runs_of(cpool, cid) for cid in ids):
            break
        time.sleep(0.2)
    assert all(counts == [1] for counts in firings_per_tick(cpool, ids).values())
    assert all(len(runs_of(cpool, cid)) == 1 for cid in ids)


def test_missed_ticks_fire_once(crons: CronManager, cpool: ConnectionPool) -> None:
    """Crons: a cron whose scheduler was down for three hours fires once, not 180 times,
    and its next tick is after now."""
    cron = crons.create(OWNER, spec())
    make_due(cpool, [cron.cron_id], ago_s=3 * 3600)
    crons.tick()
    crons.tick()
    assert len(runs_of(cpool, cron.cron_id)) == 1
    nxt = crons.get(OWNER, cron.cron_id).next_run_at
    assert nxt is not None and nxt > dt.datetime.now(dt.UTC)


def test_disabled_ended_and_deleted_crons_do_not_fire(
    crons: CronManager, cpool: ConnectionPool
) -> None:
    """Crons: disabled crons, crons past their end_time, deleted crons and the crons of a
    deleted thread do not fire."""
    past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    disabled = crons.create(OWNER, spec(enabled=False))
    ended = crons.create(OWNER, spec())
    deleted = crons.create(OWNER, spec())
    thread = crons._runs.store.create_thread(None, OWNER, {}, "raise")
    on_thread = crons.create(OWNER, spec(thread.thread_id))
    ids = [disabled.cron_id, ended.cron_id, deleted.cron_id, on_thread.cron_id]
    make_due(cpool, ids)
    with cpool.connection() as conn:
        conn.execute("UPDATE crons SET end_time = %s WHERE cron_id = %s", (past, ended.cron_id))
    crons.delete(OWNER, deleted.cron_id)
    crons._runs.delete_thread(owner=OWNER, thread_id=thread.thread_id)
    crons.tick()
    assert all(not runs_of(cpool, cid) for cid in ids)
    with pytest.raises(Exception, match="not found"):
        crons.get(OWNER, on_thread.cron_id)  # deleted with its thread


def test_reject_on_a_busy_thread_spends_the_tick(crons: CronManager, cpool: ConnectionPool) -> None:
    """Crons: a firing is an ordinary admission — under multitask_strategy=reject on a busy
    thread the tick is recorded as rejected, and does not fire again."""
    thread = crons._runs.store.create_thread(None, OWNER, {}, "raise")
    busy = RunRequest(thread_id=thread.thread_id, assistant_id="lead_agent")
    crons._runs.admit(OWNER, busy)  # pending: the thread is busy
    cron = crons.create(OWNER, spec(thread.thread_id, strategy=MultitaskStrategy.REJECT))
    make_due(cpool, [cron.cron_id])
    assert crons.tick().rejected == 1
    assert crons.tick().rejected == 0
    firings = crons.store.firings(cron.cron_id)
    assert [f["outcome"] for f in firings] == [FiringOutcome.REJECTED]
    assert not runs_of(cpool, cron.cron_id)


def test_owner_scoping(crons: CronManager) -> None:
    """Crons: another user's cron answers like a missing one."""
    cron = crons.create(OWNER, spec())
    with pytest.raises(Exception, match="not found"):
        crons.get("someone-else", cron.cron_id)
    with pytest.raises(Exception, match="not found"):
        crons.delete("someone-else", cron.cron_id)
    assert crons.get(OWNER, cron.cron_id).cron_id == cron.cron_id
    other = dataclasses.replace(spec(), metadata={"k": "v"})
    crons.create(OWNER, other)
    assert (
        crons.count("someone-else", assistant_id=None, thread_id=None, enabled=None, metadata={})
        == 0
    )


def test_deleting_a_thread_while_its_crons_fire_never_deadlocks(
    crons: CronManager, cpool: ConnectionPool
) -> None:
    """Crons: deleting a thread races a tick firing its crons, many times over. Both
    take the thread's cron rows before the thread row (one lock order), so neither is
    aborted as a deadlock victim (the delete answered 500); each race ends with the thread,
    its crons and its runs gone."""
    errors: list[BaseException] = []
    for _ in range(60):
        thread = crons._runs.store.create_thread(None, OWNER, {}, "raise")
        tid = thread.thread_id
        ids = [crons.create(OWNER, spec(tid)).cron_id for _ in range(3)]
        make_due(cpool, ids)
        barrier = threading.Barrier(2)

        def fire(barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            crons.tick()

        def delete(barrier: threading.Barrier = barrier, tid: str = tid) -> None:
            barrier.wait()
            crons._runs.delete_thread(owner=OWNER, thread_id=tid)

        with ThreadPoolExecutor(2) as ex:
            futures = [ex.submit(fire), ex.submit(delete)]
        errors += [e for f in futures if (e := f.exception()) is not None]
        with cpool.connection() as conn:
            left = conn.execute(
                "SELECT (SELECT count(*) FROM threads WHERE thread_id = %(t)s)"
                " + (SELECT count(*) FROM crons WHERE thread_id = %(t)s)"
                " + (SELECT count(*) FROM runs WHERE thread_id = %(t)s) AS n",
                {"t": tid},
            ).fetchone()
        assert left is not None and left["n"] == 0, tid
    assert errors == [], errors


def test_creating_a_cron_on_a_thread_being_deleted_is_a_404_never_a_500(
    crons: CronManager, cpool: ConnectionPool
) -> None:
    """Crons: a cron created on a thread while the thread is deleted either exists and goes
    with the thread, or is refused as a missing thread (404); never a foreign-key error
    (500), and no cron outlives its thread."""
    errors: list[BaseException] = []
    for _ in range(60):
        tid = crons._runs.store.create_thread(None, OWNER, {}, "raise").thread_id
        barrier = threading.Barrier(2)

        def create(barrier: threading.Barrier = barrier, tid: str = tid) -> None:
            barrier.wait()
            with contextlib.suppress(ThreadNotFound):  # the delete came first: a 404
                crons.create(OWNER, spec(tid))

        def delete(barrier: threading.Barrier = barrier, tid: str = tid) -> None:
            barrier.wait()
            crons._runs.delete_thread(owner=OWNER, thread_id=tid)

        with ThreadPoolExecutor(2) as ex:
            futures = [ex.submit(create), ex.submit(delete)]
        errors += [e for f in futures if (e := f.exception()) is not None]
        with cpool.connection() as conn:
            left = conn.execute("SELECT count(*) AS n FROM crons WHERE thread_id = %s", (tid,))
            row = left.fetchone()
        assert row is not None and row["n"] == 0, tid
    assert errors == [], errors


def limited_crons(
    crons: CronManager, settings: Settings, *, throttled: bool = True, **limits: int
) -> tuple[CronManager, RunLimits]:
    """The fixture's manager with the per-user run limits of `settings` updated by `limits`."""
    client = crons._runs._redis
    run_limits = RunLimits(client, settings.model_copy(update=limits), crons._runs.ended_among)
    manager = CronManager(
        crons.store,
        crons._runs,
        max_per_user=10_000,
        batch_size=7,
        limits=run_limits,
        throttled=lambda subject: throttled,
    )
    return manager, run_limits


def test_a3_a4_cron_firings_count_against_the_owners_active_run_limit(
    crons: CronManager, cpool: ConnectionPool, settings: Settings
) -> None:
    """A4: every way a run is admitted counts against the same per-user limit: 5 due crons
    of a user with `max_active_runs` 3 admit 3 runs and record 2 firings `limited`; the 3
    runs are the user's active set (no reservation left over), so the API's next admission
    is refused too; once they end, the next tick admits again."""
    owner = f"limited-{uuid.uuid4().hex[:8]}"
    manager, run_limits = limited_crons(crons, settings, max_active_runs=3)
    ids = [manager.create(owner, spec()).cron_id for _ in range(5)]
    make_due(cpool, ids)
    report = manager.tick()
    assert (report.admitted, report.limited, report.failed) == (3, 2, 0)
    outcomes = sorted(f["outcome"] for cid in ids for f in manager.store.firings(cid))
    assert outcomes == ["admitted"] * 3 + ["limited"] * 2
    limited = [f for cid in ids for f in manager.store.firings(cid) if f["outcome"] == "limited"]
    assert all("at most 3 pending or running runs" in f["error"] for f in limited)
    admitted = {str(r["run_id"]) for cid in ids for r in runs_of(cpool, cid)}
    assert len(admitted) == 3
    active = {m.decode() for m in client_of(manager).zrange(run_limits.keys.active(owner), 0, -1)}
    assert active == admitted
    assert client_of(manager).zcard(run_limits.keys.reserved(owner)) == 0
    with pytest.raises(LimitExceeded, match="at most 3 pending or running runs"):
        run_limits.reserve(owner)  # what the API's next run of this user gets

    crons._runs.release_active(owner, admitted)  # the runs ended (finalize does this)
    make_due(cpool, ids, ago_s=120)  # another tick
    assert manager.tick().admitted == 3


def test_a3_cron_firings_count_against_the_owners_run_rate(
    crons: CronManager, cpool: ConnectionPool, settings: Settings
) -> None:
    """A3: `runs_per_minute` 2 and 4 due crons: 2 runs, 2 firings `limited` naming the rate;
    a user the limits do not apply to (local single-user mode) fires all of its crons."""
    owner = f"rated-{uuid.uuid4().hex[:8]}"
    manager, _ = limited_crons(crons, settings, runs_per_minute=2)
    ids = [manager.create(owner, spec()).cron_id for _ in range(4)]
    make_due(cpool, ids)
    report = manager.tick()
    assert (report.admitted, report.limited) == (2, 2)
    errors = [f["error"] for cid in ids for f in manager.store.firings(cid) if f["error"]]
    assert errors and all("at most 2 runs per minute" in e for e in errors)

    free, _ = limited_crons(crons, settings, throttled=False, runs_per_minute=2)
    other = f"local-{uuid.uuid4().hex[:8]}"
    ids = [free.create(other, spec()).cron_id for _ in range(4)]
    make_due(cpool, ids)
    assert free.tick().admitted == 4


def client_of(manager: CronManager) -> redis.Redis:
    return manager._runs._redis


def test_a4_a_revoked_owners_cron_and_a_deleted_assistants_cron_are_disabled(
    crons: CronManager, cpool: ConnectionPool
) -> None:
    """A4: a firing whose owner has no credential left, or whose assistant is gone, could
    never admit again: it admits nothing, is recorded `disabled` with the cause, and the
    cron is disabled in the same transaction, so no later tick fails again; another
    owner's cron fires as before."""
    revoked, gone = f"revoked-{uuid.uuid4().hex[:8]}", f"gone-{uuid.uuid4().hex[:8]}"
    manager = CronManager(
        crons.store, crons._runs, max_per_user=10_000, owner_valid=lambda owner: owner != revoked
    )
    of_revoked = manager.create(revoked, spec()).cron_id
    of_gone = manager.create(gone, spec()).cron_id
    fine = manager.create(gone, spec()).cron_id
    missing = str(uuid.uuid4())  # the assistant deleted after the cron was made
    with cpool.connection() as conn:
        conn.execute(
            "UPDATE crons SET assistant_id = %(a)s,"
            " request = jsonb_set(request, '{assistant_id}', to_jsonb(%(a)s::text))"
            " WHERE cron_id = %(c)s",
            {"a": missing, "c": of_gone},
        )
    make_due(cpool, [of_revoked, of_gone, fine])
    report = manager.tick()
    assert (report.admitted, report.disabled, report.failed) == (1, 2, 0)
    for cid, cause in ((of_revoked, "has no active credential"), (of_gone, missing)):
        (firing,) = manager.store.firings(cid)
        assert firing["outcome"] == FiringOutcome.DISABLED and firing["run_id"] is None
        assert cause in firing["error"] and firing["error"].endswith("the cron is disabled")
        assert not runs_of(cpool, cid)
    assert manager.get(revoked, of_revoked).enabled is False
    assert manager.get(gone, of_gone).enabled is False
    assert manager.get(gone, fine).enabled is True

    make_due(cpool, [of_revoked, of_gone, fine], ago_s=120)  # another tick
    assert manager.tick().disabled == 0  # disabled crons are not due any more
    listed = {
        r["cron_id"]: r for r in manager.store.list_any(user_id=None, enabled=False, limit=1000)
    }
    assert listed[uuid.UUID(of_revoked)]["last_outcome"] == "disabled"
    assert manager.store.delete_any(of_revoked) is not None  # what ops may do
    assert manager.store.delete_any(of_revoked) is None
