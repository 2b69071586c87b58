"""`EventSink.flush`, the stream gate's wait (B5, shared/state/savers.py): it returns once
every event emitted before it is in the stream, and raises once the sink dropped one."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest
import redis
import redis.asyncio as aredis

from shared.bridge import publisher
from shared.bridge.publisher import EventSink, PublishBatcher, StreamPublisher
from shared.devservices import free_port
from shared.leases import LeaseManager, lease_value
from shared.redis_keys import Keys
from shared.runs.model import Run
from shared.settings import Settings
from workers.executor import RunAttempt, stream_gate


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
