"""R4 on real PostgreSQL: the reaper's statistics upkeep (shared/db/statistics.py) finds a
table that was never analyzed, ANALYZEs it once, then leaves it alone; a table another
process is analyzing, or whose lock is held, is skipped (busy), never waited for; the ops
health strip warns while a table with rows has no statistics."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from shared.db.statistics import (
    LOCK_CLASS,
    AnalyzeOutcome,
    TableStatistics,
    TableStats,
    _table_key,
    stale_tables,
)
from shared.ops.collector import OpsCollector
from shared.ops.store import OpsStore
from shared.settings import Settings
from workers.reaper import analyze_stale


@pytest.fixture
def probe(settings: Settings) -> Iterator[str]:
    """A new table of 200 rows, never analyzed (dropped afterwards)."""
    name = f"stats_probe_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(settings.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
        conn.execute(f"INSERT INTO {name} SELECT i, 'x' FROM generate_series(1, 200) i")
    yield name
    with psycopg.connect(settings.dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")


def stats_of(stats: TableStatistics, table: str, timeout_s: float = 15.0) -> TableStats:
    """`table`'s row in the statistics view, once its insert counts are flushed (a backend
    flushes them within ~1 s of its transaction, at most 10 s when idle)."""
    deadline = time.monotonic() + timeout_s
    while True:
        row = next((t for t in stats.read() if t.table == table), None)
        if row is not None and (row.live > 0 or row.analyzed) or time.monotonic() > deadline:
            assert row is not None
            return row
        time.sleep(0.2)


def test_r4_never_analyzed_table_is_analyzed_once(
    pool: ConnectionPool, settings: Settings, probe: str
) -> None:
    """A fresh table with rows is stale; one pass ANALYZEs it; the next finds it fresh."""
    stats = TableStatistics(pool)
    before = stats_of(stats, probe)
    assert not before.analyzed and before.live == 200
    assert probe in stale_tables([before], settings.analyze_threshold)
    rt = SimpleNamespace(settings=settings)
    counts = asyncio.run(analyze_stale(rt, stats))  # type: ignore[arg-type]
    assert counts["analyzed"] >= 1 and counts["busy"] == 0
    after = stats_of(stats, probe)
    assert after.analyzed and after.changed == 0
    assert probe not in stale_tables(stats.read(), settings.analyze_threshold)
    with psycopg.connect(settings.dsn) as conn:
        row = conn.execute("SELECT reltuples FROM pg_class WHERE relname = %s", (probe,))
        assert row.fetchone() == (200.0,)  # the planner now knows the size


def test_r4_a_table_being_analyzed_or_locked_is_skipped(
    pool: ConnectionPool, settings: Settings, probe: str
) -> None:
    """Another process holding the table's advisory lock (analyzing it), or a lock that
    conflicts with ANALYZE (a migration, VACUUM), makes the ANALYZE `busy` within
    `lock_timeout_s`, not a wait."""
    stats = TableStatistics(pool)
    with psycopg.connect(settings.dsn) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, _table_key(probe)))
        assert stats.analyze(probe, lock_timeout_s=0.2) is AnalyzeOutcome.BUSY
    with psycopg.connect(settings.dsn) as other:
        other.execute(f"LOCK TABLE {probe} IN SHARE UPDATE EXCLUSIVE MODE")
        t0 = time.monotonic()
        assert stats.analyze(probe, lock_timeout_s=0.2) is AnalyzeOutcome.BUSY
        assert time.monotonic() - t0 < 5
    assert stats.analyze(probe, lock_timeout_s=0.2) is AnalyzeOutcome.ANALYZED


def test_r4_ops_health_tile_warns_for_a_never_analyzed_table(
    pool: ConnectionPool, settings: Settings, probe: str
) -> None:
    """The ops health strip's `statistics` tile names a table with rows that was never
    analyzed, and turns `ok` for it once the upkeep analyzed it."""
    view = SimpleNamespace(store=OpsStore(pool), settings=settings, _tile=OpsCollector._tile)
    stats_of(TableStatistics(pool), probe)
    tile = OpsCollector._statistics_tile(view)  # type: ignore[arg-type]
    assert tile["key"] == "statistics" and tile["state"] == "warn"
    assert probe in tile["reason"] and tile["value"] >= 1
    assert TableStatistics(pool).analyze(probe, lock_timeout_s=1) is AnalyzeOutcome.ANALYZED
    tile = OpsCollector._statistics_tile(view)  # type: ignore[arg-type]
    assert probe not in tile["reason"]
