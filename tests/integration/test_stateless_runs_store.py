"""A1, R2, R5 on real PostgreSQL and Redis: runs without a thread (their temporary thread
is created at admission and deleted durably once every run on it ended), batches
admitted all or nothing, the bulk-cancel selection, and the rate of a batch."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg_pool import ConnectionPool

from shared import lua
from shared.bridge.base import END_EVENT, Event, Gap, StreamItem
from shared.bridge.publisher import PublishCall, StreamPublisher
from shared.bridge.subscriber import StreamSubscriber
from shared.errors import ThreadBusy, ThreadNotFound
from shared.redis_keys import Keys, LimitKeys
from shared.retention.removal import ThreadRemover
from shared.runs.leases import LeaseManager, lease_value
from shared.runs.model import (
    MultitaskStrategy,
    OnCompletion,
    RunRequest,
    RunStatus,
    ThreadStatus,
)
from shared.runs.store import AdmitItem, RunStore
from shared.settings import Settings
from shared.workspaces import thread_workspace

OWNER = "alice"


@pytest.fixture
def remover(
    store: RunStore, rclient: redis.Redis, redis_prefix: str, tmp_path: Path
) -> ThreadRemover:
    """The one thread-removal path, with its workspace root in `tmp_path`."""
    return ThreadRemover(store, rclient, Keys(redis_prefix), tmp_path)


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
    store: RunStore, pool: ConnectionPool, tmp_path: Path, remover: ThreadRemover
) -> None:
    """A1: once its run ended, the thread, its runs, checkpoints and workspace go; not before."""
    request = stateless()
    run_id = admit(store, request)
    tid = request.thread_id
    checkpoint(pool, tid)
    folder = workspace(tmp_path, tid)
    assert not remover.delete_temporary(tid)  # the run is still pending
    end(store, run_id)
    assert remover.delete_temporary(tid)
    assert not exists(store, tid) and store.run_status(run_id) is None
    assert checkpoints(pool, tid) == 0 and not folder.exists()
    assert not remover.delete_temporary(tid)  # once


def test_a1_a_crash_between_the_end_and_the_delete_leaves_nothing_behind(
    store: RunStore, pool: ConnectionPool, remover: ThreadRemover
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
    assert remover.purge_temporary(grace_s=3600).deleted == 0
    assert exists(store, crashed.thread_id)
    remover.purge_temporary(grace_s=0)
    assert not exists(store, crashed.thread_id) and checkpoints(pool, crashed.thread_id) == 0
    assert exists(store, kept.thread_id) and exists(store, busy.thread_id)
    end(store, second)  # the last run on the thread ended: now it goes
    remover.purge_temporary(grace_s=0)
    assert not exists(store, busy.thread_id)


def test_a1_a_failed_deletion_rolls_back_and_is_retried(
    store: RunStore, pool: ConnectionPool, tmp_path: Path, remover: ThreadRemover
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
        remover.delete_temporary(tid)
    assert exists(store, tid) and checkpoints(pool, tid) == 1
    assert store.run_status(run_id) is RunStatus.SUCCESS
    counts = remover.purge_temporary(grace_s=0)
    assert counts.failed >= 1 and exists(store, tid)
    in_place.unlink()
    remover.purge_temporary(grace_s=0)
    assert not exists(store, tid) and checkpoints(pool, tid) == 0


def publish_ended_run(settings: Settings, keys: Keys, run_id: str, events: int) -> None:
    """A run's stream as its worker leaves it: `events` events, then `end` (with the
    stream's after-end TTL); its lease is left behind, as by a worker that died then."""

    async def go() -> None:
        client = aredis.Redis.from_url(settings.redis_url)
        try:
            assert await LeaseManager(client, keys, ttl_s=30).acquire(run_id, 1, "w1")
            publisher = StreamPublisher(client, keys, settings)
            value = lease_value(1, "w1")
            items = [("custom", f'{{"i": {i}}}'.encode()) for i in range(events)]
            await publisher.publish(PublishCall(run_id, value, 1, items))
            end = [(END_EVENT, f'{{"run_id": "{run_id}", "status": "success"}}'.encode())]
            await publisher.publish(PublishCall(run_id, value, events + 1, end, end=True))
        finally:
            await client.aclose()

    asyncio.run(go())


def test_a1_p6_a_temporary_thread_goes_with_its_keys_but_not_what_its_readers_need(
    store: RunStore,
    pool: ConnectionPool,
    tmp_path: Path,
    remover: ThreadRemover,
    rclient: redis.Redis,
    settings: Settings,
) -> None:
    """A1, P6: the temporary thread goes through the thread-removal path: its row, runs,
    checkpoints and workspace, its admission stream and its runs' lease and cancel keys;
    its run's stream, meta hash and `/wait` answer stay, with the TTL the `end` gave them."""
    keys = Keys(settings.redis_prefix)
    request = stateless()
    run_id = admit(store, request)
    tid = request.thread_id
    checkpoint(pool, tid)
    folder = workspace(tmp_path, tid)
    end(store, run_id)
    publish_ended_run(settings, keys, run_id, events=3)
    rclient.xadd(keys.thread_runs(tid), {"r": run_id})
    rclient.set(keys.cancel(run_id), "interrupt", ex=60)
    rclient.set(keys.result(run_id), b"{}", ex=settings.stream_ttl_after_end_s)
    gone = [keys.thread_runs(tid), keys.lease(run_id), keys.cancel(run_id)]
    kept = [keys.stream(run_id), keys.stream_meta(run_id), keys.result(run_id)]
    assert rclient.exists(*gone) == len(gone) and rclient.exists(*kept) == len(kept)
    assert remover.delete_temporary(tid)
    assert not exists(store, tid) and store.run_status(run_id) is None
    assert checkpoints(pool, tid) == 0 and not folder.exists()
    assert rclient.exists(*gone) == 0
    assert rclient.exists(*kept) == len(kept)
    for key in kept:  # they go by themselves: never a key without a TTL
        assert 0 < rclient.ttl(key) <= settings.stream_ttl_after_end_s


def test_a1_a_slow_reader_of_a_stateless_stream_gets_every_event_through_end(
    store: RunStore, remover: ThreadRemover, rclient: redis.Redis, settings: Settings
) -> None:
    """A1, B4: a `/runs/stream` reader that is still catching up when the run's temporary
    thread is deleted reads every event through `end`, no gap; the same reader loses the
    rest to a gap once the stream itself is gone (a user's delete, which drops it), which
    is why the temporary path leaves the stream to its TTL."""
    keys = Keys(settings.redis_prefix)

    def slow_reader(run_id: str) -> Iterator[StreamItem]:
        subscriber = StreamSubscriber(
            rclient, keys, settings.model_copy(update={"stream_heartbeat_s": 0.2})
        )
        subscriber.batch = 4  # a read of 4 entries at a time: deleted between two reads
        return subscriber.subscribe(run_id, None, is_terminal=lambda: True)

    request = stateless()
    run_id = admit(store, request)
    end(store, run_id)
    publish_ended_run(settings, keys, run_id, events=20)
    reader = slow_reader(run_id)
    first = [next(reader) for _ in range(6)]  # into its second read
    assert remover.delete_temporary(request.thread_id)
    got = first + list(reader)
    assert all(isinstance(e, Event) for e in got), got
    events = [e for e in got if isinstance(e, Event)]
    assert [e.n for e in events] == list(range(1, 22))
    assert events[-1].event == END_EVENT

    # The contrast: the stream dropped under the same kind of reader cuts it short.
    other = stateless()
    other_run = admit(store, other)
    end(store, other_run)
    publish_ended_run(settings, keys, other_run, events=20)
    reader = slow_reader(other_run)
    first = [next(reader) for _ in range(6)]
    rclient.delete(keys.stream(other_run), keys.stream_meta(other_run))
    rest = list(reader)
    assert isinstance(rest[-1], Gap)  # in place of the events after its current read
    assert [e.n for e in first + rest[:-1] if isinstance(e, Event)] == list(range(1, 9))


def test_a1_a_held_temporary_thread_waits_for_the_next_pass(
    store: RunStore, pool: ConnectionPool, remover: ThreadRemover
) -> None:
    """A1: the recovery pass never waits on a thread another transaction holds (its
    `lock_timeout`): it counts it locked, the thread stays whole, the next pass deletes it."""
    request = stateless()
    run_id = admit(store, request)
    end(store, run_id)
    checkpoint(pool, request.thread_id)
    with pool.connection() as holder, holder.transaction():
        holder.execute(
            "SELECT 1 FROM threads WHERE thread_id = %s FOR UPDATE", (request.thread_id,)
        )
        counts = remover.purge_temporary(grace_s=0, lock_timeout_s=0.2)
        assert counts.locked >= 1
    assert exists(store, request.thread_id) and checkpoints(pool, request.thread_id) == 1
    remover.purge_temporary(grace_s=0, lock_timeout_s=0.2)
    assert not exists(store, request.thread_id) and checkpoints(pool, request.thread_id) == 0


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
