"""The compact stream encoding on real Redis (B1, B3-B7): through the real sink, publisher
script and subscriber (alone or through the hub), clients get exactly the bytes they got
when every entry held its JSON, and the replay buffer is a fraction of the size."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from app.streaming import sse
from app.streaming.frames import from_item
from shared import serde
from shared.bridge.base import END_EVENT, Event, Heartbeat, StreamItem
from shared.bridge.codec import DICT_FIELD
from shared.bridge.hub import SubscriptionHub
from shared.bridge.publisher import EventSink, PublishBatcher, StreamPublisher
from shared.bridge.subscriber import StreamSubscriber
from shared.redis_keys import Keys
from shared.runs.leases import LeaseManager, lease_value
from shared.settings import Settings
from tests.unit.test_stream_codec import bench_shaped_run

Events = list[tuple[str, bytes]]


@pytest.fixture(params=["own-xread", "hub"])
def hub(request: pytest.FixtureRequest, rclient: redis.Redis) -> Iterator[SubscriptionHub | None]:
    """Followers read on their own, or through the per-process hub."""
    if request.param == "own-xread":
        yield None
        return
    h = SubscriptionHub(rclient, block_ms=200)
    yield h
    h.close()


def private(settings: Settings, **overrides: object) -> tuple[Settings, Keys]:
    s = settings.model_copy(update={"stream_heartbeat_s": 0.2, **overrides})
    return s, Keys(f"{settings.redis_prefix}enc{uuid.uuid4().hex[:6]}:")


def publish(s: Settings, keys: Keys, events: Events, *, epoch: int = 1, between: Any = None) -> str:
    """Publish a run's events (the last one is `end`) through EventSink; `between(run_id)`
    runs halfway, before the second half is emitted."""
    run_id = str(uuid.uuid4())

    async def go() -> None:
        client = aredis.Redis.from_url(s.redis_url)
        try:
            assert await LeaseManager(client, keys, ttl_s=30).acquire(run_id, epoch, "w1")
            lost: list[BaseException] = []
            batcher = PublishBatcher(StreamPublisher(client, keys, s))
            value = lease_value(epoch, "w1")
            sink = EventSink(batcher, run_id, value, lambda _a: None, lost.append)
            half = len(events) // 2
            for i, (name, data) in enumerate(events[:-1]):
                if i == half and between is not None:
                    await sink.drain()
                    between(run_id)
                sink.emit(name, data)
                await asyncio.sleep(0)
            await sink.publish_end(events[-1][1])
            assert not lost
        finally:
            await client.aclose()

    asyncio.run(go())
    return run_id


def read(sub: StreamSubscriber, run_id: str, cursor: str | None) -> list[StreamItem]:
    out: list[StreamItem] = []
    for item in sub.subscribe(run_id, cursor, is_terminal=lambda: True):
        if isinstance(item, Heartbeat):
            break
        out.append(item)
    return out


def frames(items: list[StreamItem]) -> list[bytes]:
    """The SSE bytes a client gets, ids left out (two runs never share ids)."""
    out = []
    for item in items:
        frame = from_item(item)
        assert frame is not None
        out.append(sse.encode(frame).split(b"\n", 1)[1])
    return out


def test_b1_b4_compact_replay_gives_clients_the_bytes_json_entries_gave(
    settings: Settings, rclient: redis.Redis, hub: SubscriptionHub | None
) -> None:
    """B1, B4, B7: a bench-shaped run stored compact and the same run stored as JSON
    replay the same SSE bytes, from the start and from the middle; the compact one holds
    under 25 KB of Redis where the JSON one holds ~200 KB."""
    events = bench_shaped_run()
    sizes = {}
    got = {}
    for compress in (False, True):
        s, keys = private(settings, stream_compress=compress)
        run_id = publish(s, keys, events)
        sub = StreamSubscriber(rclient, keys, s, hub=hub)
        whole = read(sub, run_id, "-1")
        mid = whole[100]
        assert isinstance(mid, Event)
        got[compress] = (frames(whole), frames(read(sub, run_id, mid.id)))
        sizes[compress] = sum(
            int(rclient.memory_usage(k, samples=0) or 0)
            for k in (keys.stream(run_id), keys.stream_meta(run_id))
        )
        assert [(i.event, i.data.encode()) for i in whole if isinstance(i, Event)] == events
        rclient.delete(keys.stream(run_id), keys.stream_meta(run_id), keys.lease(run_id))
    assert got[True] == got[False]
    assert sizes[True] <= 25_000 < 150_000 < sizes[False], sizes


def test_b1_b6_live_followers_get_the_published_bytes(
    settings: Settings, rclient: redis.Redis, hub: SubscriptionHub | None
) -> None:
    """B1, B6: followers that join before the run and follow it live (several at once
    through the hub, which decodes each read once for all) get every event exactly."""
    s, keys = private(settings)
    events = bench_shaped_run(60)
    ready = threading.Barrier(4)
    results: list[list[tuple[str, bytes]]] = []
    run_ids: list[str] = []
    started = threading.Event()

    def follow() -> None:
        started.wait(10)
        sub = StreamSubscriber(rclient, keys, s, hub=hub)
        ready.wait(10)
        items = []
        for item in sub.subscribe(run_ids[0], "0-0", is_terminal=lambda: False):
            if isinstance(item, Event):
                items.append((item.event, item.data.encode()))
                if item.event == END_EVENT:
                    break
        results.append(items)

    threads = [threading.Thread(target=follow) for _ in range(3)]
    for t in threads:
        t.start()

    def halfway(run_id: str) -> None:
        run_ids.append(run_id)
        started.set()
        ready.wait(10)

    publish(s, keys, events, between=halfway)
    for t in threads:
        t.join(20)
    assert results == [events] * 3


def test_b5_dictionaries_lost_with_redis_are_resent(
    settings: Settings, rclient: redis.Redis
) -> None:
    """B5, L2: when the meta hash loses a run's dictionaries mid-run (a Redis restart
    without persistence), the next publish is refused and resent with them: every entry
    written after that still decodes exactly."""
    s, keys = private(settings)
    events = bench_shaped_run(20)

    def forget(run_id: str) -> None:
        meta = keys.stream_meta(run_id)
        fields = [f for f in rclient.hkeys(meta) if f.startswith(DICT_FIELD.encode())]
        assert fields
        rclient.hdel(meta, *fields)

    run_id = publish(s, keys, events, between=forget)
    assert any(f.startswith(DICT_FIELD.encode()) for f in rclient.hkeys(keys.stream_meta(run_id)))
    sub = StreamSubscriber(rclient, keys, s)
    half = len(events) // 2
    mid = read(sub, run_id, "-1")[half - 1]
    assert isinstance(mid, Event)
    tail = read(sub, run_id, mid.id)
    assert [(i.event, i.data.encode()) for i in tail if isinstance(i, Event)] == events[half:]


def test_b5_entries_whose_dictionary_is_gone_are_a_gap(
    settings: Settings, rclient: redis.Redis
) -> None:
    """B5: if a reader finds entries it cannot decode (the meta hash went while the stream
    stayed), it reports a gap instead of sending anything else."""
    s, keys = private(settings)
    run_id = publish(s, keys, bench_shaped_run(5))
    rclient.delete(keys.stream_meta(run_id))
    items = read(StreamSubscriber(rclient, keys, s), run_id, "-1")
    assert items[-1].__class__.__name__ == "Gap"
    assert all(
        serde.loads(i.data) is not None for i in items if isinstance(i, Event)
    )  # what came before the gap is real JSON


payload = st.one_of(  # UTF-8, as every JSON payload is (a subscriber yields text)
    st.text(max_size=400).map(str.encode),
    st.text(min_size=1, max_size=20).map(lambda t: (t * 30).encode()),
    st.text(max_size=200).map(lambda t: serde.dumps({"text": t, "meta": {"node": "model"}})),
    st.sampled_from([b"\x00", b"\x01x", b"\x02y:z"]),
)


@hsettings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(st.tuples(st.sampled_from(["messages", "values", "custom"]), payload), max_size=40))
def test_b1_property_any_payloads_round_trip_through_redis(
    settings: Settings, rclient: redis.Redis, events: Events
) -> None:
    """B1: random payloads (any text, JSON, ones that start with the encoding's marker bytes)
    come back from Redis exactly as they were published."""
    s, keys = private(settings, stream_compress_min_bytes=16)
    events = [*events, (END_EVENT, b'{"status":"success"}')]
    run_id = publish(s, keys, events)
    got: list[tuple[str, bytes]] = []
    for item in StreamSubscriber(rclient, keys, s).subscribe(
        run_id, "-1", is_terminal=lambda: True
    ):
        assert isinstance(item, Event)
        got.append((item.event, item.data.encode()))
    rclient.delete(keys.stream(run_id), keys.stream_meta(run_id), keys.lease(run_id))
    assert got == events
