"""B1-B7, L2 on real Redis: fenced publish, exact replay, exact gaps, heartbeats, end."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from shared.bridge.base import BEFORE_FIRST, END_EVENT, Event, Gap, Heartbeat
from shared.bridge.hub import SubscriptionHub
from shared.bridge.publisher import PublishCall, StreamPublisher, trim_slack
from shared.bridge.subscriber import StreamSubscriber
from shared.errors import LeaseLost, StreamCursorInvalid
from shared.redis_keys import Keys
from shared.runs.leases import LeaseManager, lease_value
from shared.settings import Settings
from shared.tools.testing.polling import wait_for


@dataclass
class Bridge:
    """Both sides of the bridge on one private prefix, plus helpers to drive them."""

    settings: Settings
    keys: Keys
    sync: redis.Redis
    seqs: dict[tuple[str, str], int] = field(default_factory=dict)
    hub: SubscriptionHub | None = None

    def run(self, coro_fn, *args):  # type: ignore[no-untyped-def]
        async def go():  # type: ignore[no-untyped-def]
            client = aredis.Redis.from_url(self.settings.redis_url)
            try:
                return await coro_fn(client, *args)
            finally:
                await client.aclose()

        return asyncio.run(go())

    def lease(self, run_id: str, epoch: int, owner: str = "w1") -> str:
        async def go(client: aredis.Redis) -> bool:
            return await LeaseManager(client, self.keys, ttl_s=30).acquire(run_id, epoch, owner)

        assert self.run(go)
        return lease_value(epoch, owner)

    def publish(
        self, run_id: str, value: str, events: list[tuple[str, bytes]], end: bool = False
    ) -> list[str]:
        first = self.seqs.get((run_id, value), 1)
        self.seqs[(run_id, value)] = first + len(events)
        return self.publish_call(PublishCall(run_id, value, first, events, end=end))

    def publish_call(self, call: PublishCall) -> list[str]:
        async def go(client: aredis.Redis) -> list[str]:
            res = await StreamPublisher(client, self.keys, self.settings).publish(call)
            return res.ids

        return self.run(go)  # type: ignore[no-any-return]

    def subscriber(self) -> StreamSubscriber:
        return StreamSubscriber(self.sync, self.keys, self.settings, hub=self.hub)

    def read_all(self, run_id: str, cursor: str | None, terminal: bool = True) -> list[object]:
        """Everything until the subscription ends or goes idle (a heartbeat)."""
        out: list[object] = []
        for item in self.subscriber().subscribe(run_id, cursor, is_terminal=lambda: terminal):
            if isinstance(item, Heartbeat):
                break
            out.append(item)
        return out


def make_bridge(
    settings: Settings,
    rclient: redis.Redis,
    hub: SubscriptionHub | None = None,
    **overrides: object,
) -> Bridge:
    s = settings.model_copy(update={"stream_heartbeat_s": 0.2, **overrides})
    return Bridge(s, Keys(f"{settings.redis_prefix}b{uuid.uuid4().hex[:6]}:"), rclient, hub=hub)


@pytest.fixture(params=["own-xread", "hub"])
def hub(request: pytest.FixtureRequest, rclient: redis.Redis) -> Iterator[SubscriptionHub | None]:
    """Followers read on their own, or through the per-process hub."""
    if request.param == "own-xread":
        yield None
        return
    h = SubscriptionHub(rclient, block_ms=200)
    yield h
    h.close()


@pytest.fixture
def bridge(
    settings: Settings, rclient: redis.Redis, hub: SubscriptionHub | None
) -> Iterator[Bridge]:
    yield make_bridge(settings, rclient, hub)


def ev(i: int) -> tuple[str, bytes]:
    return ("custom", f'{{"i": {i}}}'.encode())


def test_b4_replay_is_the_exact_suffix(bridge: Bridge) -> None:
    """B4: after a cursor, exactly the events after it, in order, then `end`."""
    run = str(uuid.uuid4())
    value = bridge.lease(run, 1)
    ids = bridge.publish(run, value, [ev(i) for i in range(10)])
    bridge.publish(run, value, [(END_EVENT, b"{}")], end=True)
    got = bridge.read_all(run, ids[3])
    assert [g.id for g in got[:-1]] == ids[4:]  # type: ignore[attr-defined]
    assert isinstance(got[-1], Event) and got[-1].event == END_EVENT
    # B7: a join after the end gets the retained tail, then `end`.
    assert len(bridge.read_all(run, "-1")) == 11


def test_b2_ids_strictly_increase(bridge: Bridge) -> None:
    """B2: ids strictly increase within a run, across publish calls."""
    run = str(uuid.uuid4())
    value = bridge.lease(run, 1)
    ids = bridge.publish(run, value, [ev(i) for i in range(5)]) + bridge.publish(
        run, value, [ev(5)]
    )
    parsed = [tuple(map(int, i.split("-"))) for i in ids]
    assert parsed == sorted(parsed) and len(set(parsed)) == len(parsed)


def test_l2_stale_owner_cannot_publish(bridge: Bridge) -> None:
    """L2: once a newer epoch holds the lease, the old owner's publish is rejected."""
    run = str(uuid.uuid4())
    old = bridge.lease(run, 1, "old")
    bridge.publish(run, old, [ev(0)])
    new = bridge.lease(run, 2, "new")
    with pytest.raises(LeaseLost):
        bridge.publish(run, old, [ev(1)])
    bridge.publish(run, new, [ev(2)])

    # The stale epoch can never take the lease back.
    async def reclaim(client: aredis.Redis) -> bool:
        return await LeaseManager(client, bridge.keys, ttl_s=30).acquire(run, 1, "old")

    assert bridge.run(reclaim) is False
    datas = [e.data for e in bridge.read_all(run, "-1", terminal=False)[:2]]  # type: ignore[attr-defined]
    assert datas == ['{"i": 0}', '{"i": 2}']


def test_l1_release_drops_only_its_own_lease_and_an_ended_runs_cancel(bridge: Bridge) -> None:
    """L1: a stale owner's release leaves the newer owner's lease; the owner's release at
    the end (`ended=True`) drops its lease and the run's pending cancel request, in one call;
    a release that is not at the end leaves the cancel request."""
    run = str(uuid.uuid4())
    old = bridge.lease(run, 1, "old")
    new = bridge.lease(run, 2, "new")
    cancel_key = bridge.keys.cancel(run)

    async def release(client: aredis.Redis, value: str, ended: bool) -> bool:
        return await LeaseManager(client, bridge.keys, ttl_s=30).release(run, value, ended=ended)

    bridge.sync.set(cancel_key, "interrupt")
    assert bridge.run(release, old, False) is False
    assert bridge.sync.get(bridge.keys.lease(run)) == new.encode()
    assert bridge.sync.exists(cancel_key)
    assert bridge.run(release, new, True) is True
    assert not bridge.sync.exists(bridge.keys.lease(run))
    assert not bridge.sync.exists(cancel_key)


def test_b4_retried_publish_adds_nothing_twice(bridge: Bridge) -> None:
    """B4: a publish retried after a lost reply (same sequence numbers) never duplicates events."""
    run = str(uuid.uuid4())
    value = bridge.lease(run, 1)
    call = PublishCall(run, value, 1, [ev(0), ev(1), ev(2)])
    assert len(bridge.publish_call(call)) == 3
    assert bridge.publish_call(call) == []
    overlap = PublishCall(run, value, 3, [ev(2), ev(3)])
    assert len(bridge.publish_call(overlap)) == 1
    datas = [e.data for e in bridge.read_all(run, "-1", terminal=False)]  # type: ignore[attr-defined]
    assert datas == [f'{{"i": {i}}}' for i in range(4)]


def test_l2_no_lease_no_publish(bridge: Bridge) -> None:
    """L2: without a lease nothing is written."""
    run = str(uuid.uuid4())
    with pytest.raises(LeaseLost):
        bridge.publish(run, lease_value(1, "w"), [ev(0)])
    assert not bridge.sync.exists(bridge.keys.stream(run))


def test_b5_gap_is_exact(settings: Settings, rclient: redis.Redis) -> None:
    """B5: a gap exactly when something after the cursor was trimmed, with the bounds."""
    b = make_bridge(settings, rclient, stream_maxlen=10)
    run = str(uuid.uuid4())
    value = b.lease(run, 1)
    ids = b.publish(run, value, [ev(i) for i in range(40)])
    retained = [e[0].decode() for e in rclient.xrange(b.keys.stream(run))]
    first = ids.index(retained[0])
    assert first > 0
    # The cursor is the newest trimmed event: nothing after it is missing -> no gap.
    got = b.read_all(run, ids[first - 1], terminal=False)
    assert not any(isinstance(g, Gap) for g in got[:10])
    assert [g.id for g in got if isinstance(g, Event)][:3] == retained[:3]
    # One event further back: exactly one gap, then the subscription ends.
    got = b.read_all(run, ids[first - 2])
    assert got == [Gap(run, ids[first - 2], retained[0], retained[-1])]


def test_b4_cursor_beyond_last_is_a_client_error(bridge: Bridge) -> None:
    """B4: a cursor after the last id is a client error, not a hang or a Redis error."""
    run = str(uuid.uuid4())
    value = bridge.lease(run, 1)
    ids = bridge.publish(run, value, [ev(0)])
    ms, seq = ids[0].split("-")
    with pytest.raises(StreamCursorInvalid):
        bridge.subscriber().check_cursor(run, f"{int(ms) + 10_000}-0")
    with pytest.raises(StreamCursorInvalid):
        bridge.subscriber().check_cursor(run, "gar bage")


def test_b5_missing_stream_of_terminal_run_is_a_gap(bridge: Bridge) -> None:
    """B5: an unknown/expired stream of a terminal run is answered with a gap (nulls)."""
    run = str(uuid.uuid4())
    assert bridge.read_all(run, None, terminal=True) == [Gap(run, None, None, None)]
    assert bridge.read_all(run, "1-0", terminal=False) == [Gap(run, "1-0", None, None)]


def test_b5_a_run_that_starts_and_ends_during_the_first_read_is_no_gap(
    bridge: Bridge,
) -> None:
    """B5: the first read finds no stream; before the terminal answer comes
    back the run starts, publishes everything and ends. The subscriber reads again and
    delivers every event and `end` (before the fix: one gap with null bounds)."""
    run = str(uuid.uuid4())
    value = bridge.lease(run, 1)

    def run_meanwhile() -> bool:
        bridge.publish(run, value, [ev(i) for i in range(5)])
        bridge.publish(run, value, [(END_EVENT, b"{}")], end=True)
        return True

    got = list(bridge.subscriber().subscribe(run, None, is_terminal=run_meanwhile))
    assert [type(g) for g in got] == [Event] * 6
    assert [g.data for g in got[:5]] == [f'{{"i": {i}}}' for i in range(5)]  # type: ignore[attr-defined]
    assert got[-1].event == END_EVENT  # type: ignore[attr-defined]


def test_b5_a_run_cancelled_while_pending_ends_with_its_status(
    bridge: Bridge,
) -> None:
    """B5: a run that ended before it started has no stream; a subscriber
    from the start (or resuming after that `end`) gets `end` with the status, not a gap."""
    run = str(uuid.uuid4())
    for cursor in (None, "-1", "0-1"):
        got = list(
            bridge.subscriber().subscribe(
                run, cursor, is_terminal=lambda: True, unstarted_end=lambda: "interrupted"
            )
        )
        assert len(got) == 1 and isinstance(got[0], Event), got
        assert got[0].event == END_EVENT
        assert json.loads(got[0].data) == {"run_id": run, "status": "interrupted"}


def test_b6_heartbeat_while_waiting(bridge: Bridge) -> None:
    """B6: an idle subscription yields heartbeats."""
    run = str(uuid.uuid4())
    it = bridge.subscriber().subscribe(run, None, is_terminal=lambda: False)
    assert isinstance(next(it), Heartbeat)


def test_b4_live_follow_then_end(bridge: Bridge) -> None:
    """B4: a subscriber that caught up follows live events in order until `end`."""
    run = str(uuid.uuid4())
    value = bridge.lease(run, 1)
    bridge.publish(run, value, [ev(0)])
    got: list[object] = []
    t = threading.Thread(target=lambda: got.extend(bridge.read_all(run, "-1", terminal=False)))
    t.start()
    for i in range(1, 6):
        bridge.publish(run, value, [ev(i)])
    bridge.publish(run, value, [(END_EVENT, b"{}")], end=True)
    t.join(timeout=10)
    events = [g for g in got if isinstance(g, Event)]
    assert [e.data for e in events[:-1]] == [f'{{"i": {i}}}' for i in range(6)]
    assert events[-1].event == END_EVENT


def test_b5_live_follower_that_falls_behind_gets_a_gap(
    settings: Settings, rclient: redis.Redis, hub: SubscriptionHub | None
) -> None:
    """B5: a follower whose next events were trimmed while it waited gets a gap, not a silent skip."""
    b = make_bridge(settings, rclient, hub, stream_maxlen=5)
    run = str(uuid.uuid4())
    value = b.lease(run, 1)
    b.publish(run, value, [ev(0)])
    it = b.subscriber().subscribe(run, "-1", is_terminal=lambda: False)
    first = next(it)
    assert isinstance(first, Event)
    b.publish(run, value, [ev(i) for i in range(1, 40)])
    rest = []
    for item in it:
        rest.append(item)
    assert isinstance(rest[-1], Gap) and len([r for r in rest if isinstance(r, Gap)]) == 1


def test_b3_retention_is_bounded_and_expires_after_end(
    settings: Settings, rclient: redis.Redis
) -> None:
    """B3: retention stays near maxlen; the stream expires a while after `end`."""
    b = make_bridge(settings, rclient, stream_maxlen=20, stream_ttl_after_end_s=120)
    run = str(uuid.uuid4())
    value = b.lease(run, 1)
    for _ in range(10):
        b.publish(run, value, [ev(i) for i in range(30)])
    assert rclient.xlen(b.keys.stream(run)) <= 20 + trim_slack(20)
    b.publish(run, value, [(END_EVENT, b"{}")], end=True)
    assert 0 < rclient.ttl(b.keys.stream(run)) <= 120


# --- property test: random publish / subscribe against a model -------------------------------
ops = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(min_value=1, max_value=25)),
        st.tuples(st.just("subscribe"), st.integers(min_value=-1, max_value=400)),
    ),
    min_size=1,
    max_size=25,
)


@hsettings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops, maxlen=st.integers(min_value=3, max_value=40))
def test_b5_property_exact_suffix_or_exactly_one_gap(
    settings: Settings, rclient: redis.Redis, ops: list[tuple[str, int]], maxlen: int
) -> None:
    """B4/B5: every subscription is the exact suffix, or exactly one gap iff something after it was trimmed."""
    b = make_bridge(settings, rclient, stream_maxlen=maxlen, stream_heartbeat_s=0.01)
    run = str(uuid.uuid4())
    value = b.lease(run, 1)
    published: list[str] = []
    try:
        for op, arg in ops:
            if op == "publish":
                published += b.publish(run, value, [ev(len(published) + i) for i in range(arg)])
                continue
            retained = [e[0].decode() for e in rclient.xrange(b.keys.stream(run))]
            if not published:
                continue
            if arg < 0:
                cursor, idx = "-1", -1
            else:
                idx = arg % len(published)
                cursor = published[idx]
            got = []
            for item in b.subscriber().subscribe(run, cursor, is_terminal=lambda: True):
                if isinstance(item, Heartbeat):
                    break
                got.append(item)
                if isinstance(item, Gap):
                    break
            first_kept = published.index(retained[0]) if retained else len(published)
            if idx >= 0 and first_kept > idx + 1:
                assert got == [Gap(run, cursor, retained[0], retained[-1])]
            else:
                expected = published[max(idx + 1, first_kept) :]
                assert [g.id for g in got] == expected  # type: ignore[attr-defined]
    finally:
        rclient.delete(b.keys.stream(run), b.keys.stream_meta(run), b.keys.lease(run))


def test_b1_hub_serves_many_subscribers_exactly(
    settings: Settings, rclient: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B1/B4: one hub, 3 runs x 4 subscribers joining at different cursors: each gets its exact
    suffix; a subscriber that overflows its queue catches up on its own, still exact."""
    import shared.bridge.hub as hub_mod

    monkeypatch.setattr(hub_mod, "QUEUE_LIMIT", 7)
    hub = SubscriptionHub(rclient, block_ms=200)
    b = make_bridge(settings, rclient, hub)
    try:
        runs = [str(uuid.uuid4()) for _ in range(3)]
        leases = {r: b.lease(r, 1) for r in runs}
        first = {r: b.publish(r, leases[r], [ev(i) for i in range(5)]) for r in runs}
        results: dict[tuple[str, int], list[object]] = {}

        def follow(run: str, k: int) -> None:
            cursor = "-1" if k == 0 else first[run][k]
            got = []
            for item in b.subscriber().subscribe(run, cursor, is_terminal=lambda: False):
                if not isinstance(item, Heartbeat):
                    got.append(item)
            results[(run, k)] = got

        threads = [threading.Thread(target=follow, args=(r, k)) for r in runs for k in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        for r in runs:
            for i in range(5, 45, 5):
                b.publish(r, leases[r], [ev(j) for j in range(i, i + 5)])
            b.publish(r, leases[r], [(END_EVENT, b"{}")], end=True)
        for t in threads:
            t.join(timeout=20)
        for (run, k), got in results.items():
            datas = [g.data for g in got if isinstance(g, Event) and g.event != END_EVENT]  # type: ignore[attr-defined]
            start = 0 if k == 0 else k + 1
            assert datas == [f'{{"i": {i}}}' for i in range(start, 45)], (run, k)
            assert isinstance(got[-1], Event) and got[-1].event == END_EVENT
        assert hub.followed == 0
    finally:
        hub.close()


def test_b7_joining_at_the_end_event_closes_at_once(bridge: Bridge) -> None:
    """B7: a cursor equal to the `end` event's id has nothing after it: the subscription ends."""
    run = str(uuid.uuid4())
    value = bridge.lease(run, 1)
    bridge.publish(run, value, [ev(0)])
    end_id = bridge.publish(run, value, [(END_EVENT, b"{}")], end=True)[0]
    items = list(bridge.subscriber().subscribe(run, end_id, is_terminal=lambda: True))
    assert items == []


def test_b5_before_first_cursor_reports_a_trimmed_start(
    settings: Settings, rclient: redis.Redis
) -> None:
    """B5: 0-0 (before the first event) replays everything, or a gap once the start is gone."""
    b = make_bridge(settings, rclient, stream_maxlen=5)
    run = str(uuid.uuid4())
    value = b.lease(run, 1)
    b.publish(run, value, [ev(0), ev(1)])
    assert len(b.read_all(run, "0-0", terminal=False)) == 2
    b.publish(run, value, [ev(i) for i in range(2, 30)])
    got = b.read_all(run, "0-0", terminal=False)
    assert len(got) == 1 and isinstance(got[0], Gap)


def test_b4_before_first_cursor_waits_for_a_pending_run(bridge: Bridge) -> None:
    """B4: `Last-Event-ID: 0-0` on a run that has not started (no stream yet,
    not terminal) answered an immediate gap with null bounds; it waits like `-1`, then gets
    every event and `end`."""
    run = str(uuid.uuid4())
    it = bridge.subscriber().subscribe(run, "0-0", is_terminal=lambda: False)
    assert isinstance(next(it), Heartbeat)
    value = bridge.lease(run, 1)
    ids = bridge.publish(run, value, [ev(i) for i in range(3)])
    bridge.publish(run, value, [(END_EVENT, b"{}")], end=True)
    got = [item for item in it if not isinstance(item, Heartbeat)]
    assert [g.id for g in got[:3]] == ids  # type: ignore[attr-defined]
    assert isinstance(got[-1], Event) and got[-1].event == END_EVENT and len(got) == 4
    # A run that ended without a stream is still a gap, whatever the cursor.
    gone = str(uuid.uuid4())
    assert bridge.read_all(gone, "0-0", terminal=True) == [Gap(gone, "0-0", None, None)]


def test_b5_hub_rewind_during_a_read_never_makes_a_false_gap(rclient: redis.Redis) -> None:
    """B5: a subscriber attaching behind the hub while a read is in flight gets neither a
    batch that starts after a hole (a false gap) nor a position that skips its entries."""
    hub = SubscriptionHub(rclient, block_ms=200)
    key = "trt:hubrace:stream"

    def entry(i: int) -> tuple[bytes, dict[bytes, bytes]]:
        return (f"{i}-0".encode(), {b"e": b"custom", b"d": b"{}", b"n": str(i).encode()})

    try:
        ahead = hub.attach(key, "5-0")
        hub._deliver({key: "5-0"}, [])  # nothing read yet
        behind = hub.attach(key, "2-0")  # rewinds the position while "a read from 5-0" is in flight
        hub._deliver({key: "5-0"}, [(key.encode(), [entry(i) for i in range(6, 11)])])
        assert hub._positions[key] == "2-0"  # the rewind is kept: the next read starts at 2
        assert [e[0] for e in ahead.take(1)] == [f"{i}-0".encode() for i in range(6, 11)]
        with pytest.raises(queue.Empty):
            behind.take(0.05)  # it did not get a batch that starts after a hole
        hub._deliver({key: "2-0"}, [(key.encode(), [entry(i) for i in range(3, 12)])])
        assert [e[0] for e in behind.take(1)][0] == b"3-0"
        assert hub._positions[key] == "11-0"
        hub.detach(ahead)
        hub.detach(behind)
    finally:
        hub.close()


def _admitted(b: Bridge, run: str, **kwargs: object) -> Iterator[object]:
    """A subscription of a run its caller has just admitted (from before its first event)."""
    for batch in b.subscriber().subscribe_batches(run, BEFORE_FIRST, admitted=True, **kwargs):  # type: ignore[arg-type]
        yield from batch


def test_b4_an_admitted_run_is_followed_from_its_first_event_without_a_terminal_query(
    bridge: Bridge,
) -> None:
    """B4/B6: a stream created with its run follows it live at once: every event in order
    and `end`, whether the first events were published before the subscriber started (a
    fast worker) or after; PostgreSQL (`is_terminal`) is not asked while events flow."""
    asked: list[str] = []

    def terminal() -> bool:
        asked.append("terminal")
        return False

    for early in (0, 2):
        run = str(uuid.uuid4())
        value = bridge.lease(run, 1)
        ids = bridge.publish(run, value, [ev(i) for i in range(early)]) if early else []
        it = _admitted(bridge, run, is_terminal=terminal)
        if early:
            assert [next(it) for _ in range(early)] == [
                Event(ids[i], "custom", f'{{"i": {i}}}') for i in range(early)
            ]
        ids += bridge.publish(run, value, [ev(i) for i in range(early, 5)])
        bridge.publish(run, value, [(END_EVENT, b"{}")], end=True)
        rest = [item for item in it if not isinstance(item, Heartbeat)]
        assert [e.id for e in rest[:-1]] == ids[early:]  # type: ignore[attr-defined]
        assert isinstance(rest[-1], Event) and rest[-1].event == END_EVENT
    assert asked == []


def test_b5_an_admitted_run_whose_start_was_trimmed_is_a_gap(
    settings: Settings, rclient: redis.Redis, hub: SubscriptionHub | None
) -> None:
    """B5: the first entry an admitted subscription reads must be the run's first (count 1):
    a start trimmed before the subscriber's first read is a gap, never a silent hole."""
    b = make_bridge(settings, rclient, hub, stream_maxlen=5)
    run = str(uuid.uuid4())
    value = b.lease(run, 1)
    b.publish(run, value, [ev(i) for i in range(30)])
    got = list(_admitted(b, run, is_terminal=lambda: False))
    assert len(got) == 1 and isinstance(got[0], Gap), got


def test_b5_an_admitted_run_cancelled_while_pending_ends_with_its_status(
    bridge: Bridge,
) -> None:
    """B5/B6: an admitted run that ends before it starts (cancelled while pending: no
    stream) gives its subscriber `end` with the status at its first idle heartbeat."""
    run = str(uuid.uuid4())
    got = list(
        _admitted(bridge, run, is_terminal=lambda: True, unstarted_end=lambda: "interrupted")
    )
    assert len(got) == 1 and isinstance(got[0], Event), got
    assert got[0].event == END_EVENT
    assert json.loads(got[0].data) == {"run_id": run, "status": "interrupted"}


def test_b1_the_hub_keeps_its_connection_between_streams_for_its_linger(
    rclient: redis.Redis,
) -> None:
    """B1: after its last follower leaves, the hub keeps its Redis connection for
    `stream_hub_linger_s`, so the next stream's first event does not wait for a reconnect;
    with no linger it closes it and its reader ends."""

    def connected(conn_id: int) -> bool:
        return any(int(c["id"]) == conn_id for c in rclient.client_list())

    key = f"hub-linger-{uuid.uuid4().hex}"
    lingering = SubscriptionHub(rclient, block_ms=200, linger_s=30)
    try:
        sub = lingering.attach(key, "0-0")
        first = wait_for(lambda: lingering._conn_id, interval=0.02, what="the hub's connection")
        lingering.detach(sub)
        time.sleep(0.5)  # the reader has seen that nothing is followed
        assert lingering.followed == 0 and connected(first)
        rclient.xadd(key, {"e": "x"})
        again = lingering.attach(key, "0-0")
        assert again.take(timeout=10) is not None
        assert lingering._conn_id == first
        lingering.detach(again)
    finally:
        lingering.close()
        rclient.delete(key)
    closing = SubscriptionHub(rclient, block_ms=200, linger_s=0)
    try:
        sub = closing.attach(key, "0-0")
        conn_id = wait_for(lambda: closing._conn_id, interval=0.02, what="the hub's connection")
        closing.detach(sub)
        wait_for(lambda: not connected(conn_id), interval=0.02, what="the connection to close")
    finally:
        closing.close()


@pytest.mark.parametrize("maxlen", [1000, 10])
def test_b4_b5_a_position_is_a_cursor_exactly(
    settings: Settings, rclient: redis.Redis, maxlen: int
) -> None:
    """B4/B5 for the thread streaming protocol's `since` (an entry's position `n`): reading
    after `cursor_before_entry(n)` starts exactly at entry n, for every n still retained (the
    oldest one included, through the trimmed mark); a position whose entry was trimmed, or
    that was never published, is None (the reader's gap), never a silent skip."""
    b = make_bridge(settings, rclient, stream_maxlen=maxlen)
    run = str(uuid.uuid4())
    value = b.lease(run, 1)
    ids = b.publish(run, value, [ev(i) for i in range(40)])
    sub = b.subscriber()
    oldest = int(rclient.xrange(b.keys.stream(run), count=1)[0][1][b"n"])
    assert (oldest > 1) == (maxlen == 10)
    for n in range(1, 42):
        cursor = sub.cursor_before_entry(run, n)
        if n == 1:  # from the very first event: checked, a gap when it was trimmed
            assert cursor == BEFORE_FIRST
            if oldest > 1:
                assert isinstance(b.read_all(run, cursor, terminal=False)[0], Gap)
                continue
        elif n < oldest or n > 40:
            assert cursor is None, n
            continue
        assert cursor is not None, n
        first = next(iter(sub.subscribe(run, cursor, is_terminal=lambda: False)))
        assert isinstance(first, Event) and (first.id, first.n) == (ids[n - 1], n)


def test_b4_a_wait_for_a_stream_stays_attached_across_heartbeats(
    settings: Settings, rclient: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B4: a client waiting for a run that has not started (or a thread with no run) waits
    one heartbeat at a time on ONE hub subscription: before, each heartbeat attached and
    detached again, two hub wakes and a new XREAD over every followed stream per idle
    client, and 5,000 idle thread streams took 74 % of a web process's core. The first
    entry still ends the wait; closing it leaves the hub following nothing."""
    hub = SubscriptionHub(rclient, block_ms=200)
    b = make_bridge(settings, rclient, hub)
    attaches = 0
    attach = hub.attach

    def counted(key: str, cursor: str) -> Any:
        nonlocal attaches
        attaches += 1
        return attach(key, cursor)

    monkeypatch.setattr(hub, "attach", counted)
    run = str(uuid.uuid4())
    try:
        with b.subscriber().entry_wait(b.keys.stream(run)) as waiting:
            assert [waiting.wait() for _ in range(3)] == [False, False, False]
            assert attaches == 1 and hub.followed == 1
            b.publish(run, b.lease(run, 1), [ev(0)])
            assert waiting.wait()
        assert attaches == 1 and hub.followed == 0
    finally:
        hub.close()
