"""`EventSink.flush`, the stream gate's wait (B5, shared/state/savers.py): it returns once
every event emitted before it is in the stream, and raises once the sink dropped one."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
import redis.asyncio as aredis

from shared.bridge import publisher
from shared.bridge.publisher import EventSink, PublishBatcher, StreamPublisher
from shared.devservices import free_port
from shared.leases import LeaseManager, lease_value
from shared.redis_keys import Keys
from shared.settings import Settings


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
