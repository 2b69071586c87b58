"""Cost that does not grow with a thread: the pure decisions behind two bounded reads.

- S4: a delta channel's history is read in pages sized by the snapshot frequency
  (shared/state/delta_history.py), doubling only while the walk has not reached a snapshot.
- R4: the reaper's leader ANALYZEs the tables that lack planner statistics
  (shared/db/statistics.py; workers/reaper.py `StatisticsUpkeep`), at most once per interval
  and never two passes at once.
"""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace
from typing import Any, cast

import pytest

from shared.db.statistics import (
    ANALYZE_MIN_ROWS,
    AnalyzeOutcome,
    TableStats,
    needs_analyze,
    stale_tables,
    statistics_verdict,
)
from shared.settings import Settings
from shared.state.delta_history import PAGE_MAX, PAGE_MIN, first_page, page_sizes
from workers.reaper import StatisticsUpkeep, analyze_stale, upkeep_due


def test_s4_first_page_covers_k_updates_and_stays_within_langgraph_page() -> None:
    """S4: the first page holds a walk back over K updates (4 checkpoints each), at least
    `PAGE_MIN` rows and never more than LangGraph's own page."""
    assert first_page(10) == 42
    assert first_page(1) == PAGE_MIN
    assert first_page(100_000) == PAGE_MAX
    for k in range(1, 400):
        assert PAGE_MIN <= first_page(k) <= PAGE_MAX
        assert first_page(k) >= min(PAGE_MAX, 4 * k)


def test_s4_pages_double_up_to_the_cap() -> None:
    """S4: a walk that goes on reads doubling pages, capped at `PAGE_MAX`: rows read stay
    within twice the distance walked plus the first page."""
    assert list(itertools.islice(page_sizes(10), 7)) == [42, 84, 168, 336, 672, 1024, 1024]
    for k in (1, 3, 10, 50):
        sizes = list(itertools.islice(page_sizes(k), 30))
        for distance in (1, 17, 100, 999, 5000):
            read, n = 0, 0
            while read < distance:
                read += sizes[n]
                n += 1
            assert read <= 2 * distance + first_page(k) + PAGE_MAX * (distance > PAGE_MAX)


def stats(live: int, changed: int, analyzed: bool = True, table: str = "t") -> TableStats:
    return TableStats(table, live, changed, analyzed)


def test_r4_a_never_analyzed_table_with_rows_needs_analyze() -> None:
    """A table never analyzed by anyone is planned as empty: analyze it once it has rows."""
    assert needs_analyze(stats(3, 3, analyzed=False), 0.2)
    assert needs_analyze(stats(0, 5, analyzed=False), 0.2)  # counts not flushed yet
    assert not needs_analyze(stats(0, 0, analyzed=False), 0.2)


def test_r4_an_analyzed_table_needs_it_only_past_the_threshold() -> None:
    """Past `threshold` of its rows changed (small tables count as `ANALYZE_MIN_ROWS`); twice
    autovacuum's default, so where autovacuum keeps up this finds nothing."""
    assert not needs_analyze(stats(100_000, 20_000), 0.2)
    assert needs_analyze(stats(100_000, 20_001), 0.2)
    assert not needs_analyze(stats(10, int(0.2 * ANALYZE_MIN_ROWS)), 0.2)
    assert needs_analyze(stats(10, int(0.2 * ANALYZE_MIN_ROWS) + 1), 0.2)
    assert not needs_analyze(stats(100_000, 10_050), 0.2)  # autovacuum's 0.1 + 50 is here
    table = [stats(10, 0, False, "a"), stats(5, 0, True, "b"), stats(1, 9_999, True, "c")]
    assert stale_tables(table, 0.2) == ["a", "c"]


def test_r4_upkeep_due_only_when_enabled_idle_and_time_come() -> None:
    """The statistics pass: interval 0 disables it; one at a time; once per interval."""
    assert upkeep_due(10.0, 5.0, 60.0, running=False)
    assert not upkeep_due(10.0, 5.0, 0.0, running=False)
    assert not upkeep_due(10.0, 5.0, 60.0, running=True)
    assert not upkeep_due(10.0, 11.0, 60.0, running=False)


class FakeStats:
    """`TableStatistics` without a database: stale tables and a gate on each ANALYZE."""

    def __init__(self, tables: list[TableStats]) -> None:
        self.tables = tables
        self.analyzed: list[str] = []
        self.busy: set[str] = set()

    def read(self) -> list[TableStats]:
        return list(self.tables)

    def analyze(self, table: str, *, lock_timeout_s: float) -> AnalyzeOutcome:
        if table in self.busy:
            return AnalyzeOutcome.BUSY
        self.analyzed.append(table)
        return AnalyzeOutcome.ANALYZED


def fake_runtime(interval: float) -> Any:
    settings = Settings(analyze_interval_s=interval, analyze_threshold=0.2)
    return SimpleNamespace(settings=settings, store=SimpleNamespace(pool=None))


def test_r4_analyze_stale_analyzes_only_the_stale_and_counts_outcomes() -> None:
    """A pass ANALYZEs each stale table once and reports analyzed / busy counts."""
    fake = FakeStats([stats(10, 0, False, "a"), stats(5, 0, True, "b"), stats(1, 5_000, True, "c")])
    fake.busy = {"c"}
    counts = asyncio.run(analyze_stale(fake_runtime(60), cast(Any, fake)))
    assert fake.analyzed == ["a"]
    assert counts == {"analyzed": 1, "busy": 1}


@pytest.mark.parametrize("interval", [60.0, 0.0])
def test_r4_upkeep_runs_at_most_once_per_interval(interval: float) -> None:
    """The leader pokes the upkeep every reaper pass; a pass starts once per interval, as a
    task of its own (the recovery pass does not wait for it); interval 0: never."""

    async def scenario() -> list[str]:
        upkeep = StatisticsUpkeep(fake_runtime(interval))
        fake = FakeStats([stats(10, 0, False, "a")])
        upkeep.stats = cast(Any, fake)
        for _ in range(5):
            upkeep.poke()
            await asyncio.sleep(0.01)
        if upkeep.task is not None:
            await upkeep.task
        upkeep.next_at = 0.0  # the interval has passed
        upkeep.poke()
        if upkeep.task is not None:
            await upkeep.task
        return fake.analyzed

    analyzed = asyncio.run(scenario())
    assert analyzed == (["a", "a"] if interval else [])


def test_r4_ops_warns_while_a_table_with_rows_was_never_analyzed() -> None:
    """The ops health strip's `statistics` tile: `warn` naming the tables never analyzed
    that have rows (and what will fix it), `ok` otherwise; a threshold breach is autovacuum's
    business, not a warning."""
    fresh = [stats(10, 0, True, "runs"), stats(0, 0, False, "empty"), stats(1, 9_999, True, "c")]
    assert statistics_verdict(fresh, 60) == ("ok", "every table with rows has planner statistics")
    state, reason = statistics_verdict([*fresh, stats(5, 5, False, "checkpoints")], 60)
    assert state == "warn"
    assert "1 table never analyzed (checkpoints)" in reason and "within 60s" in reason
    many = [stats(1, 1, False, f"t{i}") for i in range(7)]
    state, reason = statistics_verdict(many, 0)
    assert state == "warn" and "7 tables" in reason and "and 2 more" in reason
    assert "THREADRUN_ANALYZE_INTERVAL_S=0" in reason
