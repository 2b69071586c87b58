"""The ops view's run counts read the deltas of `run_status_counts` (migration 0018),
which triggers on `runs` keep equal to `SELECT status, count(*) FROM runs GROUP BY status`,
and its window reads (runs ended, failures) are index ranges of the window: an ops refresh
and a metrics scrape no longer read every run (62-77 ms each at 200,000 runs).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from shared.db import migrate
from shared.ops.store import ENDED_SQL, FAILURES_SQL, RUNS_BY_STATUS_SQL
from shared.runs.reaper_queries import COMPACT_RUN_COUNTS_SQL
from shared.settings import Settings
from tests.integration.test_s3_checkpoint_reads import rows_touched

STATUSES = ["pending", "running", "success", "error", "timeout", "interrupted"]

AGREE_SQL = f"""
SELECT coalesce((SELECT jsonb_object_agg(status, n) FROM ({RUNS_BY_STATUS_SQL}) c), '{{}}')
           AS counted,
       coalesce((SELECT jsonb_object_agg(status, n)
                 FROM (SELECT status, count(*) AS n FROM runs GROUP BY status) r), '{{}}')
           AS actual
"""
"""Both in one statement: one snapshot, whatever other sessions write meanwhile."""


@pytest.fixture
def conn(settings: Settings) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(settings.dsn, autocommit=True, row_factory=dict_row) as c:
        yield c


def agree(conn: psycopg.Connection[Any]) -> tuple[Any, Any]:
    row = conn.execute(AGREE_SQL).fetchone()
    assert row is not None
    return row["counted"], row["actual"]


def new_thread(conn: psycopg.Connection[Any], owner: str = "run-counts") -> str:
    tid = str(uuid.uuid4())
    conn.execute("INSERT INTO threads (thread_id, owner) VALUES (%s, %s)", (tid, owner))
    return tid


def insert_runs(conn: psycopg.Connection[Any], tid: str, n: int, status: str = "pending") -> None:
    conn.execute(
        "INSERT INTO runs (run_id, thread_id, assistant_id, graph_id, status,"
        " multitask_strategy, ended_at)"
        " SELECT gen_random_uuid(), %s, 'a', 'g', %s, 'enqueue',"
        " CASE WHEN %s IN ('pending', 'running') THEN NULL ELSE now() END"
        " FROM generate_series(1, %s)",
        (tid, status, status, n),
    )


OP = st.tuples(
    st.sampled_from(["insert", "move", "move_same", "delete", "delete_thread", "compact"]),
    st.sampled_from(STATUSES),
    st.integers(1, 3),
)
TAG = "run-counts-property"
"""The owner of the property test's threads: one thread a run (R3 allows one running run
a thread), the runs picked oldest first."""
PICK = (
    "(SELECT r.run_id FROM runs r JOIN threads t USING (thread_id)"
    f" WHERE t.owner = '{TAG}' ORDER BY r.seq LIMIT %s)"
)


@hsettings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(txs=st.lists(st.tuples(st.lists(OP, min_size=1, max_size=4), st.booleans()), max_size=5))
def test_ops_run_counts_equal_the_runs_after_any_writes(
    conn: psycopg.Connection[Any], txs: list[tuple[list[tuple[str, str, int]], bool]]
) -> None:
    """After any mix of run inserts, status changes (and updates that keep the status),
    deletes (direct, and cascaded from a thread's delete) and folds, committed or rolled
    back, the counts equal the runs of each status."""
    try:
        for ops, commit in txs:
            with conn.transaction(force_rollback=not commit):
                for what, status, n in ops:
                    if what == "insert":
                        for _ in range(n):
                            insert_runs(conn, new_thread(conn, TAG), 1, status)
                    elif what == "move":
                        conn.execute(
                            f"UPDATE runs SET status = %s WHERE run_id IN {PICK}", (status, n)
                        )
                    elif what == "move_same":
                        conn.execute(
                            "UPDATE runs SET status = status, updated_at = now()"
                            f" WHERE run_id IN {PICK}",
                            (n,),
                        )
                    elif what == "delete":
                        conn.execute(f"DELETE FROM runs WHERE run_id IN {PICK}", (n,))
                    elif what == "delete_thread":
                        conn.execute(
                            "DELETE FROM threads WHERE thread_id IN"
                            f" (SELECT thread_id FROM runs WHERE run_id IN {PICK})",
                            (n,),
                        )
                    else:
                        conn.execute(COMPACT_RUN_COUNTS_SQL, {"rows": 0})
            counted, actual = agree(conn)
            assert counted == actual
    finally:
        conn.execute("DELETE FROM threads WHERE owner = %s", (TAG,))
    counted, actual = agree(conn)
    assert counted == actual


def test_ops_folds_while_runs_change_keep_every_count(settings: Settings) -> None:
    """folds running beside four writers that insert and move runs (the reaper's leader
    folding while workers claim and end runs) lose no delta, and a fold leaves one row per
    status."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer() -> None:
        try:
            with psycopg.connect(settings.dsn, autocommit=True, row_factory=dict_row) as c:
                tids = []
                for _ in range(30):
                    tid = new_thread(c)
                    tids.append(tid)
                    with c.transaction():
                        insert_runs(c, tid, 1)
                        c.execute(
                            "UPDATE runs SET status = 'running' WHERE thread_id = %s"
                            " AND status = 'pending'",
                            (tid,),
                        )
                    c.execute(
                        "UPDATE runs SET status = 'success', ended_at = now()"
                        " WHERE thread_id = %s AND status = 'running'",
                        (tid,),
                    )
                c.execute("DELETE FROM threads WHERE thread_id = ANY(%s::uuid[])", (tids,))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    def folder() -> None:
        try:
            with psycopg.connect(settings.dsn, autocommit=True) as c:
                while not stop.is_set():
                    c.execute(COMPACT_RUN_COUNTS_SQL, {"rows": 0})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    writers = [threading.Thread(target=writer) for _ in range(4)]
    folders = [threading.Thread(target=folder) for _ in range(2)]
    for t in writers + folders:
        t.start()
    for t in writers:
        t.join(timeout=120)
    stop.set()
    for t in folders:
        t.join(timeout=30)
    assert errors == []
    with psycopg.connect(settings.dsn, autocommit=True, row_factory=dict_row) as conn:
        counted, actual = agree(conn)
        assert counted == actual
        conn.execute(COMPACT_RUN_COUNTS_SQL, {"rows": 0})
        per_status = conn.execute(
            "SELECT status, count(*) AS n FROM run_status_counts GROUP BY status"
        ).fetchall()
        assert all(r["n"] <= 2 for r in per_status)  # one, plus what others wrote since
        counted, actual = agree(conn)
        assert counted == actual


def test_ops_ops_reads_touch_no_run_outside_their_window(conn: psycopg.Connection[Any]) -> None:
    """with 3,000 runs ended two days ago and 3 failures ended now, the counts by status
    read no run, and the window's ended runs and failures read only the window's."""
    tid = new_thread(conn)
    try:
        insert_runs(conn, tid, 3_000, "success")
        conn.execute(
            "UPDATE runs SET ended_at = now() - interval '2 days' WHERE thread_id = %s", (tid,)
        )
        insert_runs(conn, tid, 3, "error")
        conn.execute("VACUUM ANALYZE runs")
        assert rows_touched(conn, RUNS_BY_STATUS_SQL, {}, "runs") == 0
        window = {"window_s": 3600.0, "limit": 50}
        assert rows_touched(conn, ENDED_SQL, window, "runs") <= 50
        assert rows_touched(conn, FAILURES_SQL, window, "runs") <= 50
        failures = conn.execute(FAILURES_SQL, window).fetchall()
        assert sum(1 for r in failures if r["thread_id"] == tid) == 3
    finally:
        conn.execute("DELETE FROM threads WHERE thread_id = %s", (tid,))


def test_ops_migration_counts_what_was_there_and_indexes_are_rebuilt(settings: Settings) -> None:
    """the migration, replayed on a database with runs (in a transaction rolled back),
    starts the counts at the runs of each status; the migration step builds its concurrent
    indexes again when one is missing or was left invalid by an interrupted build."""
    (mig,) = [m for m in migrate.migrations() if m.name == "run_status_counts"]
    with psycopg.connect(
        settings.dsn, autocommit=True, row_factory=dict_row, prepare_threshold=None
    ) as conn:
        with conn.transaction(force_rollback=True):
            conn.execute(
                "DROP TABLE run_status_counts; DROP FUNCTION run_status_counts_rows() CASCADE;"
                " DROP FUNCTION run_status_counts_moved() CASCADE;"
                " DROP FUNCTION run_status_counts_truncate() CASCADE"
            )
            insert_runs(conn, new_thread(conn), 4, "success")
            conn.execute(mig.sql)
            counted, actual = agree(conn)
            assert counted == actual and int(actual["success"]) >= 4
        assert migrate.create_concurrent_indexes(conn) == []
        conn.execute("DROP INDEX runs_failed_ended")
        conn.execute(
            "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'runs_ended'::regclass"
        )
        assert migrate.create_concurrent_indexes(conn) == ["runs_ended", "runs_failed_ended"]
        valid = conn.execute(
            "SELECT count(*) AS n FROM pg_index WHERE indisvalid AND indexrelid IN"
            " ('runs_ended'::regclass, 'runs_failed_ended'::regclass)"
        ).fetchone()
        assert valid is not None and valid["n"] == 2
