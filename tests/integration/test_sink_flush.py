"""`EventSink.flush`, the stream gate's wait (B5, shared/state/savers.py): it returns once
every event emitted before it is in the stream, and raises once the sink dropped one."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
import redis
import redis.asyncio as aredis

from shared.bridge import publisher
from shared.bridge.base import LOST_EVENT
from shared.bridge.publisher import EventSink, PublishBatcher, StreamPublisher
from shared.bridge.subscriber import StreamSubscriber
from shared.redis_keys import Keys
from shared.runs.leases import LeaseManager, lease_value
from shared.runs.model import Run
from shared.settings import Settings
from shared.tools.devservices import free_port
from workers.attempts import RunAttempt
from workers.executor import stream_gate


def test_b5_flush_returns_once_earlier_events_are_in_the_stream(
    settings: Settings, rclient: redis.Redis
) -> None:
    keys = Keys(f"{settings.redis_prefix}flush{uuid.uuid4().hex[:6]}:")
    run_id = str(uuid.uuid4())

    async def go() -> None:
        client = aredis.Redis.from_url(settings.redis_url)
        try:
            assert await LeaseManager(client, keys, ttl_s=30).acquire(run_id, 1, "w1")
            batcher = PublishBatcher(StreamPublisher(client, keys, settings))
            sink = EventSink(batcher, run_id, lease_value(1, "w1"), lambda _a: None, print)
            await sink.flush()  # nothing emitted: returns at once
            for i in range(300):  # more than one call's worth (MAX_EVENTS_PER_CALL)
                sink.emit("messages", b'{"i": %d}' % i)
            await sink.flush()
            assert rclient.xlen(keys.stream(run_id)) == 300
        finally:
            await client.aclose()

    asyncio.run(go())


def test_b5_flush_raises_once_the_sink_dropped_an_event(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publisher, "PUBLISH_RETRY_DELAYS_S", (0.01,))
    keys = Keys(f"{settings.redis_prefix}flush{uuid.uuid4().hex[:6]}:")

    async def go() -> None:
        dead = aredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
        try:
            batcher = PublishBatcher(StreamPublisher(dead, keys, settings))
            sink = EventSink(batcher, str(uuid.uuid4()), lease_value(1, "w1"), print, print)
            sink.emit("messages", b"{}")
            with pytest.raises(redis.ConnectionError):
                await sink.flush()
            with pytest.raises(redis.ConnectionError):  # sticky: later events are dropped
                await sink.flush()
        finally:
            await dead.aclose()

    asyncio.run(go())


class _Cuttable:
    """A StreamPublisher's `publish_many` that fails while `cut`; with `lose_reply`, a cut
    call is applied by Redis first (its reply lost with the connection)."""

    def __init__(self, pub: StreamPublisher) -> None:
        self.real = pub.publish_many
        self.cut = False
        self.lose_reply = False
        pub.publish_many = self  # type: ignore[method-assign]

    async def __call__(
        self, calls: list[publisher.PublishCall]
    ) -> list[publisher.PublishResult | Exception]:
        if self.cut:
            if self.lose_reply:
                await self.real(calls)
            raise redis.ConnectionError("cut")
        return await self.real(calls)


def _names(rclient: redis.Redis, key: str) -> list[str]:
    return [fields[b"e"].decode() for _id, fields in rclient.xrange(key)]


@pytest.mark.parametrize("lose_reply", [False, True])
def test_b7_an_end_that_failed_is_published_once_after_rearm_and_a_retaken_lease(
    settings: Settings, rclient: redis.Redis, monkeypatch: pytest.MonkeyPatch, lose_reply: bool
) -> None:
    """`end` failed (Redis unreachable), then the lease lapsed: after taking the lease back
    for the same epoch and `rearm`, `end` is published, once, and nothing else again."""
    monkeypatch.setattr(publisher, "PUBLISH_RETRY_DELAYS_S", (0.01,))
    keys = Keys(f"{settings.redis_prefix}end{uuid.uuid4().hex[:6]}:")
    run_id = str(uuid.uuid4())

    async def go() -> None:
        client = aredis.Redis.from_url(settings.redis_url)
        try:
            leases = LeaseManager(client, keys, ttl_s=30)
            assert await leases.acquire(run_id, 1, "w1")
            pub = StreamPublisher(client, keys, settings)
            cutter = _Cuttable(pub)
            sink = EventSink(PublishBatcher(pub), run_id, lease_value(1, "w1"), print, print)
            for i in range(3):
                sink.emit("values", b'{"i": %d}' % i)
            await sink.drain()
            cutter.cut, cutter.lose_reply = True, lose_reply
            with pytest.raises(redis.ConnectionError):
                await sink.publish_end(b'{"status": "success"}')
            cutter.cut = False
            rclient.delete(keys.lease(run_id))  # the lease lapsed during the partition
            sink.rearm()
            with pytest.raises(publisher.LeaseLost):
                await sink.publish_end(b'{"status": "success"}')
            assert await leases.acquire(run_id, 1, "w1")  # taken back for the same epoch
            sink.rearm()
            await sink.publish_end(b'{"status": "success"}')
            assert _names(rclient, keys.stream(run_id)) == ["values"] * 3 + ["end"]
        finally:
            await client.aclose()

    asyncio.run(go())


def test_b5_events_a_failure_dropped_are_a_lost_marker_before_the_end(
    settings: Settings, rclient: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events dropped by a failed publish are never sent again, and never silently missing:
    after `rearm` a `lost` marker (a gap for readers, B5) stands for them, then `end`."""
    monkeypatch.setattr(publisher, "PUBLISH_RETRY_DELAYS_S", (0.01,))
    keys = Keys(f"{settings.redis_prefix}end{uuid.uuid4().hex[:6]}:")
    run_id = str(uuid.uuid4())

    async def go() -> None:
        client = aredis.Redis.from_url(settings.redis_url)
        try:
            assert await LeaseManager(client, keys, ttl_s=30).acquire(run_id, 1, "w1")
            pub = StreamPublisher(client, keys, settings)
            cutter = _Cuttable(pub)
            sink = EventSink(PublishBatcher(pub), run_id, lease_value(1, "w1"), print, print)
            sink.emit("values", b"{}")
            await sink.drain()
            cutter.cut = True
            for _ in range(2):
                sink.emit("values", b"{}")
            with pytest.raises(redis.ConnectionError):
                await sink.drain()
            sink.emit("values", b"{}")  # dropped too: the sink failed
            cutter.cut = False
            sink.rearm()
            await sink.publish_end(b'{"status": "success"}')
            key = keys.stream(run_id)
            assert _names(rclient, key) == ["values", LOST_EVENT, "end"]
            # A reader from the start gets the first event, then a gap, never the end alone.
            reader = StreamSubscriber(rclient, keys, settings)
            items = list(reader.subscribe(run_id, None, is_terminal=lambda: True))
            assert [type(i).__name__ for i in items] == ["Event", "Gap"], items
        finally:
            await client.aclose()

    asyncio.run(go())


def test_r5_the_gate_holds_checkpoint_writes_until_the_rollback_point_is_recorded(
    settings: Settings,
) -> None:
    """R5: the rollback point is recorded while the graph starts (off the first token's
    path), and every fenced checkpoint write of the attempt waits for it at the stream gate;
    a failed recording fails the write with the service's error (a hand-back, L5), not as
    lost events."""
    keys = Keys(f"{settings.redis_prefix}gate{uuid.uuid4().hex[:6]}:")
    run_id = str(uuid.uuid4())

    async def go() -> None:
        client = aredis.Redis.from_url(settings.redis_url)
        try:
            assert await LeaseManager(client, keys, ttl_s=30).acquire(run_id, 1, "w1")
            batcher = PublishBatcher(StreamPublisher(client, keys, settings))
            run = Run.from_row({"run_id": run_id, "thread_id": str(uuid.uuid4())} | _ROW)
            attempt = RunAttempt(run=run, lease=lease_value(1, "w1"))
            sink = EventSink(batcher, run_id, attempt.lease, lambda _a: None, print)
            loop = asyncio.get_running_loop()
            recorded: asyncio.Future[None] = loop.create_future()
            attempt.pre_run_recorded = recorded
            gate = asyncio.ensure_future(stream_gate(attempt, sink)())
            for _ in range(20):
                await asyncio.sleep(0)
            assert not gate.done(), "a checkpoint write went ahead of the rollback point"
            recorded.set_result(None)
            await asyncio.wait_for(gate, 5)
            # A cancelled write leaves the recording running for the next write.
            pending: asyncio.Future[None] = loop.create_future()
            attempt.pre_run_recorded = pending
            first = asyncio.ensure_future(stream_gate(attempt, sink)())
            await asyncio.sleep(0)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert not pending.cancelled()
            pending.set_exception(psycopg.OperationalError("the database went away"))
            with pytest.raises(psycopg.OperationalError):
                await stream_gate(attempt, sink)()
            assert attempt.stop_reason is None  # not STREAM_LOST: the executor hands back
        finally:
            await client.aclose()

    asyncio.run(go())


_ROW = {
    "assistant_id": "a",
    "graph_id": "g",
    "status": "running",
    "multitask_strategy": "enqueue",
    "on_disconnect": "continue",
    "created_at": None,
    "updated_at": None,
}


def test_b1_events_emitted_while_the_publisher_waits_its_turns_share_one_call(
    settings: Settings, rclient: redis.Redis
) -> None:
    """A run emits an event per loop turn: the publisher's first call carries the event
    that woke it plus one per turn it let pass (`publish_coalesce_turns`), and the stream
    gets every event once, in order, either way."""

    async def go(turns: int) -> list[int]:
        conf = settings.model_copy(update={"publish_coalesce_turns": turns})
        keys = Keys(f"{settings.redis_prefix}coalesce{uuid.uuid4().hex[:6]}:")
        run_id = str(uuid.uuid4())
        client = aredis.Redis.from_url(settings.redis_url)
        try:
            assert await LeaseManager(client, keys, ttl_s=30).acquire(run_id, 1, "w1")
            pub = StreamPublisher(client, keys, conf)
            sizes: list[int] = []
            publish_many = pub.publish_many

            async def recording(calls: list[publisher.PublishCall]) -> Any:
                sizes.extend(len(c.events) for c in calls)
                return await publish_many(calls)

            pub.publish_many = recording  # type: ignore[method-assign]
            sink = EventSink(PublishBatcher(pub), run_id, lease_value(1, "w1"), print, print)
            for i in range(50):
                sink.emit("messages", b'{"i": %d}' % i)
                await asyncio.sleep(0)
            await sink.flush()
            got = [f[b"n"] for _, f in rclient.xrange(keys.stream(run_id))]
            assert got == [str(n).encode() for n in range(1, 51)]  # every event, in order
            return sizes
        finally:
            await client.aclose()

    assert asyncio.run(go(0))[0] == 1
    assert asyncio.run(go(3))[0] == 4
