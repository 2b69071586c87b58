"""Schema migrations: an ordered, append-only list of SQL files with a version table.

Run with `python -m shared.db.migrate`. Idempotent and safe to run from several
processes at once (a transaction-scoped advisory lock serialises them). Also runs the
LangGraph Postgres saver's and store's own `setup()` (with the store's vector tables when
the config file's `store.index` asks for semantic search).
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass
from importlib import resources

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg import sql
from psycopg.rows import DictRow, dict_row

from shared.settings import Settings, get_settings
from shared.store import StoreConfig
from shared.store import setup as setup_store

log = logging.getLogger(__name__)

_LOCK_KEY = 0x7468_7264  # "thrd": the advisory lock that serialises migrators
_NAME_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

VERSION_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS threadrun_schema_version (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True)
class Migration:
    """One migration file."""

    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """All migrations in order; versions must be contiguous from 1."""
    out = []
    for entry in resources.files("shared.db.migrations").iterdir():
        m = _NAME_RE.match(entry.name)
        if m:
            out.append(Migration(int(m.group(1)), m.group(2), entry.read_text()))
    out.sort(key=lambda mig: mig.version)
    for i, mig in enumerate(out, start=1):
        if mig.version != i:
            raise RuntimeError(
                f"migration versions must be contiguous: expected {i}, got {mig.version}"
            )
    return out


REDUNDANT_CHECKPOINT_INDEXES = (
    "checkpoints_thread_id_idx",
    "checkpoint_blobs_thread_id_idx",
    "checkpoint_writes_thread_id_idx",
)
"""Indexes the saver's `setup()` creates on `thread_id` alone, which each table's primary key
already leads with: every statement that filters on `thread_id` (a thread's delete, prune,
copy) is served as well by the primary key's prefix. Each costs an index insert per row written
(every checkpoint, blob and pending write), and while a table has no planner statistics the
planner prefers the small one for the head read's pending writes and reads every write of the
thread through it (bench.growth: 6,870 `checkpoint_writes` rows a turn at turn 500, none by
the primary key). `migrate` drops them after the saver's setup, concurrently (no lock that
blocks a running writer); the saver's migrations are versioned, so a later `setup()` does not
create them again."""


def drop_redundant_checkpoint_indexes(conn: psycopg.Connection[DictRow]) -> None:
    """Drop `REDUNDANT_CHECKPOINT_INDEXES` that exist (autocommit: concurrently, one by one)."""
    for name in REDUNDANT_CHECKPOINT_INDEXES:
        conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))


CONCURRENT_INDEXES = {
    "runs_ended": "ON runs (ended_at, status) WHERE ended_at IS NOT NULL",
    "runs_failed_ended": "ON runs (ended_at) WHERE status IN ('error', 'timeout')",
}
"""Indexes built after the migrations, concurrently (a build inside a migration's transaction
would block every write of the table until it ended: seconds on a large `runs`): name ->
definition. The ops view's runs ended within its window and its failures (shared/ops/store.py
`ENDED_SQL`, `FAILURES_SQL`) read a range of the window instead of every run (69 and 77 ms at
200,000 runs)."""

_INDEX_VALID_SQL = """
SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace
"""


def create_concurrent_indexes(conn: psycopg.Connection[DictRow]) -> list[str]:
    """Build the `CONCURRENT_INDEXES` that are missing (autocommit: concurrently, one by one);
    one left invalid by a build that was interrupted is dropped and built again. Returns the
    names built."""
    built = []
    for name, definition in CONCURRENT_INDEXES.items():
        row = conn.execute(_INDEX_VALID_SQL, (name,)).fetchone()
        if row is not None and row["indisvalid"]:
            continue
        index = sql.Identifier(name)
        if row is not None:
            conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(index))
        log.info("building index %s concurrently", name)
        conn.execute(
            sql.SQL("CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ").format(index)
            + sql.SQL(definition)
        )
        built.append(name)
    return built


def applied_versions(conn: psycopg.Connection[DictRow]) -> set[int]:
    """Versions already applied."""
    rows = conn.execute("SELECT version FROM threadrun_schema_version").fetchall()
    return {r["version"] for r in rows}


def migrate(settings: Settings) -> list[int]:
    """Apply pending migrations and the checkpointer setup; return the versions applied."""
    done: list[int] = []
    # Migration files hold several statements: they need the simple query protocol.
    with psycopg.connect(
        settings.dsn, autocommit=True, row_factory=dict_row, prepare_threshold=None
    ) as conn:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            conn.execute(VERSION_TABLE_SQL)
            have = applied_versions(conn)
            for mig in migrations():
                if mig.version in have:
                    continue
                log.info("applying migration %04d_%s", mig.version, mig.name)
                conn.execute(mig.sql)
                conn.execute(
                    "INSERT INTO threadrun_schema_version (version, name) VALUES (%s, %s)",
                    (mig.version, mig.name),
                )
                done.append(mig.version)
        # The saver's and the store's setups use CREATE INDEX CONCURRENTLY, so they run
        # outside any transaction; each keeps its own version table and is idempotent. A
        # session advisory lock keeps two starting processes from racing on them.
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY + 1,))
        try:
            PostgresSaver(conn).setup()
            drop_redundant_checkpoint_indexes(conn)
            create_concurrent_indexes(conn)
            setup_store(conn, StoreConfig.from_file(settings.config))
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY + 1,))
    return done


def main() -> int:
    """CLI entry point."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    applied = migrate(get_settings())
    print(f"migrations applied: {applied or 'none (up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
