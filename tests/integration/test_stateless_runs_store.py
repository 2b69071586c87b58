"""A1, R2, R5 on real PostgreSQL and Redis: runs without a thread (their temporary thread
is created at admission and deleted durably once every run on it ended), batches
admitted all or nothing, the bulk-cancel selection, and the rate of a batch."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg_pool import ConnectionPool

from shared import lua
from shared.errors import ThreadBusy, ThreadNotFound
from shared.redis_keys import LimitKeys
from shared.runs.model import (
    MultitaskStrategy,
    OnCompletion,
    RunRequest,
    RunStatus,
    ThreadStatus,
)
from shared.runs.store import AdmitItem, RunStore
from shared.runs.temporary import delete_if_finished, purge_finished
from shared.workspaces import thread_workspace

OWNER = "alice"


def stateless(on_completion: OnCompletion = OnCompletion.DELETE) -> RunRequest:
    return RunRequest(
        thread_id=str(uuid.uuid4()),
        assistant_id="lead_agent",
        create_thread=True,
        on_completion=on_completion,
    )


def item(request: RunRequest, strategy: str = "enqueue") -> AdmitItem:
    return AdmitItem(request, str(uuid.uuid4()), "lead_agent", MultitaskStrategy(strategy))


def admit(store: RunStore, request: RunRequest, strategy: str = "enqueue") -> str:
    admission = store.admit_many(OWNER, [item(request, strategy)])[0]
    assert admission.run is not None
    return admission.run.run_id


def end(store: RunStore, run_id: str) -> None:
    """Claim and finish the run: the terminal status committed, as a worker does, and then
    nothing more (the worker died before deleting the thread)."""
    claim = store.claim(run_id, "worker-1")
    assert claim.run is not None, claim.outcome
    fin = store.finish(
        run_id,
        claim.run.thread_id,
        claim.run.owner_epoch,
        status=RunStatus.SUCCESS,
        error=None,
        thread_status=ThreadStatus.IDLE,
    )
    assert not fin.fenced


def checkpoint(pool: ConnectionPool, thread_id: str) -> None:
    """One checkpoint on the thread (as the graph would write)."""
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    PostgresSaver(pool).put(config, empty_checkpoint(), {}, {})


def checkpoints(pool: ConnectionPool, thread_id: str) -> int:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM checkpoints WHERE thread_id = %s", (thread_id,)
        ).fetchone()
    return int(row["n"]) if row else 0


def exists(store: RunStore, thread_id: str) -> bool:
    try:
        store.get_thread(thread_id, OWNER)
    except ThreadNotFound:
        return False
    return True


def workspace(root: Path, thread_id: str) -> Path:
    folder = thread_workspace(root, OWNER, thread_id)
    (folder / "outputs").mkdir(parents=True)
    (folder / "outputs" / "report.md").write_text("r")
    return folder


# --- admission ---------------------------------------------------------------------------
def test_a1_the_temporary_thread_is_created_with_its_run(store: RunStore) -> None:
    """A1: the caller owns the new thread; the run records what happens to it."""
    request = stateless(OnCompletion.KEEP)
    run = store.admit(
        request,
        run_id=str(uuid.uuid4()),
        owner=OWNER,
        graph_id="lead_agent",
        strategy=MultitaskStrategy.ENQUEUE,
    ).run
    assert run is not None and run.thread_id == request.thread_id
    assert run.on_completion is OnCompletion.KEEP and not run.deletes_thread
    assert store.get_thread(request.thread_id, OWNER).status is ThreadStatus.BUSY
    with pytest.raises(ThreadNotFound):
        store.get_thread(request.thread_id, "bob")


def test_r2_a_batch_is_admitted_all_or_nothing(store: RunStore) -> None:
    """R2: two thread runs and one without a thread in one transaction, in request order;
    a missing thread or a busy one under reject refuses the whole batch, naming the item."""
    t1 = store.create_thread(None, OWNER, {}, "raise").thread_id
    t2 = store.create_thread(None, OWNER, {}, "raise").thread_id
    temp = stateless()
    batch = [item(RunRequest(thread_id=t1, assistant_id="a")), item(temp)]
    batch.append(item(RunRequest(thread_id=t2, assistant_id="a")))
    runs = [a.run for a in store.admit_many(OWNER, batch)]
    assert [r.thread_id for r in runs if r] == [t1, temp.thread_id, t2]
    assert [r.on_completion for r in runs if r] == [None, OnCompletion.DELETE, None]

    def count() -> int:
        return sum(
            len(store.list_runs(t, OWNER, limit=100, offset=0, status=None)) for t in (t1, t2)
        )

    before = count()
    missing = str(uuid.uuid4())
    late = stateless()
    with pytest.raises(ThreadNotFound, match="item 2"):
        store.admit_many(
            OWNER,
            [
                item(RunRequest(thread_id=t1, assistant_id="a")),
                item(late),
                item(RunRequest(thread_id=missing, assistant_id="a")),
            ],
        )
    with pytest.raises(ThreadBusy, match="item 1"):
        store.admit_many(
            OWNER,
            [item(stateless()), item(RunRequest(thread_id=t1, assistant_id="a"), "reject")],
        )
    with pytest.raises(ThreadNotFound, match="item 0"):  # bob's batch on alice's thread
        store.admit_many("bob", [item(RunRequest(thread_id=t1, assistant_id="a"))])
    assert count() == before and not exists(store, late.thread_id)


def test_r5_inflight_runs_of_an_owner(store: RunStore) -> None:
    """R5: the bulk-cancel selection: the owner's runs by status, on a thread, by id."""
    tid = store.create_thread(None, "carol", {}, "raise").thread_id
    ids = [
        a.run.run_id
        for a in store.admit_many(
            "carol", [item(RunRequest(thread_id=tid, assistant_id="a")) for _ in range(3)]
        )
        if a.run
    ]
    store.claim(ids[0], "worker-1")
    other = store.create_thread(None, "dave", {}, "raise").thread_id
    store.admit_many("dave", [item(RunRequest(thread_id=other, assistant_id="a"))])

    def select(statuses: set[RunStatus], **kw: object) -> list[str]:
        return [r.run_id for r in store.inflight_runs("carol", statuses, **kw)]

    everything = {RunStatus.PENDING, RunStatus.RUNNING}
    assert select(everything) == ids[::-1]  # newest first, dave's never
    assert select({RunStatus.PENDING}) == ids[:0:-1]
    assert select({RunStatus.RUNNING}) == ids[:1]
    assert select(everything, thread_id=tid, run_ids=[ids[0], ids[2]]) == [ids[2], ids[0]]
    assert select(everything, thread_id=other) == []


# --- the temporary thread goes, durably ----------------------------------------------------------
def test_a1_an_ended_temporary_thread_is_deleted_with_its_checkpoints_and_files(
    store: RunStore, pool: ConnectionPool, tmp_path: Path
) -> None:
    """A1: once its run ended, the thread, its runs, checkpoints and workspace go; not before."""
    request = stateless()
    run_id = admit(store, request)
    tid = request.thread_id
    checkpoint(pool, tid)
    folder = workspace(tmp_path, tid)
    assert not delete_if_finished(store, tid, tmp_path)  # the run is still pending
    end(store, run_id)
    assert delete_if_finished(store, tid, tmp_path)
    assert not exists(store, tid) and store.run_status(run_id) is None
    assert checkpoints(pool, tid) == 0 and not folder.exists()
    assert not delete_if_finished(store, tid, tmp_path)  # once


def test_a1_a_crash_between_the_end_and_the_delete_leaves_nothing_behind(
    store: RunStore, pool: ConnectionPool, tmp_path: Path
) -> None:
    """A1: the worker committed the end and died (no delete): the recovery pass deletes the
    thread after the grace, and never a kept thread or one with a run still inflight."""
    crashed, kept, busy = stateless(), stateless(OnCompletion.KEEP), stateless()
    crashed_run = admit(store, crashed)
    end(store, crashed_run)
    end(store, admit(store, kept))
    end(store, admit(store, busy))
    second = admit(store, RunRequest(thread_id=busy.thread_id, assistant_id="a"))
    checkpoint(pool, crashed.thread_id)
    assert crashed.thread_id not in store.finished_temporary_threads(grace_s=3600)
    assert purge_finished(store, tmp_path, grace_s=3600).deleted == 0
    assert exists(store, crashed.thread_id)
    purge_finished(store, tmp_path, grace_s=0)
    assert not exists(store, crashed.thread_id) and checkpoints(pool, crashed.thread_id) == 0
    assert exists(store, kept.thread_id) and exists(store, busy.thread_id)
    end(store, second)  # the last run on the thread ended: now it goes
    purge_finished(store, tmp_path, grace_s=0)
    assert not exists(store, busy.thread_id)


def test_a1_a_failed_deletion_rolls_back_and_is_retried(
    store: RunStore, pool: ConnectionPool, tmp_path: Path
) -> None:
    """A1: a deletion that fails half-way (its files cannot be removed) leaves the thread,
    its runs and its checkpoints; the next pass deletes them."""
    request = stateless()
    run_id = admit(store, request)
    tid = request.thread_id
    end(store, run_id)
    checkpoint(pool, tid)
    in_place = thread_workspace(tmp_path, OWNER, tid)
    in_place.parent.mkdir(parents=True)
    in_place.write_text("a file where the workspace folder should be")
    with pytest.raises(NotADirectoryError):
        delete_if_finished(store, tid, tmp_path)
    assert exists(store, tid) and checkpoints(pool, tid) == 1
    assert store.run_status(run_id) is RunStatus.SUCCESS
    counts = purge_finished(store, tmp_path, grace_s=0)
    assert counts.failed >= 1 and exists(store, tid)
    in_place.unlink()
    purge_finished(store, tmp_path, grace_s=0)
    assert not exists(store, tid) and checkpoints(pool, tid) == 0


# --- the rate of a batch ------------------------------------------------------------------------
def test_a3_a_batch_conforms_to_the_rate_as_a_whole(
    rclient: redis.Redis, redis_prefix: str
) -> None:
    """A3: a batch of n runs takes n from runs_per_minute, or nothing when refused."""
    rate = lua.register(rclient, "limit_rate")
    key = LimitKeys(redis_prefix).rate(f"user-{uuid.uuid4().hex}")
    limit = 5
    interval = 60_000 / limit
    args = [interval, interval * (limit - 1)]
    assert rate(keys=[key], args=[*args, 3])[0] == 1
    allowed, wait_ms = rate(keys=[key], args=[*args, 3])  # 6 > 5: refused, not counted
    assert allowed == 0 and int(wait_ms) > 0
    assert rate(keys=[key], args=[*args, 2])[0] == 1
    assert rate(keys=[key], args=args)[0] == 0  # the sixth single run
