"""Threads in Postgres: create (with the client's public ids, A4), resolve, copy, read,
patch, delete, search and count.

A thread row is also the lock that orders everything on the thread (admission, cancel,
finish: shared/runs/admission_store.py, claims.py); this module only takes it to delete
the thread. Every query is `owner`-scoped: another user's thread is neither met nor
revealed, it is missing (ThreadNotFound).
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass

import psycopg
from psycopg.rows import DictRow

from shared.errors import ThreadExists, ThreadNotFound
from shared.runs import thread_ids
from shared.runs.model import Thread, ThreadTTL
from shared.runs.queries import query
from shared.runs.store_base import StoreBase, is_uuid, json_param, lock_timeout
from shared.runs.thread_queue import inflight_in
from shared.vocab import JSONObject, PruneStrategy, RunStatus, ThreadStatus

INSERT_THREAD_SQL = query("insert_thread")
RESOLVE_THREAD_SQL = query("resolve_thread")
PUBLIC_IDS_SQL = query("public_ids")
GET_THREAD_BY_PUBLIC_SQL = query("get_thread_by_public")
INSERT_THREAD_COPY_SQL = query("insert_thread_copy")
GET_THREAD_SQL = query("get_thread")
LOCK_THREAD_SQL = query("lock_thread")
PATCH_THREAD_SQL = query("patch_thread")
LOCK_THREAD_CRONS_SQL = query("lock_thread_crons")
DELETE_THREAD_SQL = query("delete_thread")
COUNT_THREADS_SQL = query("count_threads")
EXPIRED_THREADS_SQL = query("expired_threads")
LOCK_THREAD_CRONS_BY_ID_SQL = query("lock_thread_crons_by_id")
LOCK_EXPIRED_THREAD_SQL = query("lock_expired_thread")
THREAD_HAS_WORK_SQL = query("thread_has_work")
THREAD_RUN_IDS_SQL = query("thread_run_ids")
DELETE_THREAD_WEBHOOKS_SQL = query("delete_thread_webhooks")
DELETE_THREAD_BY_ID_SQL = query("delete_thread_by_id")
CLEAR_EXPIRY_SQL = query("clear_expiry")


@dataclass(frozen=True, slots=True)
class Doomed:
    """A thread being deleted, as its purge sees it inside the delete's transaction."""

    thread_id: str
    owner: str
    run_ids: list[str]  # every run of the thread, oldest first
    running: list[str]  # those still executing (a user's delete tells them to stop)


Purge = Callable[[psycopg.Connection[DictRow], Doomed], None]
"""What goes with a thread beside its rows (checkpoints, Redis keys, files, the audit
record: shared/retention/removal.py), run in the delete's transaction before the row goes."""


class ExpiryOutcome(enum.StrEnum):
    """What the sweep did to one expired thread (shared/retention/sweeper.py)."""

    DELETED = "deleted"
    PRUNED = "pruned"  # keep_latest: only the newest checkpoint is left
    BUSY = "busy"  # an inflight run or a pending webhook: the next sweep after it
    SKIPPED = "skipped"  # locked by another transaction, or no longer expired


# Composed at run time (its ORDER BY is the caller's sort, from THREAD_SORT_COLUMNS only),
# so it stays here beside `search_threads` rather than in queries.sql.
SEARCH_THREADS_SQL = """
WITH scanned AS (
    SELECT thread_id FROM threads WHERE owner = %(owner)s
    ORDER BY created_at DESC LIMIT %(scan_max)s
)
SELECT * FROM threads
WHERE owner = %(owner)s
  AND metadata @> %(metadata)s
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(ids)s::uuid[] IS NULL OR public_id = ANY(%(ids)s))
  AND (%(text_like)s::text IS NULL
       OR metadata->>'title' ILIKE %(text_like)s
       OR (thread_id IN (SELECT thread_id FROM scanned) AND EXISTS (
           SELECT 1 FROM thread_heads h,
               json_array_elements(CASE WHEN json_typeof(h.values_json->'messages') = 'array'
                                   THEN h.values_json->'messages' ELSE '[]'::json END) m
           WHERE h.thread_id = threads.thread_id
             AND (CASE WHEN json_typeof(m->'content') = 'string' THEN m->>'content'
                       ELSE (SELECT string_agg(b->>'text', ' ')
                             FROM json_array_elements(
                                 CASE WHEN json_typeof(m->'content') = 'array'
                                 THEN m->'content' ELSE '[]'::json END) b
                             WHERE json_typeof(b) = 'object') END) ILIKE %(text_like)s)))
ORDER BY {order}
LIMIT %(limit)s OFFSET %(offset)s
"""
"""`text_like` (the text query) matches a thread's `metadata.title` or the text of a message
in its head copy (`thread_heads.values_json`, shared/state/head_copies.py: the values as thread
objects show them, no checkpoint decoded, no graph needed).

Bounded: the title is matched over the owner's threads (`threads_owner_created`, a user's
rows, not the table); message text only over the owner's newest `scan_max` threads
(THREADRUN_THREAD_SEARCH_SCAN_THREADS, the `scanned` CTE, itself an index range), each a
primary-key probe into `thread_heads` and at most THREADRUN_THREAD_VALUES_MAX_BYTES of JSON
(a larger head has no copied values and is not searched by content). The statement stops at
`limit` matches. A trigram index on the title would be the next step if one user kept very many.

`activity` orders by a thread's newest run (`runs_thread_created`, one backward index probe
per thread), else its creation: what a person did in it, unlike `updated_at`, which a
metadata PATCH (a rename) also moves."""
THREAD_SORT_COLUMNS = {"thread_id", "status", "created_at", "updated_at", "activity"}
ACTIVITY_SQL = (
    "coalesce((SELECT max(r.created_at) FROM runs r WHERE r.thread_id = threads.thread_id),"
    " threads.created_at)"
)
"""A thread's last activity: its newest run's creation, else its own (sort_by `activity`)."""


def _like_literal(text: str) -> str:
    """`text` for a LIKE pattern, matching itself: the escape (backslash) and wildcards escaped."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def get_thread_in(conn: psycopg.Connection[DictRow], thread_id: str, owner: str) -> Thread:
    """The thread, or ThreadNotFound (also for another user's thread), on `conn`."""
    row = conn.execute(GET_THREAD_SQL, {"thread_id": thread_id, "owner": owner}).fetchone()
    if row is None:
        raise ThreadNotFound(f"thread {thread_id} not found")
    return Thread.from_row(row)


class ThreadStore(StoreBase):
    """Threads of their owners."""

    def create_thread(
        self,
        thread_id: str | None,
        owner: str,
        metadata: JSONObject,
        if_exists: str,
        ttl: ThreadTTL | None = None,
    ) -> Thread:
        """Create a thread; `if_exists` is 'raise' or 'do_nothing' (return the existing one).

        `thread_id` is the client's choice (its public id), stored under the owner's own
        storage id (A4, shared/runs/thread_ids.py): only the owner's threads can conflict,
        another user's thread with that id is neither met nor revealed."""
        public = thread_id or str(uuid.uuid4())
        tid = thread_ids.storage_id(owner, public) if thread_id else public
        params = {"thread_id": tid, "public_id": public, "owner": owner}
        with self._pool.connection() as conn:
            self.check_thread_quota(conn, owner, tid, public)
            row = conn.execute(
                INSERT_THREAD_SQL,
                {**params, "metadata": json_param(metadata), **self.ttl_params(ttl)},
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
        ids = [i for i in storage_ids if is_uuid(i)]
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
            self.check_thread_quota(conn, source.owner, thread_id)
            row = conn.execute(
                INSERT_THREAD_COPY_SQL,
                {
                    "thread_id": thread_id,
                    "owner": source.owner,
                    "metadata": json_param(source.metadata),
                    "status": status,
                    **(source.ttl.params() if source.ttl else ThreadTTL.no_params()),
                },
            ).fetchone()
        assert row is not None  # INSERT … RETURNING
        return Thread.from_row(row)

    def get_thread(self, thread_id: str, owner: str) -> Thread:
        """The thread, or ThreadNotFound (also for another user's thread)."""
        with self._pool.connection() as conn:
            return get_thread_in(conn, thread_id, owner)

    def patch_thread(
        self, thread_id: str, owner: str, metadata: JSONObject, ttl: ThreadTTL | None = None
    ) -> Thread:
        """Merge metadata into the thread's; with `ttl`, replace its TTL. Either way its
        expiry starts again from now (P6)."""
        with self._pool.connection() as conn:
            row = conn.execute(
                PATCH_THREAD_SQL,
                {
                    "thread_id": thread_id,
                    "owner": owner,
                    "metadata": json_param(metadata),
                    "set_ttl": ttl is not None,
                    **(ttl.params() if ttl else ThreadTTL.no_params()),
                },
            ).fetchone()
        if row is None:
            raise ThreadNotFound(f"thread {thread_id} not found")
        return Thread.from_row(row)

    def delete_thread(self, thread_id: str, owner: str, purge: Purge | None = None) -> list[str]:
        """Delete the thread and its runs; return the ids of runs that were still running.

        Lock order, the same as a cron firing's: the thread's crons, then the thread (the
        delete cascades to both). `purge` runs under those locks before the row goes: a
        failure in it leaves everything."""
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(LOCK_THREAD_CRONS_SQL, {"thread_id": thread_id, "owner": owner})
            thread = conn.execute(
                LOCK_THREAD_SQL, {"thread_id": thread_id, "owner": owner}
            ).fetchone()
            if thread is None:
                raise ThreadNotFound(f"thread {thread_id} not found")
            running = [
                v.run_id
                for v in inflight_in(conn, thread_id, limit=None)
                if v.status is RunStatus.RUNNING
            ]
            if purge is not None:
                purge(conn, Doomed(thread_id, owner, self._run_ids(conn, thread_id), running))
            conn.execute(DELETE_THREAD_SQL, {"thread_id": thread_id, "owner": owner})
        return running

    @staticmethod
    def _run_ids(conn: psycopg.Connection[DictRow], thread_id: str) -> list[str]:
        rows = conn.execute(THREAD_RUN_IDS_SQL, {"thread_id": thread_id}).fetchall()
        return [str(r["run_id"]) for r in rows]

    def expired_threads(
        self, limit: int, at: dt.datetime | None = None
    ) -> list[tuple[str, PruneStrategy]]:
        """Threads past their expiry at `at` (default: now), soonest expired first: (id,
        strategy). A read, no lock: `expire_thread` takes each one."""
        with self._pool.connection() as conn:
            rows = conn.execute(EXPIRED_THREADS_SQL, {"at": at, "limit": limit}).fetchall()
        return [(str(r["thread_id"]), PruneStrategy(r["ttl_strategy"] or "delete")) for r in rows]

    def expire_thread(
        self,
        thread_id: str,
        purge: Purge,
        prune: Callable[[str], None],
        *,
        at: dt.datetime | None = None,
        lock_timeout_s: float | None = None,
    ) -> ExpiryOutcome:
        """Apply an expired thread's strategy in one short transaction (P6).

        The thread's crons, then its row (SKIP LOCKED: a held thread waits for the next
        sweep); a thread with an inflight run or a pending webhook delivery is left (BUSY).
        `delete`: `purge` then the delete, all or nothing, so a sweeper killed at any point
        leaves the whole thread, which the next sweep finds again. `keep_latest`:
        `prune(thread_id)` (its own transactions, on another connection, while this one holds
        the thread row so that no run starts meanwhile), then the expiry is cleared.
        """
        params = {"thread_id": thread_id, "at": at}
        with self._pool.connection() as conn, conn.transaction():
            lock_timeout(conn, lock_timeout_s)
            conn.execute(LOCK_THREAD_CRONS_BY_ID_SQL, params)
            row = conn.execute(LOCK_EXPIRED_THREAD_SQL, params).fetchone()
            if row is None:
                return ExpiryOutcome.SKIPPED
            busy = conn.execute(THREAD_HAS_WORK_SQL, params).fetchone()
            if busy is not None and busy["busy"]:
                return ExpiryOutcome.BUSY
            if PruneStrategy(row["ttl_strategy"] or "delete") is PruneStrategy.KEEP_LATEST:
                prune(thread_id)
                conn.execute(CLEAR_EXPIRY_SQL, params)
                return ExpiryOutcome.PRUNED
            purge(conn, Doomed(thread_id, str(row["owner"]), self._run_ids(conn, thread_id), []))
            conn.execute(DELETE_THREAD_WEBHOOKS_SQL, params)
            conn.execute(DELETE_THREAD_BY_ID_SQL, params)
        return ExpiryOutcome.DELETED

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
        scan_max: int = 1000,
    ) -> list[Thread]:
        """Threads of `owner` matching a metadata containment filter and, with `query`, whose
        `metadata.title` or, among the newest `scan_max`, a message's text contains that
        text case-insensitively (taken literally); `sort_by="activity"`: newest run first."""
        if sort_by not in THREAD_SORT_COLUMNS:
            raise ValueError(f"sort_by {sort_by!r}")
        column = {"thread_id": "public_id", "activity": ACTIVITY_SQL}.get(sort_by, sort_by)
        order = f"{column} {'ASC' if sort_order == 'asc' else 'DESC'}, thread_id"
        sql = SEARCH_THREADS_SQL.format(order=order)
        with self._pool.connection() as conn:
            rows = conn.execute(
                sql,
                {
                    "owner": owner,
                    "metadata": json_param(metadata),
                    "status": status,
                    "ids": ids,
                    "text_like": None if query is None else f"%{_like_literal(query)}%",
                    "scan_max": scan_max,
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
                COUNT_THREADS_SQL,
                {"owner": owner, "metadata": json_param(metadata), "status": status},
            ).fetchone()
        return int(row["n"]) if row else 0
