"""A thread's queue of runs, read and advanced inside a caller's transaction.

A thread runs one run at a time; its pending runs wait behind it in admission (`seq`)
order. Reading that queue (`inflight_in`: admission, an explicit cancel, a thread delete)
and advancing it when its head ends (`settle_in`: a finish, the cancel of the head, the
reaper's end of an expired run) are steps of those callers' own transactions, in
shared/runs/admission_store.py, threads_store.py, claims.py and reaper_queries.py. They live
here, in none of those modules, so each imports them without importing another.
"""

from __future__ import annotations

from collections.abc import Iterable

import psycopg
from psycopg.rows import DictRow

from shared.runs.admission import Inflight
from shared.runs.queries import query
from shared.vocab import RunStatus, ThreadStatus

INFLIGHT_RUNS_SQL = query("inflight_runs")
SETTLE_THREAD_SQL = query("settle_thread")


def as_inflight(rows: Iterable[DictRow]) -> list[Inflight]:
    """Rows of `INFLIGHT_RUNS_SQL` as the admission decision reads them."""
    return [Inflight(r["run_id"], RunStatus(r["status"]), int(r["attempt"])) for r in rows]


def inflight_in(
    conn: psycopg.Connection[DictRow], thread_id: str, *, limit: int | None
) -> list[Inflight]:
    """The thread's pending and running runs in FIFO order (at most `limit`)."""
    return as_inflight(conn.execute(INFLIGHT_RUNS_SQL, {"thread_id": thread_id, "limit": limit}))


def queue_settle(
    conn: psycopg.Connection[DictRow], thread_id: str, idle_status: ThreadStatus
) -> psycopg.Cursor[DictRow]:
    """Send (or, in pipeline mode, queue) `SETTLE_THREAD_SQL`; its row says the run to
    dispatch (`next_run_id`), readable once the statement's results arrived."""
    return conn.execute(SETTLE_THREAD_SQL, {"thread_id": thread_id, "status": idle_status})


def next_run_id(row: DictRow | None) -> str | None:
    """The run `SETTLE_THREAD_SQL` dispatched, if any."""
    return None if row is None or row["next_run_id"] is None else str(row["next_run_id"])


def settle_in(
    conn: psycopg.Connection[DictRow], thread_id: str, idle_status: ThreadStatus
) -> str | None:
    """Pick the next pending run (marking it dispatched) or set the thread's idle status
    (`SETTLE_THREAD_SQL`); the run to dispatch, if any."""
    return next_run_id(queue_settle(conn, thread_id, idle_status).fetchone())
