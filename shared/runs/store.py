"""SQL for threads and runs. Only this module speaks SQL about them (STYLE 4)."""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from shared import serde
from shared.db import DictPool, pipeline_block, pipelined_transaction
from shared.errors import Conflict, RunNotFound, ThreadBusy, ThreadExists, ThreadNotFound
from shared.journal import Category, queue_in, with_event
from shared.runs import thread_ids
from shared.runs.admission import (
    AdmissionDecision,
    CancelOutcome,
    Inflight,
    cancel_outcome,
    decide,
    inflight_needed,
)
from shared.runs.model import (
    CancelAction,
    JSONObject,
    MultitaskStrategy,
    Run,
    RunRef,
    RunRequest,
    RunStatus,
    Thread,
    ThreadStatus,
)
from shared.webhooks import store as webhooks

log = logging.getLogger(__name__)


def _isolated(
    conn: psycopg.Connection[DictRow],
    pipeline: psycopg.Pipeline,
    write: Callable[[psycopg.Connection[DictRow]], None],
) -> None:
    """Queue `write` under a savepoint of the caller's pipelined transaction and send it
    (one round trip); if it fails, roll back to the savepoint and log: the transaction goes
    on without it."""
    conn.execute("SAVEPOINT isolated", prepare=False)
    write(conn)
    try:
        pipeline.sync()
    except psycopg.Error:
        if conn.broken:
            raise  # the connection, not the write: the whole transaction is lost
        log.exception("an optional write of the transaction failed; rolled back alone")
        conn.execute("ROLLBACK TO SAVEPOINT isolated", prepare=False)


def _queue_settle(
    conn: psycopg.Connection[DictRow], thread_id: str, idle_status: ThreadStatus
) -> psycopg.Cursor[DictRow]:
    """Send (or, in pipeline mode, queue) `SETTLE_THREAD_SQL`; its row says the run to
    dispatch (`_next_run_id`), readable once the statement's results arrived."""
    return conn.execute(SETTLE_THREAD_SQL, {"thread_id": thread_id, "status": idle_status})


def _next_run_id(row: DictRow | None) -> str | None:
    """The run `SETTLE_THREAD_SQL` dispatched, if any."""
    return None if row is None or row["next_run_id"] is None else str(row["next_run_id"])


def _json(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value, dumps=serde.dumps_str)


# --- threads --------------------------------------------------------------------------
INSERT_THREAD_SQL = """
INSERT INTO threads (thread_id, public_id, owner, metadata)
VALUES (%(thread_id)s, coalesce(%(public_id)s::uuid, %(thread_id)s::uuid), %(owner)s, %(metadata)s)
ON CONFLICT DO NOTHING
RETURNING *
"""
"""Either key may conflict: the storage id, or the owner's public id (a client that chose
an id its own server-made thread has)."""
RESOLVE_THREAD_SQL = """
SELECT thread_id::text FROM threads WHERE owner = %(owner)s AND public_id = %(public_id)s
"""
PUBLIC_IDS_SQL = """
SELECT thread_id::text, public_id::text FROM threads
WHERE owner = %(owner)s AND thread_id = ANY(%(ids)s::uuid[]) AND public_id <> thread_id
"""
GET_THREAD_BY_PUBLIC_SQL = (
    "SELECT * FROM threads WHERE owner = %(owner)s AND public_id = %(public_id)s"
)
INSERT_THREAD_COPY_SQL = """
INSERT INTO threads (thread_id, owner, metadata, status)
VALUES (%(thread_id)s, %(owner)s, %(metadata)s, %(status)s)
RETURNING *
"""
GET_THREAD_SQL = "SELECT * FROM threads WHERE thread_id = %(thread_id)s AND owner = %(owner)s"
LOCK_THREAD_SQL = GET_THREAD_SQL + " FOR UPDATE"
LOCK_THREAD_BY_ID_SQL = (
    "SELECT thread_id, owner FROM threads WHERE thread_id = %(thread_id)s FOR UPDATE"
)
PATCH_THREAD_SQL = """
UPDATE threads SET metadata = metadata || %(metadata)s, updated_at = now()
WHERE thread_id = %(thread_id)s AND owner = %(owner)s
RETURNING *
"""
LOCK_THREAD_CRONS_SQL = """
SELECT c.cron_id FROM crons c JOIN threads t ON t.thread_id = c.thread_id
WHERE c.thread_id = %(thread_id)s AND t.owner = %(owner)s
ORDER BY c.cron_id
FOR UPDATE OF c
"""
"""The thread's crons, locked before the thread row: a cron firing (shared/crons/store.py)
holds its cron rows and then locks the thread to admit the run, so a delete that locked the
thread first and reached the crons through the cascade took the same two locks the other
way round and one of the two was aborted as a deadlock victim."""
DELETE_THREAD_SQL = (
    "DELETE FROM threads WHERE thread_id = %(thread_id)s AND owner = %(owner)s RETURNING thread_id"
)
SEARCH_THREADS_SQL = """
SELECT * FROM threads
WHERE owner = %(owner)s
  AND metadata @> %(metadata)s
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(ids)s::uuid[] IS NULL OR public_id = ANY(%(ids)s))
  AND (%(title_like)s::text IS NULL OR metadata->>'title' ILIKE %(title_like)s)
ORDER BY {order}
LIMIT %(limit)s OFFSET %(offset)s
"""
COUNT_THREADS_SQL = """
SELECT count(*) AS n FROM threads
WHERE owner = %(owner)s AND metadata @> %(metadata)s
  AND (%(status)s::text IS NULL OR status = %(status)s)
"""
"""`title_like` (the text query) scans the owner's threads (`threads_owner_created`): a
user's threads, not the table; a trigram index on the title would be the next step if one
user kept very many."""
THREAD_SORT_COLUMNS = {"thread_id", "status", "created_at", "updated_at"}

# --- admission (R2): one transaction, thread row locked, no IO in between -----------------
INFLIGHT_RUNS_SQL = """
SELECT run_id::text, status, attempt FROM runs
WHERE thread_id = %(thread_id)s AND status IN ('pending', 'running')
ORDER BY seq
LIMIT %(limit)s
"""
INSERT_RUN_SQL = """
INSERT INTO runs (run_id, thread_id, assistant_id, graph_id, status, input, command, config,
                  context, metadata, kwargs, multitask_strategy, on_disconnect, on_completion,
                  webhook, dispatched_at, due_at, created_at, updated_at)
VALUES (%(run_id)s, %(thread_id)s, %(assistant_id)s, %(graph_id)s, 'pending', %(input)s,
        %(command)s, %(config)s, %(context)s, %(metadata)s, %(kwargs)s,
        %(multitask_strategy)s, %(on_disconnect)s, %(on_completion)s, %(webhook)s,
        CASE WHEN %(dispatch)s THEN now() END,
        CASE WHEN %(after_s)s > 0 THEN clock_timestamp() + make_interval(secs => %(after_s)s) END,
        -- clock_timestamp(), not now(): taken after the thread lock, so created_at
        -- follows admission (= execution) order, not transaction start order.
        clock_timestamp(), clock_timestamp())
RETURNING *
"""
MARK_THREAD_BUSY_SQL = """
UPDATE threads SET status = 'busy', updated_at = now(),
       metadata = metadata || jsonb_build_object('graph_id', %(graph_id)s::text,
                                                 'assistant_id', %(assistant_id)s::text)
WHERE thread_id = %(thread_id)s
"""
INTERRUPT_PENDING_SQL = """
UPDATE runs SET status = 'interrupted', ended_at = now(), updated_at = now(),
       cancel_action = %(action)s
WHERE run_id = %(run_id)s AND status = 'pending'
"""
REQUEST_CANCEL_RUNNING_SQL = """
UPDATE runs SET cancel_action = %(action)s, updated_at = now()
WHERE run_id = %(run_id)s AND status = 'running' AND cancel_action IS NULL
"""
REQUEST_ROLLBACK_PENDING_SQL = """
UPDATE runs SET cancel_action = 'rollback', updated_at = now()
WHERE run_id = %(run_id)s AND status = 'pending' AND cancel_action IS NULL
"""
"""A pending run that already ran (requeued) may have written checkpoints: it stays
pending, and the attempt that claims it restores the pre-run state instead of running."""

# --- runs -------------------------------------------------------------------------------
GET_RUN_SQL = """
SELECT r.* FROM runs r JOIN threads t USING (thread_id)
WHERE r.run_id = %(run_id)s AND r.thread_id = %(thread_id)s AND t.owner = %(owner)s
"""
GET_RUN_BY_ID_SQL = """
SELECT r.*, t.owner AS user_id, t.public_id AS thread_public_id
FROM runs r JOIN threads t USING (thread_id)
WHERE r.run_id = %(run_id)s
"""
RUN_STATUS_SQL = "SELECT status FROM runs WHERE run_id = %(run_id)s"
UNSTARTED_END_SQL = """
SELECT status FROM runs
WHERE run_id = %(run_id)s AND started_at IS NULL AND status NOT IN ('pending', 'running')
"""
RUN_OWNER_SQL = """
SELECT t.owner FROM runs r JOIN threads t USING (thread_id)
WHERE r.run_id = %(run_id)s AND r.status = 'pending'
"""
WAITING_OWNERS_SQL = """
SELECT DISTINCT t.owner FROM runs r JOIN threads t USING (thread_id)
WHERE r.status = 'pending' AND t.owner <> %(owner)s
  AND (r.due_at IS NULL OR r.due_at <= now())
  AND NOT EXISTS (
      SELECT 1 FROM runs o
      WHERE o.thread_id = r.thread_id AND o.run_id <> r.run_id
        AND (o.status = 'running' OR (o.status = 'pending' AND o.seq < r.seq)))
LIMIT %(limit)s
"""
INFLIGHT_AMONG_SQL = """
SELECT run_id::text FROM runs
WHERE run_id = ANY(%(run_ids)s::uuid[]) AND status IN ('pending', 'running')
"""
# --- thread followers (GET /threads/{id}/stream): the thread's runs in admission order ---
# `seq` is taken under the thread lock (admission), so on one thread it is commit order.
FOLLOW_START_SQL = """
SELECT (SELECT min(seq) FROM runs WHERE thread_id = %(thread_id)s
          AND status IN ('pending', 'running')) AS inflight,
       (SELECT max(seq) FROM runs WHERE thread_id = %(thread_id)s) AS newest
"""
RUNS_AFTER_SQL = """
SELECT r.run_id, r.seq, r.status, r.started
FROM threads t
LEFT JOIN LATERAL (
    SELECT run_id::text, seq, status, attempt > 0 AS started FROM runs
    WHERE thread_id = t.thread_id AND seq > %(seq)s ORDER BY seq LIMIT %(limit)s
) r ON true
WHERE t.thread_id = %(thread_id)s
"""
RUN_REF_SQL = """
SELECT run_id::text, seq, status, attempt > 0 AS started FROM runs
WHERE run_id = %(run_id)s AND thread_id = %(thread_id)s
"""
LIST_RUNS_SQL = """
SELECT r.* FROM runs r JOIN threads t USING (thread_id)
WHERE r.thread_id = %(thread_id)s AND t.owner = %(owner)s
  AND (%(status)s::text IS NULL OR r.status = %(status)s)
ORDER BY r.seq DESC
LIMIT %(limit)s OFFSET %(offset)s
"""
DELETE_RUN_SQL = """
DELETE FROM runs WHERE run_id = %(run_id)s AND status NOT IN ('pending', 'running')
RETURNING run_id
"""

INFLIGHT_OF_OWNER_SQL = """
SELECT r.* FROM runs r JOIN threads t USING (thread_id)
WHERE t.owner = %(owner)s AND r.status = ANY(%(statuses)s)
  AND (%(thread_id)s::uuid IS NULL OR r.thread_id = %(thread_id)s::uuid)
  AND (%(run_ids)s::uuid[] IS NULL OR r.run_id = ANY(%(run_ids)s::uuid[]))
ORDER BY r.seq DESC
"""
"""Newest first: cancelling a thread's queue from its tail never dispatches a run that is
about to be cancelled too."""

# --- temporary threads of runs without a thread ---------------------------------------------
TEMPORARY_THREAD_FINISHED_SQL = """
SELECT EXISTS (SELECT 1 FROM runs WHERE thread_id = %(thread_id)s AND on_completion = 'delete')
   AND NOT EXISTS (SELECT 1 FROM runs
                   WHERE thread_id = %(thread_id)s AND status IN ('pending', 'running'))
   AND NOT EXISTS (SELECT 1 FROM webhook_deliveries
                   WHERE thread_id = %(thread_id)s AND state = 'pending' AND body IS NULL)
   AS finished
"""
"""Read after the thread row is locked, in its own statement: admissions hold that lock
while they insert, so this sees every run that will ever be on the thread until we commit.
A run's webhook body is read from the thread (its final values): the thread waits until
the delivery has frozen it (the recovery pass deletes it then)."""
DELETE_THREAD_BY_ID_SQL = "DELETE FROM threads WHERE thread_id = %(thread_id)s"
FINISHED_TEMPORARY_THREADS_SQL = """
SELECT DISTINCT r.thread_id::text AS thread_id FROM runs r
WHERE r.on_completion = 'delete' AND r.status NOT IN ('pending', 'running')
  AND r.ended_at < now() - make_interval(secs => %(grace_s)s)
  AND NOT EXISTS (SELECT 1 FROM runs o
                  WHERE o.thread_id = r.thread_id AND o.status IN ('pending', 'running'))
  AND NOT EXISTS (SELECT 1 FROM webhook_deliveries w
                  WHERE w.thread_id = r.thread_id AND w.state = 'pending' AND w.body IS NULL)
LIMIT %(limit)s
"""

# --- claim and finish (L1, L2) -------------------------------------------------------------
CLAIM_SQL = """
UPDATE runs r
SET status = 'running', owner = %(owner)s, owner_epoch = r.owner_epoch + 1,
    attempt = r.attempt + 1, started_at = coalesce(r.started_at, now()), updated_at = now()
WHERE r.run_id = %(run_id)s AND r.status = 'pending'
  AND (r.due_at IS NULL OR r.due_at <= now())
  AND NOT EXISTS (
      SELECT 1 FROM runs o
      WHERE o.thread_id = r.thread_id AND o.run_id <> r.run_id
        AND (o.status = 'running' OR (o.status = 'pending' AND o.seq < r.seq)))
RETURNING r.*, (SELECT t.owner FROM threads t WHERE t.thread_id = r.thread_id) AS user_id
"""
# The claim and its `claimed` lifecycle event in one statement (one round trip with its
# commit, on every run's path to its first token).
CLAIM_LOGGED_SQL = with_event(
    CLAIM_SQL,
    "jsonb_build_object('owner', changed.owner, 'epoch', changed.owner_epoch,"
    " 'attempt', changed.attempt)",
)
SET_PRE_RUN_CHECKPOINT_SQL = """
UPDATE runs SET pre_run_checkpoint_id = %(checkpoint_id)s, pre_run_writes = %(writes)s
WHERE run_id = %(run_id)s AND owner_epoch = %(epoch)s AND status = 'running'
  AND pre_run_checkpoint_id IS NULL
"""
FINISH_SQL = """
UPDATE runs SET status = %(status)s, error = %(error)s, ended_at = now(), updated_at = now(),
       usage = coalesce(%(usage)s, usage)
WHERE run_id = %(run_id)s AND owner_epoch = %(epoch)s AND status = 'running'
RETURNING thread_id
"""
SETTLE_THREAD_SQL = """
WITH running AS (
    SELECT 1 FROM runs WHERE thread_id = %(thread_id)s AND status = 'running' LIMIT 1
), nxt AS (
    SELECT run_id, (due_at IS NULL OR due_at <= now()) AS due FROM runs
    WHERE thread_id = %(thread_id)s AND status = 'pending' AND NOT EXISTS (SELECT FROM running)
    ORDER BY seq LIMIT 1
), dispatched AS (
    UPDATE runs SET dispatched_at = now() WHERE run_id = (SELECT run_id FROM nxt WHERE due)
    RETURNING run_id::text
), settled AS (
    UPDATE threads SET status = %(status)s, updated_at = now()
    WHERE thread_id = %(thread_id)s
      AND NOT EXISTS (SELECT FROM running) AND NOT EXISTS (SELECT FROM nxt)
)
SELECT (SELECT run_id FROM dispatched) AS next_run_id
"""
"""`RunStore._settle_thread` in one statement (one round trip): a running run of the thread
hands over when it ends; else the next pending run is dispatched if due (a delayed one not
yet due keeps the thread busy: the reaper dispatches it once due, R4); else the thread takes
its idle status. Its data-modifying parts run whether or not the SELECT reads them."""
LIST_RUN_EVENTS_SQL = """
SELECT seq, category, type, payload, created_at FROM run_events
WHERE run_id = %(run_id)s ORDER BY seq
"""

# --- reaper (R4) -------------------------------------------------------------------------
STALE_PENDING_HEADS_SQL = """
UPDATE runs r SET dispatched_at = now()
WHERE r.status = 'pending'
  AND (r.due_at IS NULL OR r.due_at <= now())
  AND (r.dispatched_at IS NULL OR r.dispatched_at < now() - make_interval(secs => %(stale_s)s))
  AND NOT EXISTS (
      SELECT 1 FROM runs o
      WHERE o.thread_id = r.thread_id AND o.run_id <> r.run_id
        AND (o.status = 'running' OR (o.status = 'pending' AND o.seq < r.seq)))
RETURNING r.run_id::text
"""
RUNNING_RUNS_SQL = """
SELECT run_id::text, thread_id::text, owner_epoch, attempt, cancel_action FROM runs
WHERE status = 'running' AND updated_at < now() - make_interval(secs => %(min_age_s)s)
"""
FAIL_EXPIRED_SQL = """
UPDATE runs SET status = 'error', error = %(error)s, ended_at = now(), updated_at = now(),
       owner = %(owner)s, owner_epoch = owner_epoch + 1
WHERE run_id = %(run_id)s AND owner_epoch = %(epoch)s AND status = 'running'
RETURNING thread_id, owner_epoch,
          (SELECT t.owner FROM threads t WHERE t.thread_id = runs.thread_id) AS user_id
"""
REQUEUE_EXPIRED_SQL = """
UPDATE runs SET status = 'pending', owner = NULL, dispatched_at = now(), updated_at = now()
WHERE run_id = %(run_id)s AND status = 'running' AND owner_epoch = %(epoch)s
RETURNING thread_id
"""


def _like_literal(text: str) -> str:
    """`text` for a LIKE pattern, matching itself: the escape (backslash) and wildcards escaped."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _as_inflight(rows: Iterable[DictRow]) -> list[Inflight]:
    return [Inflight(r["run_id"], RunStatus(r["status"]), int(r["attempt"])) for r in rows]


def _lock_timeout(conn: psycopg.Connection[DictRow], seconds: float | None) -> None:
    """A transaction-local lock_timeout (no-op for None)."""
    if seconds is not None:
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(seconds * 1000)}ms",))


class ClaimOutcome(enum.Enum):
    """Why a claim did or did not give us the run."""

    CLAIMED = "claimed"
    NOT_PENDING = "not_pending"  # duplicate delivery, already running or finished (L3)
    NOT_HEAD = "not_head"  # another run of the thread goes first; it will dispatch us


@dataclass(frozen=True, slots=True)
class Claim:
    """The result of a claim; `run` is the claimed run (with its owner's `user_id`)."""

    outcome: ClaimOutcome
    run: Run | None = None


@dataclass(frozen=True, slots=True)
class AdmitItem:
    """One run to admit: the request, its new id, its graph and the strategy in force."""

    request: RunRequest
    run_id: str
    graph_id: str
    strategy: MultitaskStrategy


@dataclass(frozen=True, slots=True)
class Admission:
    """The admitted run (None when rejected) and what must happen after commit."""

    decision: AdmissionDecision
    run: Run | None
    dispatch: list[str]
    cancel_running: list[str]
    ended: tuple[str, ...] = ()  # pending runs it cancelled: their webhooks are due

    @property
    def cancel_action(self) -> CancelAction:
        """How the cancelled runs end."""
        return self.decision.action


@dataclass(frozen=True, slots=True)
class Expired:
    """A run the reaper ended: its new epoch (now the reaper's), the error, the next run,
    and the user whose active runs it counted against."""

    epoch: int
    error: JSONObject
    next_run_id: str | None
    user_id: str | None = None


@dataclass(frozen=True, slots=True)
class Finish:
    """The result of a fenced terminal write: refused (a newer epoch owns the run) or the
    next run of the thread to dispatch."""

    fenced: bool
    next_run_id: str | None = None


@dataclass(frozen=True, slots=True)
class RunningRun:
    """A running run as the reaper sees it: enough to check its lease and fence a requeue."""

    run_id: str
    thread_id: str
    owner_epoch: int
    attempt: int
    cancel_action: CancelAction | None


class RunStore:
    """Threads and runs in Postgres."""

    def __init__(self, pool: DictPool) -> None:
        self._pool = pool

    # threads ----------------------------------------------------------------------
    def create_thread(
        self, thread_id: str | None, owner: str, metadata: JSONObject, if_exists: str
    ) -> Thread:
        """Create a thread; `if_exists` is 'raise' or 'do_nothing' (return the existing one).

        `thread_id` is the client's choice (its public id), stored under the owner's own
        storage id (A4, shared/runs/thread_ids.py): only the owner's threads can conflict,
        another user's thread with that id is neither met nor revealed."""
        public = thread_id or str(uuid.uuid4())
        tid = thread_ids.storage_id(owner, public) if thread_id else public
        params = {"thread_id": tid, "public_id": public, "owner": owner}
        with self._pool.connection() as conn:
            row = conn.execute(
                INSERT_THREAD_SQL, {**params, "metadata": _json(metadata)}
            ).fetchone()
            if row is not None:
                return Thread.from_row(row)
            existing = conn.execute(GET_THREAD_BY_PUBLIC_SQL, params).fetchone()
        if existing is None or if_exists == "raise":  # None: deleted meanwhile
            raise ThreadExists(f"thread {public} already exists")
        return Thread.from_row(existing)

    def resolve_thread_id(self, owner: str, public_id: str) -> str:
        """The storage id of `owner`'s thread with the client's id `public_id` (A4); for
        one it has not, the storage id such a thread would have (every lookup with it then
        answers 404 like any missing thread, and `if_not_exists=create` makes it there)."""
        with self._pool.connection() as conn:
            row = conn.execute(
                RESOLVE_THREAD_SQL, {"owner": owner, "public_id": public_id}
            ).fetchone()
        return str(row["thread_id"]) if row is not None else thread_ids.storage_id(owner, public_id)

    def public_ids(self, owner: str, storage_ids: Collection[str]) -> dict[str, str]:
        """Storage id -> public id of those of `owner`'s threads whose ids differ."""
        ids = [i for i in storage_ids if _is_uuid(i)]
        if not ids:
            return {}
        with self._pool.connection() as conn:
            rows = conn.execute(PUBLIC_IDS_SQL, {"owner": owner, "ids": ids}).fetchall()
        return {r["thread_id"]: r["public_id"] for r in rows}

    def get_thread_by_public_id(self, public_id: str, owner: str) -> Thread:
        """`owner`'s thread with the client's id `public_id`, or ThreadNotFound."""
        with self._pool.connection() as conn:
            row = conn.execute(
                GET_THREAD_BY_PUBLIC_SQL, {"owner": owner, "public_id": public_id}
            ).fetchone()
        if row is None:
            raise ThreadNotFound(f"thread {public_id} not found")
        return Thread.from_row(row)

    def create_thread_copy(self, source: Thread, thread_id: str) -> Thread:
        """A new thread of `source`'s owner with its metadata and status; the copy of a busy
        thread is idle (runs are not copied)."""
        status = ThreadStatus.IDLE if source.status is ThreadStatus.BUSY else source.status
        with self._pool.connection() as conn:
            row = conn.execute(
                INSERT_THREAD_COPY_SQL,
                {
                    "thread_id": thread_id,
                    "owner": source.owner,
                    "metadata": _json(source.metadata),
                    "status": status,
                },
            ).fetchone()
        assert row is not None  # INSERT … RETURNING
        return Thread.from_row(row)

    def get_thread(self, thread_id: str, owner: str) -> Thread:
        """The thread, or ThreadNotFound (also for another user's thread)."""
        with self._pool.connection() as conn:
            row = conn.execute(GET_THREAD_SQL, {"thread_id": thread_id, "owner": owner}).fetchone()
        if row is None:
            raise ThreadNotFound(f"thread {thread_id} not found")
        return Thread.from_row(row)

    def patch_thread(self, thread_id: str, owner: str, metadata: JSONObject) -> Thread:
        """Merge metadata into the thread's."""
        with self._pool.connection() as conn:
            row = conn.execute(
                PATCH_THREAD_SQL,
                {"thread_id": thread_id, "owner": owner, "metadata": _json(metadata)},
            ).fetchone()
        if row is None:
            raise ThreadNotFound(f"thread {thread_id} not found")
        return Thread.from_row(row)

    def delete_thread(self, thread_id: str, owner: str) -> list[str]:
        """Delete the thread and its runs; return the ids of runs that were still running.

        Lock order, the same as a cron firing's: the thread's crons, then the thread (the
        delete cascades to both)."""
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(LOCK_THREAD_CRONS_SQL, {"thread_id": thread_id, "owner": owner})
            thread = conn.execute(
                LOCK_THREAD_SQL, {"thread_id": thread_id, "owner": owner}
            ).fetchone()
            if thread is None:
                raise ThreadNotFound(f"thread {thread_id} not found")
            running = [
                v.run_id
                for v in self._inflight(conn, thread_id, limit=None)
                if v.status is RunStatus.RUNNING
            ]
            conn.execute(DELETE_THREAD_SQL, {"thread_id": thread_id, "owner": owner})
        return running

    def search_threads(
        self,
        owner: str,
        *,
        metadata: JSONObject,
        status: ThreadStatus | None,
        ids: list[str] | None,
        limit: int,
        offset: int,
        sort_by: str,
        sort_order: str,
        query: str | None = None,
    ) -> list[Thread]:
        """Threads of `owner` matching a metadata containment filter and, with `query`, whose
        `metadata.title` contains that text case-insensitively (taken literally)."""
        if sort_by not in THREAD_SORT_COLUMNS:
            raise ValueError(f"sort_by {sort_by!r}")
        column = "public_id" if sort_by == "thread_id" else sort_by  # the ids the client sees
        order = f"{column} {'ASC' if sort_order == 'asc' else 'DESC'}, thread_id"
        sql = SEARCH_THREADS_SQL.format(order=order)
        with self._pool.connection() as conn:
            rows = conn.execute(
                sql,
                {
                    "owner": owner,
                    "metadata": _json(metadata),
                    "status": status,
                    "ids": ids,
                    "title_like": None if query is None else f"%{_like_literal(query)}%",
                    "limit": limit,
                    "offset": offset,
                },
            ).fetchall()
        return [Thread.from_row(r) for r in rows]

    def count_threads(
        self, owner: str, *, metadata: JSONObject, status: ThreadStatus | None
    ) -> int:
        """How many threads match."""
        with self._pool.connection() as conn:
            row = conn.execute(
                COUNT_THREADS_SQL, {"owner": owner, "metadata": _json(metadata), "status": status}
            ).fetchone()
        return int(row["n"]) if row else 0

    # admission ----------------------------------------------------------------------
    def admit(
        self,
        request: RunRequest,
        *,
        run_id: str,
        owner: str,
        graph_id: str,
        strategy: MultitaskStrategy,
    ) -> Admission:
        """Write what `admission.decide` decides (R2): the thread row lock serialises admissions,
        and nothing but SQL happens between reading the inflight runs and the insert."""
        item = AdmitItem(request, run_id, graph_id, strategy)
        # Two round trips: BEGIN with the reads, then the writes with COMMIT; the run row
        # is read back once the block has ended (docs/performance.md).
        with self._pool.connection() as conn:
            with pipelined_transaction(conn):
                admission = self._queue_admission(conn, owner, item)
            return admission()

    def admit_many(self, owner: str, items: Sequence[AdmitItem]) -> list[Admission]:
        """Admit a batch all or nothing: one transaction; an item whose thread is missing
        (404) or busy under `reject` (409) rolls back every other and names its index.

        The threads are created and locked first, in id order, so two batches that share
        threads cannot deadlock; then the items are admitted in request order (FIFO).
        """
        with self._pool.connection() as conn, conn.transaction():
            for thread_id, create, public_id in sorted(
                {
                    (i.request.thread_id, i.request.create_thread, i.request.public_thread_id)
                    for i in items
                },
                key=lambda t: t[0],
            ):
                params = {"thread_id": thread_id, "owner": owner}
                if create:
                    conn.execute(
                        INSERT_THREAD_SQL,
                        {**params, "public_id": public_id, "metadata": _json({})},
                    )
                conn.execute(LOCK_THREAD_SQL, params)
            admissions = []
            for index, item in enumerate(items):
                try:
                    admission = self._admit_in(conn, owner, item)
                except ThreadNotFound as exc:
                    raise ThreadNotFound(f"item {index}: {exc}") from exc
                if not admission.decision.creates:
                    raise ThreadBusy(
                        f"item {index}: thread {item.request.thread_id} already has a run in"
                        " progress (multitask_strategy=reject)"
                    )
                admissions.append(admission)
        return admissions

    def admit_in(self, conn: psycopg.Connection[DictRow], owner: str, item: AdmitItem) -> Admission:
        """`admit` inside the caller's transaction: a cron firing commits the run with its
        firing record and its schedule's advance, all or nothing (shared/crons/store.py)."""
        return self._admit_in(conn, owner, item)

    def _admit_in(
        self, conn: psycopg.Connection[DictRow], owner: str, item: AdmitItem
    ) -> Admission:
        """The admission of one run inside the caller's transaction."""
        return self._queue_admission(conn, owner, item)()

    def _queue_admission(
        self, conn: psycopg.Connection[DictRow], owner: str, item: AdmitItem
    ) -> Callable[[], Admission]:
        """Admit one run inside the caller's transaction, up to its queued writes; the
        admission is what the returned function answers (it reads the new run row back).

        Pipeline mode (libpq): the reads go in one round trip with whatever the caller
        queued before them (BEGIN), and the writes are only queued, so that a caller in a
        `pipelined_transaction` sends them with its COMMIT. A run's first token waits on
        every round trip before it (docs/performance.md). Outside pipeline mode each block
        is a pipeline of its own.
        """
        request, run_id, strategy = item.request, item.run_id, item.strategy
        thread_id = request.thread_id
        params = {"thread_id": thread_id, "owner": owner}
        with pipeline_block(conn):
            if request.create_thread:
                conn.execute(
                    INSERT_THREAD_SQL,
                    {**params, "public_id": request.public_thread_id, "metadata": _json({})},
                )
            locked = conn.execute(LOCK_THREAD_SQL, params)
            inflight_rows = conn.execute(
                INFLIGHT_RUNS_SQL, {"thread_id": thread_id, "limit": inflight_needed(strategy)}
            )
            if locked.fetchone() is None:
                raise ThreadNotFound(f"thread {thread_id} not found")
            inflight = _as_inflight(inflight_rows)
        decision = decide(strategy, inflight, delayed=request.after_seconds > 0)
        if not decision.creates:
            return lambda: Admission(decision, None, [], [])
        cancel_running: list[str] = []
        ended: list[str] = []
        for victim in decision.cancel:
            outcome, running = self._cancel_victim(
                conn, victim, thread_id, decision.action, by=run_id
            )
            if outcome is CancelOutcome.REQUESTED and running:
                cancel_running.append(victim.run_id)  # its owner must hear of it
            elif outcome is CancelOutcome.CANCELLED:
                ended.append(victim.run_id)
        with pipeline_block(conn):
            inserted = conn.execute(
                INSERT_RUN_SQL,
                {
                    **params,
                    "run_id": run_id,
                    "assistant_id": request.assistant_id,
                    "graph_id": item.graph_id,
                    "input": _json(request.input),
                    "command": _json(request.command),
                    "config": _json(request.config),
                    "context": _json(request.context),
                    "metadata": _json(request.metadata),
                    "kwargs": _json(request.kwargs),
                    "multitask_strategy": strategy,
                    "on_disconnect": request.on_disconnect,
                    "on_completion": request.on_completion,
                    "webhook": request.webhook,
                    "dispatch": decision.dispatch_now,
                    "after_s": request.after_seconds,
                },
            )
            if request.webhook is not None:  # the outbox row commits with the run
                webhooks.insert_in(conn, run_id, thread_id, request.webhook)
            conn.execute(
                MARK_THREAD_BUSY_SQL,
                {**params, "graph_id": item.graph_id, "assistant_id": request.assistant_id},
            )
            self._lifecycle(conn, run_id, thread_id, "created", {"outcome": decision.outcome.value})
        dispatch = [run_id] if decision.dispatch_now else []

        def admission() -> Admission:
            row = inserted.fetchone()
            assert row is not None
            return Admission(decision, Run.from_row(row), dispatch, cancel_running, tuple(ended))

        return admission

    def _inflight(
        self, conn: psycopg.Connection[DictRow], thread_id: str, *, limit: int | None
    ) -> list[Inflight]:
        """The thread's pending and running runs in FIFO order (at most `limit`)."""
        return _as_inflight(
            conn.execute(INFLIGHT_RUNS_SQL, {"thread_id": thread_id, "limit": limit})
        )

    def _cancel_victim(
        self,
        conn: psycopg.Connection[DictRow],
        victim: Inflight,
        thread_id: str,
        action: CancelAction,
        *,
        by: str,
    ) -> tuple[CancelOutcome, bool]:
        """Write `admission.cancel_outcome` for one inflight run in the caller's transaction
        (thread row locked): end it now, or record the request for its owner (R5). Also
        whether the run is running (its owner must be told).

        A claim takes no thread lock, so a run read as pending may have been claimed since:
        then ending it matches no row, and the request goes to its new owner instead (before,
        the run was journaled `interrupted` and ran on to `success`: two outcomes, and the
        cancel lost). Each write is synced on its own (a nested pipeline block) because its
        row count decides what follows.
        """
        params = {"run_id": victim.run_id, "action": action}
        running = victim.status is RunStatus.RUNNING
        if cancel_outcome(victim, action) is CancelOutcome.CANCELLED:
            with conn.pipeline():
                ended = conn.execute(INTERRUPT_PENDING_SQL, params)
            if ended.rowcount == 1:
                self._lifecycle(conn, victim.run_id, thread_id, RunStatus.INTERRUPTED, {"by": by})
                return CancelOutcome.CANCELLED, False
            running = True  # claimed since the read; if it has ended, nothing matches below
        sql = REQUEST_CANCEL_RUNNING_SQL if running else REQUEST_ROLLBACK_PENDING_SQL
        with conn.pipeline():
            requested = conn.execute(sql, params)
        if requested.rowcount == 0:
            return CancelOutcome.ALREADY_REQUESTED, running
        self._lifecycle(
            conn, victim.run_id, thread_id, "cancel_requested", {"action": action, "by": by}
        )
        return CancelOutcome.REQUESTED, running

    # runs -------------------------------------------------------------------------------
    def get_run(self, thread_id: str, run_id: str, owner: str) -> Run:
        """The run, or RunNotFound (also for another user's run)."""
        with self._pool.connection() as conn:
            row = conn.execute(
                GET_RUN_SQL, {"thread_id": thread_id, "run_id": run_id, "owner": owner}
            ).fetchone()
        if row is None:
            raise RunNotFound(f"run {run_id} not found")
        return Run.from_row(row)

    def get_run_by_id(self, run_id: str) -> Run | None:
        """The run regardless of owner, with the owner as `user_id` (workers and ops only)."""
        with self._pool.connection() as conn:
            row = conn.execute(GET_RUN_BY_ID_SQL, {"run_id": run_id}).fetchone()
        return None if row is None else Run.from_row(row)

    def run_status(self, run_id: str) -> RunStatus | None:
        """Just the status (None if the run is gone)."""
        with self._pool.connection() as conn:
            row = conn.execute(RUN_STATUS_SQL, {"run_id": run_id}).fetchone()
        return RunStatus(row["status"]) if row else None

    def run_owner(self, run_id: str) -> str | None:
        """The user whose pending run this is (None when it is not pending)."""
        with self._pool.connection() as conn:
            row = conn.execute(RUN_OWNER_SQL, {"run_id": run_id}).fetchone()
        return str(row["owner"]) if row else None

    def waiting_owners(self, other_than: str, limit: int = 50) -> set[str]:
        """Users other than `other_than` with a run that could be claimed now (pending, due,
        the head of its thread): who waits for a worker slot."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                WAITING_OWNERS_SQL, {"owner": other_than, "limit": limit}
            ).fetchall()
        return {str(r["owner"]) for r in rows}

    def unstarted_end(self, run_id: str) -> RunStatus | None:
        """The terminal status of a run that ended before any attempt started it (it has no
        stream), else None."""
        with self._pool.connection() as conn:
            row = conn.execute(UNSTARTED_END_SQL, {"run_id": run_id}).fetchone()
        return RunStatus(row["status"]) if row else None

    def ended_among(self, run_ids: Collection[str]) -> set[str]:
        """Those of `run_ids` that have ended or no longer exist, in one query (the
        active-run limit's prune; ids that are not UUIDs count as ended)."""
        valid = [r for r in run_ids if _is_uuid(r)]
        with self._pool.connection() as conn:
            rows = conn.execute(INFLIGHT_AMONG_SQL, {"run_ids": valid}).fetchall()
        return set(run_ids) - {r["run_id"] for r in rows}

    def follow_start(self, thread_id: str) -> tuple[int | None, int | None]:
        """(seq of the oldest pending or running run, seq of the newest run) of a thread."""
        with self._pool.connection() as conn:
            row = conn.execute(FOLLOW_START_SQL, {"thread_id": thread_id}).fetchone()
        assert row is not None  # an aggregate answers one row
        return row["inflight"], row["newest"]

    def runs_after(self, thread_id: str, seq: int, limit: int = 1) -> list[RunRef] | None:
        """The thread's runs admitted after `seq`, in admission order; None once the thread
        is gone (deleted while followed)."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                RUNS_AFTER_SQL, {"thread_id": thread_id, "seq": seq, "limit": limit}
            ).fetchall()
        if not rows:
            return None
        return [RunRef.from_row(r) for r in rows if r["run_id"] is not None]

    def run_ref(self, thread_id: str, run_id: str) -> RunRef | None:
        """One run of the thread as a follower sees it (None: not this thread's, or gone)."""
        with self._pool.connection() as conn:
            row = conn.execute(RUN_REF_SQL, {"thread_id": thread_id, "run_id": run_id}).fetchone()
        return RunRef.from_row(row) if row else None

    def list_runs(
        self, thread_id: str, owner: str, *, limit: int, offset: int, status: RunStatus | None
    ) -> list[Run]:
        """Runs of a thread, newest first."""
        self.get_thread(thread_id, owner)
        with self._pool.connection() as conn:
            rows = conn.execute(
                LIST_RUNS_SQL,
                {
                    "thread_id": thread_id,
                    "owner": owner,
                    "limit": limit,
                    "offset": offset,
                    "status": status,
                },
            ).fetchall()
        return [Run.from_row(r) for r in rows]

    def delete_run(self, thread_id: str, run_id: str, owner: str) -> None:
        """Delete a finished run; an inflight one must be cancelled first (409)."""
        self.get_run(thread_id, run_id, owner)
        with self._pool.connection() as conn:
            if conn.execute(DELETE_RUN_SQL, {"run_id": run_id}).fetchone() is None:
                raise Conflict(f"run {run_id} is still inflight; cancel it first")

    def request_cancel(
        self, thread_id: str, run_id: str, owner: str, action: CancelAction
    ) -> tuple[CancelOutcome, str | None]:
        """Record a cancel request; returns the outcome and a run to dispatch next, if any."""
        with self._pool.connection() as conn, conn.transaction():
            thread = conn.execute(
                LOCK_THREAD_SQL, {"thread_id": thread_id, "owner": owner}
            ).fetchone()
            if thread is None:
                raise RunNotFound(f"run {run_id} not found")
            row = conn.execute(
                GET_RUN_SQL + " FOR NO KEY UPDATE OF r",
                {"thread_id": thread_id, "run_id": run_id, "owner": owner},
            ).fetchone()
            if row is None:
                raise RunNotFound(f"run {run_id} not found")
            run = Run.from_row(row)
            if run.terminal:
                return CancelOutcome.ALREADY_DONE, None
            head = self._inflight(conn, thread_id, limit=1)
            victim = Inflight(run.run_id, run.status, run.attempt)
            outcome, _running = self._cancel_victim(conn, victim, thread_id, action, by="cancel")
            # Only the head's successor needs a dispatch; behind others nothing changes.
            nxt = None
            if outcome is CancelOutcome.CANCELLED and head and head[0].run_id == run.run_id:
                nxt = self._settle_thread(conn, thread_id, ThreadStatus.IDLE)
            return outcome, nxt

    def inflight_runs(
        self,
        owner: str,
        statuses: Collection[RunStatus],
        *,
        thread_id: str | None = None,
        run_ids: Sequence[str] | None = None,
    ) -> list[Run]:
        """The owner's runs in `statuses` (optionally on one thread, among `run_ids`), newest first."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                INFLIGHT_OF_OWNER_SQL,
                {
                    "owner": owner,
                    "statuses": [str(s) for s in statuses],
                    "thread_id": thread_id,
                    "run_ids": list(run_ids) if run_ids is not None else None,
                },
            ).fetchall()
        return [Run.from_row(r) for r in rows]

    # temporary threads -------------------------------------------------------------------
    def delete_temporary_thread(
        self,
        thread_id: str,
        purge: Callable[[psycopg.Connection[DictRow], str], None],
        *,
        lock_timeout_s: float | None = None,
    ) -> bool:
        """Delete a temporary thread whose runs have all ended (`on_completion=delete`).

        `purge(conn, owner)` runs in this transaction, under the thread row lock, before the
        row goes: it removes what lives beside the row (checkpoints, on this connection; the
        owner's workspace files). A failure anywhere rolls back and leaves the row, which is what the recovery
        pass looks for, so the thread is never left behind for good. Returns whether the
        thread was deleted (False: gone already, not temporary, or a run is inflight).
        """
        params = {"thread_id": thread_id}
        with self._pool.connection() as conn, conn.transaction():
            _lock_timeout(conn, lock_timeout_s)
            locked = conn.execute(LOCK_THREAD_BY_ID_SQL, params).fetchone()
            if locked is None:
                return False
            row = conn.execute(TEMPORARY_THREAD_FINISHED_SQL, params).fetchone()
            if row is None or not row["finished"]:
                return False
            purge(conn, str(locked["owner"]))
            conn.execute(DELETE_THREAD_BY_ID_SQL, params)
        return True

    def finished_temporary_threads(self, grace_s: float, limit: int = 100) -> list[str]:
        """Temporary threads whose runs all ended more than `grace_s` ago (the recovery
        pass deletes them: their worker died or failed to)."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                FINISHED_TEMPORARY_THREADS_SQL, {"grace_s": grace_s, "limit": limit}
            ).fetchall()
        return [str(r["thread_id"]) for r in rows]

    # worker side ---------------------------------------------------------------------------
    def claim(self, run_id: str, owner: str) -> Claim:
        """Make the run ours: status running, epoch + 1, attempt + 1 (L1, L3)."""
        params = {
            "run_id": run_id,
            "owner": owner,
            "category": Category.LIFECYCLE.value,
            "type": "claimed",
        }
        try:
            with self._pool.connection() as conn:
                row = conn.execute(CLAIM_LOGGED_SQL, params).fetchone()
        except psycopg.errors.UniqueViolation:
            # Another run of this thread became running concurrently (the partial unique
            # index, R3): that run goes first and dispatches us when it finishes.
            return Claim(ClaimOutcome.NOT_HEAD)
        if row is not None:
            return Claim(ClaimOutcome.CLAIMED, Run.from_row(row))
        if self.run_status(run_id) is RunStatus.PENDING:
            return Claim(ClaimOutcome.NOT_HEAD)
        return Claim(ClaimOutcome.NOT_PENDING)

    def set_pre_run_checkpoint(
        self,
        run_id: str,
        epoch: int,
        checkpoint_id: str,
        writes: list[Any] | None = None,
    ) -> None:
        """Record the rollback point of the run (R5): the head checkpoint's id ('' for a
        thread with none) and a copy of its pending writes."""
        with self._pool.connection() as conn:
            conn.execute(
                SET_PRE_RUN_CHECKPOINT_SQL,
                {
                    "run_id": run_id,
                    "epoch": epoch,
                    "checkpoint_id": checkpoint_id,
                    "writes": _json(writes or None),
                },
            )

    def finish(
        self,
        run_id: str,
        thread_id: str,
        epoch: int,
        *,
        status: RunStatus,
        error: JSONObject | None,
        thread_status: ThreadStatus,
        usage: JSONObject | None = None,
        also: Callable[[psycopg.Connection[DictRow]], None] | None = None,
    ) -> Finish:
        """Write the terminal status only while we own the run (L2), then settle the thread.

        `also` queues writes in the same transaction once the fenced write succeeded (the run
        row is ours and locked until commit), for writes that must be fenced like the status:
        the thread's head copy (`shared.state.head_copies`). They run under a savepoint: if
        they fail, they are rolled back alone and logged, and the run still ends (its
        terminal status never depends on them). `also` must not open a transaction itself
        (the connection is in a `pipelined_transaction`)."""
        # Two round trips (three with `also`, whose savepoint is sent on its own): BEGIN, the
        # lock and the fenced write, whose row decides the rest; then the lifecycle event,
        # the settle and COMMIT (docs/performance.md).
        with self._pool.connection() as conn:
            with pipelined_transaction(conn) as pipeline:
                conn.execute(LOCK_THREAD_BY_ID_SQL, {"thread_id": thread_id})
                row = conn.execute(
                    FINISH_SQL,
                    {
                        "run_id": run_id,
                        "epoch": epoch,
                        "status": status,
                        "error": _json(error),
                        "usage": _json(usage),
                    },
                ).fetchone()
                if row is None:
                    self._lifecycle(
                        conn, run_id, thread_id, "fenced", {"epoch": epoch, "status": status}
                    )
                    return Finish(fenced=True)
                if also is not None:  # first: a failure met at its sync is then its own
                    _isolated(conn, pipeline, also)
                self._lifecycle(conn, run_id, thread_id, status, {"epoch": epoch, "error": error})
                settled = _queue_settle(conn, thread_id, thread_status)
            return Finish(fenced=False, next_run_id=_next_run_id(settled.fetchone()))

    def _settle_thread(
        self, conn: psycopg.Connection[DictRow], thread_id: str, idle_status: ThreadStatus
    ) -> str | None:
        """Pick the next pending run (marking it dispatched) or set the thread's idle status
        (`SETTLE_THREAD_SQL`); the run to dispatch, if any."""
        return _next_run_id(_queue_settle(conn, thread_id, idle_status).fetchone())

    def _lifecycle(
        self,
        conn: psycopg.Connection[DictRow],
        run_id: str,
        thread_id: str,
        kind: str,
        payload: dict[str, Any],
    ) -> None:
        """Append a `lifecycle` audit event in the caller's transaction (same seq counter as
        the journal, so concurrent appenders never collide). Its seq is not read back, so in
        pipeline mode it travels with the transaction's other statements."""
        queue_in(conn, run_id, Category.LIFECYCLE, kind, payload)

    def run_events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's audit events in order."""
        with self._pool.connection() as conn:
            return conn.execute(LIST_RUN_EVENTS_SQL, {"run_id": run_id}).fetchall()

    # reaper -------------------------------------------------------------------------------
    def stale_pending_heads(self, stale_s: float) -> list[str]:
        """Pending runs at the head of their thread whose dispatch looks lost (R4)."""
        with self._pool.connection() as conn:
            return [
                r["run_id"] for r in conn.execute(STALE_PENDING_HEADS_SQL, {"stale_s": stale_s})
            ]

    def running_runs(self, min_age_s: float) -> list[RunningRun]:
        """Running runs not updated for `min_age_s` (lease candidates for the reaper)."""
        with self._pool.connection() as conn:
            rows = conn.execute(RUNNING_RUNS_SQL, {"min_age_s": min_age_s}).fetchall()
        return [
            RunningRun(
                run_id=r["run_id"],
                thread_id=r["thread_id"],
                owner_epoch=int(r["owner_epoch"]),
                attempt=int(r["attempt"]),
                cancel_action=CancelAction(r["cancel_action"]) if r["cancel_action"] else None,
            )
            for r in rows
        ]

    def requeue(
        self, run_id: str, epoch: int, reason: str, *, lock_timeout_s: float | None = None
    ) -> bool:
        """Give a running run back as pending for another attempt (R7 hand-back); fenced.

        `lock_timeout_s`: give up (psycopg.errors.LockNotAvailable) rather than wait longer
        for a run row another transaction holds (the reaper: a frozen owner's write)."""
        with self._pool.connection() as conn, conn.transaction():
            _lock_timeout(conn, lock_timeout_s)
            row = conn.execute(REQUEUE_EXPIRED_SQL, {"run_id": run_id, "epoch": epoch}).fetchone()
            if row is None:
                return False
            self._lifecycle(
                conn, run_id, str(row["thread_id"]), "requeued", {"reason": reason, "epoch": epoch}
            )
            return True

    def close(self) -> None:
        """Close the pool."""
        self._pool.close()

    def fail_expired(
        self,
        run_id: str,
        epoch: int,
        owner: str,
        reason: str,
        *,
        lock_timeout_s: float | None = None,
    ) -> Expired | None:
        """End a run whose owners kept dying as `error` (L5), taking ownership (epoch + 1) so
        the caller may publish the run's `error` and `end` under a lease of its own."""
        error: JSONObject = {"error": "MaxAttemptsExceeded", "message": reason}
        with self._pool.connection() as conn, conn.transaction():
            _lock_timeout(conn, lock_timeout_s)
            row = conn.execute(
                FAIL_EXPIRED_SQL,
                {"run_id": run_id, "epoch": epoch, "owner": owner, "error": _json(error)},
            ).fetchone()
            if row is None:
                return None
            thread_id = str(row["thread_id"])
            self._lifecycle(
                conn, run_id, thread_id, RunStatus.ERROR, {"reason": reason, "epoch": epoch}
            )
            nxt = self._settle_thread(conn, thread_id, ThreadStatus.ERROR)
        return Expired(int(row["owner_epoch"]), error, nxt, row["user_id"])
