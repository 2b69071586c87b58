"""The thread stream (A1), the thread stream's walk on real Redis (the runs' own streams, the hub, the
admission notices) with the runs table stood in by a list: consecutive runs in order with
thread ids, exact resume across the run boundary, a new run waking an idle follower at
once, heartbeats, and the gap rules (a gap only when events the client needs are gone).
The runs table queries themselves run on PostgreSQL at the end."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import pytest
import redis

from shared import serde
from shared.bridge.base import END_EVENT, Event, Gap, Heartbeat, StreamItem
from shared.bridge.hub import SubscriptionHub
from shared.bridge.thread_follow import (
    DONE,
    StartAt,
    ThreadCursor,
    ThreadFollower,
    event_id,
    parse_thread_cursor,
)
from shared.errors import StreamCursorInvalid
from shared.runs.model import RunRef, RunStatus
from shared.runs.store import RunStore
from shared.settings import Settings
from tests.integration.test_bridge import Bridge, ev, make_bridge
from tests.integration.test_runs_store import OWNER, admitted, new_thread


@dataclass
class FakeRuns:
    """The runs table of one thread, as a follower reads it."""

    thread_id: str
    runs: list[RunRef] = field(default_factory=list)
    gone: bool = False
    queries: int = 0

    def add(self) -> RunRef:
        ref = RunRef(str(uuid.uuid4()), len(self.runs) + 1, RunStatus.PENDING, False)
        self.runs.append(ref)
        return ref

    def set(self, run_id: str, status: RunStatus, started: bool = True) -> None:
        self.runs = [
            replace(r, status=status, started=started) if r.run_id == run_id else r
            for r in self.runs
        ]

    def follow_start(self, thread_id: str) -> tuple[int | None, int | None]:
        inflight = [r.seq for r in self.runs if not r.status.terminal]
        return (min(inflight) if inflight else None, self.runs[-1].seq if self.runs else None)

    def runs_after(self, thread_id: str, seq: int, limit: int = 1) -> list[RunRef] | None:
        self.queries += 1
        if self.gone:
            return None
        return [r for r in self.runs if r.seq > seq][:limit]

    def run_ref(self, thread_id: str, run_id: str) -> RunRef | None:
        return next((r for r in self.runs if r.run_id == run_id), None)

    def run_status(self, run_id: str) -> RunStatus | None:
        ref = self.run_ref(self.thread_id, run_id)
        return ref.status if ref else None


@dataclass
class World:
    bridge: Bridge
    runs: FakeRuns
    follower: ThreadFollower

    def admit(self) -> RunRef:
        """A run admitted on the thread, announced as RunManager does."""
        ref = self.runs.add()
        self.bridge.sync.xadd(self.bridge.keys.thread_runs(self.runs.thread_id), {"r": ref.run_id})
        return ref

    def execute(self, ref: RunRef, n: int, status: RunStatus = RunStatus.SUCCESS) -> list[str]:
        """The run starts, publishes `metadata` and `n` events, ends: its stream ids."""
        self.runs.set(ref.run_id, RunStatus.RUNNING)
        value = self.bridge.lease(ref.run_id, 1)
        start = serde.dumps({"run_id": ref.run_id, "attempt": 1})
        ids = self.bridge.publish(
            ref.run_id, value, [("metadata", start)] + [ev(i) for i in range(n)]
        )
        self.runs.set(ref.run_id, status)
        end = serde.dumps({"run_id": ref.run_id, "status": status.value})
        return ids + self.bridge.publish(ref.run_id, value, [(END_EVENT, end)], end=True)

    def read(
        self, start: StartAt | ThreadCursor, until: Callable[[list[StreamItem]], bool]
    ) -> list[StreamItem]:
        """Items until `until(items so far)` (checked after each batch), within 10 s."""
        out: list[StreamItem] = []
        deadline = time.monotonic() + 10
        gen = self.follower.follow(self.runs.thread_id, start)
        try:
            for batch in gen:
                out.extend(batch)
                if until(out):
                    return out
                assert time.monotonic() < deadline, out
        finally:
            gen.close()
        return out


def dones(items: list[StreamItem]) -> int:
    return sum(1 for i in items if isinstance(i, Event) and i.id.endswith(f":{DONE}"))


def idle(items: list[StreamItem]) -> bool:
    return bool(items) and isinstance(items[-1], Heartbeat)


def events(items: list[StreamItem]) -> list[Event]:
    return [i for i in items if isinstance(i, Event)]


@pytest.fixture(params=["own-xread", "hub"])
def world(
    request: pytest.FixtureRequest, settings: Settings, rclient: redis.Redis
) -> Iterator[World]:
    hub = SubscriptionHub(rclient, block_ms=200) if request.param == "hub" else None
    bridge = make_bridge(settings, rclient, hub)
    runs = FakeRuns(str(uuid.uuid4()))
    follower = ThreadFollower(
        bridge.subscriber(), runs, rclient, bridge.keys, heartbeat_s=0.2, poll_s=60
    )
    yield World(bridge, runs, follower)
    if hub is not None:
        hub.close()


def expected(w: World, ref: RunRef, ids: list[str]) -> list[str]:
    """The thread ids the run's events get: its stream ids, and `done` for its end."""
    return [event_id(ref.run_id, i) for i in ids[:-1]] + [event_id(ref.run_id, DONE)]


def test_a1_thread_two_runs_in_order_with_thread_ids(world: World) -> None:
    """A1 thread stream: every run of the thread in admission order, each event with `<run>:<id>`
    and the run stream's payload, each run closed by `run_done` with its status."""
    r1, r2 = world.admit(), world.admit()
    ids1 = world.execute(r1, 3)
    ids2 = world.execute(r2, 2, RunStatus.ERROR)
    got = world.read(StartAt.FIRST, idle)
    evs = events(got)
    assert [e.id for e in evs] == expected(world, r1, ids1) + expected(world, r2, ids2)
    assert evs[1].data == '{"i": 0}' and evs[0].event == "metadata"
    done1, done2 = serde.loads(evs[4].data), serde.loads(evs[-1].data)
    assert done1 == {"status": "run_done", "run_id": r1.run_id, "run_status": "success"}
    assert done2["run_status"] == "error" and evs[-1].event == "metadata"
    assert not any(isinstance(i, Gap) for i in got)


def test_b4_thread_resume_mid_run_crosses_the_boundary_exactly(world: World) -> None:
    """A1 thread stream: Last-Event-ID in the first run gets the rest of it, then the second run:
    no duplicate, no loss; `<run>:done` resumes with the next run."""
    r1, r2 = world.admit(), world.admit()
    ids1, ids2 = world.execute(r1, 4), world.execute(r2, 2)
    full = [e.id for e in events(world.read(StartAt.FIRST, idle))]
    for k, cursor in enumerate(full[:-1]):
        got = [e.id for e in events(world.read(parse_thread_cursor(cursor), idle))]  # type: ignore[arg-type]
        assert got == full[k + 1 :], cursor
    assert len(full) == len(ids1) + len(ids2)


def test_a1_thread_live_follower_is_woken_by_the_next_run(world: World) -> None:
    """A1 thread stream: without Last-Event-ID a follower waits (heartbeats) for the next run and
    gets it at once from the admission notice (the fallback poll is 60 s here), then the
    one after; an already finished run is not replayed."""
    old = world.admit()
    world.execute(old, 1)
    got: list[StreamItem] = []
    started = threading.Event()

    def follow() -> None:
        started.set()
        got.extend(world.read(StartAt.LIVE, lambda items: dones(items) >= 2))

    t = threading.Thread(target=follow)
    t.start()
    started.wait()
    time.sleep(0.5)  # idle: heartbeats
    r1 = world.admit()
    ids1 = world.execute(r1, 2)
    time.sleep(0.3)
    r2 = world.admit()
    ids2 = world.execute(r2, 1)
    t.join(10)
    assert not t.is_alive()
    assert any(isinstance(i, Heartbeat) for i in got)
    assert [e.id for e in events(got)] == expected(world, r1, ids1) + expected(world, r2, ids2)


def test_a1_thread_joins_the_run_in_progress_from_its_start(world: World) -> None:
    """A1 thread stream: without Last-Event-ID and with a run in progress, that run from the start
    of what its stream retains (as a run join without a cursor), then the following runs."""
    r1 = world.admit()
    world.runs.set(r1.run_id, RunStatus.RUNNING)
    value = world.bridge.lease(r1.run_id, 1)
    first = world.bridge.publish(r1.run_id, value, [ev(0), ev(1)])
    got: list[StreamItem] = []
    t = threading.Thread(
        target=lambda: got.extend(world.read(StartAt.LIVE, lambda i: dones(i) >= 1))
    )
    t.start()
    time.sleep(0.3)
    rest = world.bridge.publish(r1.run_id, value, [ev(2)])
    world.runs.set(r1.run_id, RunStatus.SUCCESS)
    end = world.bridge.publish(r1.run_id, value, [(END_EVENT, b'{"status": "success"}')], end=True)
    t.join(10)
    assert [e.id for e in events(got)] == expected(world, r1, first + rest + end)


def test_b5_thread_run_cancelled_before_it_started_is_done_not_a_gap(world: World) -> None:
    """A1 thread stream: a run that never ran had no events: its `run_done` (interrupted), no gap;
    a started run whose stream expired had events the client needed: a gap, then its
    `run_done` with the durable status, and the walk goes on."""
    r0 = world.admit()
    world.execute(r0, 1)
    cursor = parse_thread_cursor(event_id(r0.run_id, DONE))
    never, expired, last = world.admit(), world.admit(), world.admit()
    world.runs.set(never.run_id, RunStatus.INTERRUPTED, started=False)
    world.execute(expired, 2)
    world.bridge.sync.delete(world.bridge.keys.stream(expired.run_id))
    world.bridge.sync.delete(world.bridge.keys.stream_meta(expired.run_id))
    ids = world.execute(last, 1)
    got = world.read(cursor, idle)
    gaps = [i for i in got if isinstance(i, Gap)]
    assert [g.run_id for g in gaps] == [expired.run_id]
    statuses = [serde.loads(e.data)["run_status"] for e in events(got) if e.id.endswith(DONE)]
    assert statuses == ["interrupted", "success", "success"]
    assert [e.id for e in events(got)][-3:] == expected(world, last, ids)
    # "-1" asks for what is retained: the expired run is only its run_done there.
    lenient = world.read(StartAt.FIRST, idle)
    assert not any(isinstance(i, Gap) for i in lenient) and dones(lenient) == 4


def test_b5_thread_resume_in_an_expired_run_is_a_gap_then_the_next_runs(world: World) -> None:
    """A1 thread stream: the client's run lost the events after its cursor: a gap (thread ids),
    its `run_done`, then the next run in full; the client's cursor was the run's `end`
    itself: nothing of it is missing, so no gap."""
    r1, r2 = world.admit(), world.admit()
    ids1, ids2 = world.execute(r1, 3), world.execute(r2, 1)
    at_end = world.read(parse_thread_cursor(event_id(r1.run_id, ids1[-1])), idle)  # type: ignore[arg-type]
    assert not any(isinstance(i, Gap) for i in at_end)
    assert [e.id for e in events(at_end)] == [event_id(r1.run_id, DONE)] + expected(world, r2, ids2)
    world.bridge.sync.delete(world.bridge.keys.stream(r1.run_id))
    got = world.read(parse_thread_cursor(event_id(r1.run_id, ids1[1])), idle)  # type: ignore[arg-type]
    assert isinstance(got[0], Gap)
    assert got[0].run_id == r1.run_id
    assert got[0].requested_event_id == event_id(r1.run_id, ids1[1])
    assert [e.id for e in events(got)] == [event_id(r1.run_id, DONE)] + expected(world, r2, ids2)


def test_b5_thread_unknown_run_in_the_cursor_is_a_gap_then_live(world: World) -> None:
    """A1 thread stream: a cursor naming a run the thread no longer has (deleted): the position is
    lost, a gap says so, then the follower goes on as without a cursor."""
    cursor = ThreadCursor(str(uuid.uuid4()), "1-1")
    got = world.read(cursor, idle)
    assert isinstance(got[0], Gap) and got[0].requested_event_id == cursor.encode()


def test_b4_thread_cursor_beyond_the_run_is_a_400(world: World) -> None:
    """A1 thread stream: a well-formed id beyond its run's last event is refused before streaming."""
    r1 = world.admit()
    ids = world.execute(r1, 1)
    ms = int(ids[-1].split("-")[0]) + 1000
    with pytest.raises(StreamCursorInvalid) as err:
        world.follower.check(world.runs.thread_id, event_id(r1.run_id, f"{ms}-0"))
    assert err.value.field == "Last-Event-ID"
    assert world.follower.check(world.runs.thread_id, event_id(r1.run_id, ids[0])) == (
        ThreadCursor(r1.run_id, ids[0])
    )


def test_a1_thread_a_deleted_thread_ends_the_stream(
    settings: Settings, rclient: redis.Redis
) -> None:
    """A1 thread stream: the follower re-reads the runs table every poll interval; once the thread
    is gone the stream ends."""
    bridge = make_bridge(settings, rclient)
    runs = FakeRuns(str(uuid.uuid4()))
    follower = ThreadFollower(
        bridge.subscriber(), runs, rclient, bridge.keys, heartbeat_s=0.1, poll_s=0.3
    )
    gen = follower.follow(runs.thread_id, StartAt.LIVE)
    assert next(gen) == [Heartbeat()]
    runs.gone = True
    rest = list(gen)
    assert all(b == [Heartbeat()] for b in rest) and len(rest) <= 4


def test_a1_thread_runs_table_queries(store: RunStore) -> None:
    """A1 thread stream: the runs table in admission order: the oldest inflight and the newest
    run, the runs after a position, one run of the thread (not another's), and None once
    the thread is deleted."""
    tid = new_thread(store)
    assert store.follow_start(tid) == (None, None)
    assert store.runs_after(tid, 0) == []
    a, b = admitted(store, tid), admitted(store, tid)
    refs = store.runs_after(tid, 0, 10)
    assert refs is not None and [r.run_id for r in refs] == [a, b]
    assert refs[0].seq < refs[1].seq and refs[0].status is RunStatus.PENDING
    assert not refs[0].started
    assert store.follow_start(tid) == (refs[0].seq, refs[1].seq)
    assert store.runs_after(tid, refs[0].seq) == [refs[1]]
    assert store.run_ref(tid, b) == refs[1]
    assert store.run_ref(str(uuid.uuid4()), b) is None
    store.delete_thread(tid, OWNER)
    assert store.runs_after(tid, 0) is None
