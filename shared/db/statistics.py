"""Planner statistics where autovacuum left a table without them (run by the reaper's leader).

PostgreSQL plans on each table's statistics. A table that was never analyzed (a fresh
database, one restored or bulk-loaded, a server whose autovacuum is off or behind) is
planned as if it were nearly empty, and some of our statements then take the wrong index
and read a thread's whole history each turn: our claim and settle statements walk every run
of the thread through `runs_thread_seq` instead of the partial `runs_thread_inflight`
(bench.growth, 200 turns: 63 -> 403 `runs` rows a turn from turn 11-30 to 181-200, 23 once
analyzed; LangGraph's `get_tuple` did the same through the saver's `thread_id` index, which
`shared.db.migrate` now drops). One ANALYZE fixes the plans.

So the reaper's leader (workers/reaper.py), every `analyze_interval_s`, reads
`pg_stat_user_tables` of its schema and ANALYZEs each table that (`needs_analyze`) was never
analyzed by anyone and has rows, or has had more than `analyze_threshold` of its rows
changed since its last analyze. That threshold is twice autovacuum's default
(`autovacuum_analyze_scale_factor` 0.1), so on a server whose autovacuum keeps up this
finds nothing to do: it steps in only where autovacuum did not. Each ANALYZE runs in its own
transaction under a transaction-level advisory lock (two processes never analyze one table
at once, e.g. during a leader handover) and a `lock_timeout` (a table that autovacuum or a
migration holds is skipped, retried next interval), so it never blocks other work for long.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from shared.db import DictPool

ANALYZE_MIN_ROWS = 1000
"""A table smaller than this counts as this size for the threshold: a small table is not
re-analyzed for every few changed rows."""

TABLE_STATS_SQL = """
SELECT relname, n_live_tup, n_mod_since_analyze,
       (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL) AS analyzed
FROM pg_stat_user_tables
WHERE schemaname = current_schema()
ORDER BY relname
"""
TRY_LOCK_SQL = "SELECT pg_try_advisory_xact_lock(%s, %s) AS locked"
SET_LOCK_TIMEOUT_SQL = "SELECT set_config('lock_timeout', %s, true)"
LOCK_CLASS = zlib.crc32(b"threadrun:analyze") & 0x7FFFFFFF
"""The first key of the advisory lock (the second is the table's)."""


@dataclass(frozen=True, slots=True)
class TableStats:
    """One table's row counts from `pg_stat_user_tables`."""

    table: str
    live: int
    changed: int
    """Rows inserted, updated or deleted since the table was last analyzed."""
    analyzed: bool
    """Whether it was ever analyzed (by ANALYZE or by autovacuum)."""


class AnalyzeOutcome(enum.Enum):
    """What one table's ANALYZE did."""

    ANALYZED = "analyzed"
    BUSY = "busy"
    """Skipped: another process is analyzing it, or a lock was not free in time."""


def needs_analyze(t: TableStats, threshold: float, min_rows: int = ANALYZE_MIN_ROWS) -> bool:
    """Whether `t` lacks usable statistics: never analyzed though it has rows, or changed by
    more than `threshold` of its rows (at least `min_rows`) since it was."""
    if not t.analyzed:
        return t.live > 0 or t.changed > 0
    return t.changed > threshold * max(t.live, min_rows)


def stale_tables(
    stats: Sequence[TableStats], threshold: float, min_rows: int = ANALYZE_MIN_ROWS
) -> list[str]:
    """The tables of `stats` that `needs_analyze`, by name."""
    return [t.table for t in stats if needs_analyze(t, threshold, min_rows)]


def statistics_verdict(stats: Sequence[TableStats], interval_s: float) -> tuple[str, str]:
    """(state, reason) of the ops health tile: `warn` while a table with rows was never
    analyzed (its statements are planned as on an empty table), else `ok`."""
    missing = [t.table for t in stats if not t.analyzed and (t.live > 0 or t.changed > 0)]
    if not missing:
        return "ok", "every table with rows has planner statistics"
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    n = len(missing)
    head = f"{n} table{'s' if n != 1 else ''} never analyzed ({shown}): planned as if empty"
    if interval_s > 0:
        return "warn", f"{head}; the reaper analyzes them within {interval_s:g}s"
    return "warn", f"{head}; the reaper's upkeep is off (THREADRUN_ANALYZE_INTERVAL_S=0): ANALYZE"


class TableStatistics:
    """Reads the tables' statistics state and ANALYZEs a table (its SQL lives here)."""

    def __init__(self, pool: DictPool) -> None:
        self._pool = pool

    def read(self) -> list[TableStats]:
        """Every table of the current schema with its counts."""
        with self._pool.connection() as conn:
            rows = conn.execute(TABLE_STATS_SQL).fetchall()
        return [
            TableStats(
                str(r["relname"]),
                int(r["n_live_tup"] or 0),
                int(r["n_mod_since_analyze"] or 0),
                bool(r["analyzed"]),
            )
            for r in rows
        ]

    def analyze(self, table: str, *, lock_timeout_s: float) -> AnalyzeOutcome:
        """ANALYZE one table unless another process is at it or its lock is not free within
        `lock_timeout_s`."""
        try:
            with self._pool.connection() as conn, conn.transaction():
                row = conn.execute(TRY_LOCK_SQL, (LOCK_CLASS, _table_key(table))).fetchone()
                if row is None or not row["locked"]:
                    return AnalyzeOutcome.BUSY
                conn.execute(SET_LOCK_TIMEOUT_SQL, (f"{int(lock_timeout_s * 1000)}ms",))
                conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
        except psycopg.errors.LockNotAvailable:
            return AnalyzeOutcome.BUSY
        return AnalyzeOutcome.ANALYZED


def _table_key(table: str) -> int:
    """The advisory lock's second key for `table` (a signed 32-bit integer)."""
    return zlib.crc32(table.encode()) - 0x80000000
