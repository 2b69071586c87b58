"""B5 after a failover: a stream that lost its tail (the promoted replica never received the
newest entries) is detected by the publisher and repaired — the events it still holds are
republished, a `lost` marker stands for the others — and a subscriber whose cursor saw a
lost entry gets a `gap`, never a silent hole and never a duplicate.

The failover is simulated on one Redis by restoring an older copy of the run's stream and
meta hash (what a replica that lagged behind holds); tests/integration/test_redis_sentinel.py
does it with real Sentinels.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from shared.bridge import publisher as publisher_mod
from shared.bridge.base import Event, Gap, Heartbeat, StreamItem
from shared.bridge.publisher import EventSink, PublishBatcher, StreamPublisher
from shared.bridge.subscriber import StreamSubscriber
from shared.errors import LeaseLost
from shared.redis_keys import Keys
from shared.runs.leases import LeaseManager, RenewOutcome, lease_value
from shared.settings import Settings


def payload(i: int) -> bytes:
    return f'{{"i": {i}}}'.encode()


@dataclass
class World:
    """One run's publisher (a real sink on a real batcher) and subscribers, private keys."""

    settings: Settings
    keys: Keys
    sync: redis.Redis
    run_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def subscriber(self) -> StreamSubscriber:
        return StreamSubscriber(self.sync, self.keys, self.settings)

    def read(self, cursor: str | None) -> list[StreamItem]:
        """Everything after `cursor` until the subscription ends or goes idle."""
        out: list[StreamItem] = []
        for item in self.subscriber().subscribe(self.run_id, cursor, is_terminal=lambda: False):
            if isinstance(item, Heartbeat):
                break
            out.append(item)
        return out

    def datas(self, items: list[StreamItem]) -> list[str]:
        return [i.data for i in items if isinstance(i, Event)]

    def snapshot(self) -> list[tuple[str, bytes, int]]:
        """DUMP of the run's stream and meta hash: what a lagging replica holds."""
        out = []
        for key in (self.keys.stream(self.run_id), self.keys.stream_meta(self.run_id)):
            dumped = self.sync.dump(key)
            assert isinstance(dumped, bytes)
            out.append((key, dumped, int(self.sync.pttl(key))))
        return out

    def fail_over_to(self, snap: list[tuple[str, bytes, int]]) -> None:
        """The promoted replica's copy: the older stream and meta replace the current ones."""
        for key, dumped, ttl in snap:
            self.sync.restore(key, max(ttl, 1), dumped, replace=True)


class Publisher:
    """An attempt's sink on its own loop thread (as in a worker process)."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.lease = lease_value(1, "w1")
        self.call(self._setup())

    async def _setup(self) -> None:
        self.client = aredis.Redis.from_url(self.w.settings.redis_url)
        self.leases = LeaseManager(self.client, self.w.keys, ttl_s=30)
        assert await self.leases.acquire(self.w.run_id, 1, "w1")
        pub = StreamPublisher(self.client, self.w.keys, self.w.settings)
        self.cancels: list[str] = []
        self.lost: list[LeaseLost] = []
        self.sink = EventSink(
            PublishBatcher(pub),
            self.w.run_id,
            self.lease,
            on_cancel=self.cancels.append,
            on_lost=self.lost.append,
        )

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def emit(self, *items: int) -> None:
        async def go() -> None:
            for i in items:
                self.sink.emit("custom", payload(i))
            await self.sink.drain()

        self.call(go())

    def renew_and_check(self) -> None:
        """The lease keeper's tick (workers/lease_keeper.py `LeaseKeeper`): renew, compare the
        stream's sequence with what the sink was answered for, check the tail if behind."""

        async def go() -> None:
            acked = self.sink.acked_seq
            (renewal,) = await self.leases.renew_many(
                [(self.w.run_id, self.lease)], stream_seq=True
            )
            assert renewal.outcome is RenewOutcome.RENEWED
            if renewal.stream_seq < acked:
                self.sink.check_tail()
            await self.sink.drain()

        self.call(go())

    def close(self) -> None:
        self.call(self.client.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


@pytest.fixture
def world(settings: Settings, rclient: redis.Redis) -> World:
    s = settings.model_copy(update={"stream_heartbeat_s": 0.3})
    return World(s, Keys(f"{settings.redis_prefix}tail{uuid.uuid4().hex[:6]}:"), rclient)


def last_id(items: list[StreamItem]) -> str:
    events = [i for i in items if isinstance(i, Event)]
    return events[-1].id


def test_b5_failover_lost_tail_is_republished_and_a_reader_past_it_gets_a_gap(
    world: World,
) -> None:
    """B5, B2: the publisher republishes the lost tail it holds at its next publish; a reader
    from before the loss gets every event once, a reader that saw a lost event gets a gap."""
    pub = Publisher(world)
    try:
        pub.emit(*range(5))
        before = world.read("-1")
        survived = last_id(before)
        older = world.snapshot()
        pub.emit(5, 6, 7)
        seen = world.read("-1")
        assert world.datas(seen) == [payload(i).decode() for i in range(8)]
        lost_ids = [e.id for e in seen if isinstance(e, Event)][5:]

        world.fail_over_to(older)
        pub.emit(8)  # the next publish finds the tail missing and repairs it

        assert (pub.sink.repairs, pub.sink.republished, pub.sink.marked_lost) == (1, 3, 0)
        # From the start, and from the last entry that survived: every event, once, in order.
        assert world.datas(world.read("-1")) == [payload(i).decode() for i in range(9)]
        after = world.read(survived)
        assert world.datas(after) == [payload(i).decode() for i in range(5, 9)]
        assert all(e.id > lost_ids[-1] for e in after if isinstance(e, Event))  # B2
        # A cursor that saw a lost entry: one gap, no duplicate of the republished events.
        for cursor in lost_ids:
            got = world.read(cursor)
            assert len(got) == 1 and isinstance(got[0], Gap), got
            assert got[0].requested_event_id == cursor
    finally:
        pub.close()


def test_b5_lost_tail_beyond_what_the_publisher_holds_is_a_marked_gap(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B5: events the publisher no longer holds are replaced by one `lost` marker: a reader
    that reaches it gets a gap after the events before it, never a silent hole."""
    monkeypatch.setattr(publisher_mod, "TAIL_KEEP_EVENTS", 2)
    pub = Publisher(world)
    try:
        pub.emit(*range(3))
        older = world.snapshot()
        pub.emit(3, 4, 5)  # 3 is held no more (2 kept): lost for good
        world.fail_over_to(older)
        pub.emit(6)
        assert (pub.sink.repairs, pub.sink.republished, pub.sink.marked_lost) == (1, 2, 1)
        got = world.read("-1")
        assert world.datas(got) == [payload(i).decode() for i in range(3)]
        assert isinstance(got[-1], Gap)
        # A reader after the marker reads on normally.
        marker_and_after = world.sync.xrange(world.keys.stream(world.run_id))[3:]
        assert world.datas(world.read(marker_and_after[0][0].decode())) == [
            payload(i).decode() for i in (4, 5, 6)
        ]
    finally:
        pub.close()


def test_b5_idle_publisher_repairs_at_the_lease_renewal_and_a_waiting_rejoin_gets_a_gap(
    world: World,
) -> None:
    """B5, L1: a run that publishes nothing after the failover is repaired by the lease
    keeper's renewal (it reports how far the stream has the attempt's events); a client that
    rejoins meanwhile with a cursor beyond the stream's new end gets a gap, not a 400."""
    pub = Publisher(world)
    try:
        pub.emit(*range(4))
        older = world.snapshot()
        pub.emit(4, 5)
        cursor = last_id(world.read("-1"))
        world.fail_over_to(older)

        got: list[StreamItem] = []
        slow = world.settings.model_copy(update={"stream_heartbeat_s": 3.0})
        rejoin = threading.Thread(
            target=lambda: got.extend(
                StreamSubscriber(world.sync, world.keys, slow).subscribe(
                    world.run_id, cursor, is_terminal=lambda: False
                )
            )
        )
        rejoin.start()
        pub.renew_and_check()
        rejoin.join(timeout=10)
        assert (pub.sink.repairs, pub.sink.republished) == (1, 2)
        assert len(got) == 1 and isinstance(got[0], Gap)
        assert world.datas(world.read("-1")) == [payload(i).decode() for i in range(6)]
        # Nothing lost: the renewal finds the stream complete and sends nothing.
        pub.renew_and_check()
        assert pub.sink.repairs == 1
    finally:
        pub.close()


def test_b5_live_follower_past_the_lost_tail_gets_a_gap(world: World) -> None:
    """B5: a follower blocked after the newest event sees the republished copies' counts go
    back and ends with a gap, without delivering any of them again."""
    pub = Publisher(world)
    try:
        pub.emit(*range(3))
        older = world.snapshot()
        pub.emit(3, 4)
        got: list[StreamItem] = []
        done = threading.Event()
        slow = world.settings.model_copy(update={"stream_heartbeat_s": 5.0})

        def follow() -> None:
            for item in StreamSubscriber(world.sync, world.keys, slow).subscribe(
                world.run_id, "-1", is_terminal=lambda: False
            ):
                got.append(item)
                if isinstance(item, Gap | Heartbeat):
                    break
            done.set()

        t = threading.Thread(target=follow)
        t.start()
        while len(got) < 5:
            assert t.is_alive()
            threading.Event().wait(0.02)
        world.fail_over_to(older)
        pub.emit(5)
        assert done.wait(10)
        assert world.datas(got) == [payload(i).decode() for i in range(5)]
        assert isinstance(got[-1], Gap)
    finally:
        pub.close()
