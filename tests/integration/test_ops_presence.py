"""H2: workers' presence records (shared/ops/presence.py) against the real Redis.

A worker too busy to answer the ops broadcast in time is still online by its record; one
killed or frozen drops out STALE_PERIODS periods after its last write; one stopped in order
at once. The ops view's workers (WorkerInspector) are the broadcast's answers plus the
fresh records, each marked `answered` or not.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from shared import serde
from shared.ops.collector import WorkerInspector, live_processes
from shared.ops.presence import PresenceWriter, presence_record, read_presence
from shared.ops.timed_records import PRUNE_S, STALE_PERIODS
from shared.redis_keys import Keys
from shared.runs.taskqueue import make_celery
from shared.settings import Settings

PERIOD_S = 0.2


@pytest.fixture
def keys(settings: Settings, rclient: redis.Redis) -> Iterator[Keys]:
    k = Keys(f"{settings.redis_prefix}presence:")
    yield k
    rclient.delete(k.ops_workers())


def test_h2_a_writers_record_is_read_until_it_stops_and_then_removed(
    rclient: redis.Redis, keys: Keys
) -> None:
    """The record is read while written; `stop` removes it at once."""
    record = presence_record("runs@host-a", ["runs", "runs.background"], 8)
    assert record["host"] == "host-a" and record["queues"] == ["runs", "runs.background"]
    writer = PresenceWriter(rclient, keys, record, PERIOD_S)
    writer.start()
    try:
        time.sleep(PERIOD_S * 2.5)  # written again meanwhile: still fresh
        assert read_presence(rclient, keys, PERIOD_S) == [record]
    finally:
        writer.stop()
    assert read_presence(rclient, keys, PERIOD_S) == []
    assert rclient.hlen(keys.ops_workers()) == 0


def test_h2_a_record_left_unwritten_drops_out_after_its_stale_periods(
    rclient: redis.Redis, keys: Keys
) -> None:
    """A worker that stopped writing (killed, frozen) counts STALE_PERIODS periods after its
    last write, then no more; a record past PRUNE_S, or one that cannot be read, is removed."""
    now = time.time()
    rows: dict[str, Any] = {
        "fresh@h": {"name": "fresh@h", "host": "h", "pid": 1, "queues": [], "at": now},
        "edge@h": {
            "name": "edge@h",
            "host": "h",
            "pid": 2,
            "queues": [],
            "at": now - PERIOD_S * (STALE_PERIODS - 0.5),
        },
        "stale@h": {
            "name": "stale@h",
            "host": "h",
            "pid": 3,
            "queues": [],
            "at": now - PERIOD_S * (STALE_PERIODS + 1),
        },
        "ancient@h": {"name": "ancient@h", "host": "h", "pid": 4, "at": now - PRUNE_S - 1},
    }
    rclient.hset(keys.ops_workers(), mapping={k: serde.dumps(v) for k, v in rows.items()})
    rclient.hset(keys.ops_workers(), "garbage@h", b"{not json")
    assert [r["name"] for r in read_presence(rclient, keys, PERIOD_S)] == ["edge@h", "fresh@h"]
    left = {k.decode() for k in rclient.hkeys(keys.ops_workers())}
    assert left == {"fresh@h", "edge@h", "stale@h"}


def test_h2_a_worker_that_does_not_answer_the_broadcast_is_online_by_its_record(
    settings: Settings, rclient: redis.Redis, keys: Keys
) -> None:
    """No worker answers this app's broadcast (none runs on it); a fresh record still makes
    its process live (so its runs are not orphaned) and its queues consumed, `answered`
    false; once the record goes, the worker is gone."""
    celery = make_celery(settings.model_copy(update={"redis_prefix": keys.prefix}))
    inspector = WorkerInspector(
        celery, 0.05, 0, presence=lambda: read_presence(rclient, keys, PERIOD_S)
    )
    writer = PresenceWriter(rclient, keys, presence_record("runs@busy", ["runs"], 4), PERIOD_S)
    writer.start()
    try:
        workers = inspector.workers()
        assert [(w["name"], w["queues"], w["answered"]) for w in workers] == [
            ("runs@busy", ["runs"], False)
        ]
        assert live_processes(workers) == {("busy", str(writer.record["pid"]))}
    finally:
        writer.stop()
        celery.close()
    assert inspector.workers() == []
