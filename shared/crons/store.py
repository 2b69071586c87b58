"""SQL for crons and their firings. Only this module speaks SQL about them (STYLE 4).

The firing transaction (`fire_due`) is the exactly-once guarantee of crons:

1. lock a batch of due crons, `FOR UPDATE SKIP LOCKED` (two schedulers take different
   batches instead of waiting on each other);
2. per cron, insert the firing row `(cron_id, tick_at)` — its primary key is what makes a
   tick fire at most once, whatever the locks did: a second firing of the same tick (a
   scheduler that read a stale row, one that lost its lock) conflicts and admits nothing;
3. admit the run on the same connection (`RunStore.admit_in`, in a savepoint, so a run that
   cannot be admitted leaves the firing recorded as failed instead of undoing the batch; a
   cron that no tick could fire any more — its owner has no credential left, its assistant
   is gone — is disabled with it, recorded `disabled`, instead of failing at every tick);
4. advance `next_run_at` past now (missed ticks collapse);
5. commit — all of it or none of it.

A scheduler killed anywhere before 5 leaves nothing: PostgreSQL rolls the transaction back
when its connection drops, the cron is still due and unlocked, and the next tick of any
scheduler fires it once. After 5 the run exists and is pending; if the kill came before its
dispatch, the reaper dispatches it (`dispatched_at` ages like any lost dispatch, R4).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from shared import serde
from shared.crons.model import (
    CRON_SORT_COLUMNS,
    Cron,
    CronCannotFire,
    CronNotFound,
    CronSpec,
    FiringOutcome,
    TooManyCrons,
    request_to_json,
)
from shared.db import DictPool
from shared.errors import AssistantNotFound, LimitExceeded, ThreadNotFound, ThreadrunError
from shared.runs.store import Admission
from shared.vocab import JSONObject


def _json(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value, dumps=serde.dumps_str)


THREAD_PUBLIC_ID = (
    "(SELECT t.public_id FROM threads t WHERE t.thread_id = crons.thread_id) AS thread_public_id"
)
"""A cron shows its thread by the id the owner knows it by (A4, shared/runs/thread_ids.py)."""
LOCK_USER_CRONS_SQL = "SELECT pg_advisory_xact_lock(hashtext('threadrun.crons:' || %(owner)s))"
"""Serialises the creates of one user, so `cron_max_per_user` holds under concurrency."""
COUNT_USER_CRONS_SQL = "SELECT count(*) AS n FROM crons WHERE user_id = %(owner)s"
INSERT_CRON_SQL = (
    """
INSERT INTO crons (cron_id, user_id, assistant_id, thread_id, schedule, timezone, payload,
                   request, metadata, enabled, end_time, on_run_completed, next_run_at)
SELECT %(cron_id)s, %(owner)s, %(assistant_id)s, %(thread_id)s, %(schedule)s, %(timezone)s,
       %(payload)s, %(request)s, %(metadata)s, %(enabled)s, %(end_time)s,
       %(on_run_completed)s, %(next_run_at)s
WHERE %(thread_id)s::uuid IS NULL
   OR EXISTS (SELECT 1 FROM threads WHERE thread_id = %(thread_id)s AND owner = %(owner)s)
RETURNING *, """
    + THREAD_PUBLIC_ID
)
"""The thread's owner is checked in the insert itself: a thread deleted (or another user's)
between the route's check and here is a 404, never a foreign-key 500."""
SHARE_THREAD_SQL = """
SELECT 1 FROM threads WHERE thread_id = %(thread_id)s AND owner = %(owner)s FOR KEY SHARE
"""
"""The cron's thread, held until the insert commits: a delete of the thread running meanwhile
either finished first (no row: a 404) or waits for the cron and cascades to it. Without it the
insert saw the thread, the delete committed, and the foreign key refused the cron (a 500)."""
GET_CRON_SQL = (
    f"SELECT *, {THREAD_PUBLIC_ID} FROM crons WHERE cron_id = %(cron_id)s AND user_id = %(owner)s"
)
DELETE_CRON_SQL = (
    "DELETE FROM crons WHERE cron_id = %(cron_id)s AND user_id = %(owner)s RETURNING cron_id"
)
UPDATE_CRON_SQL = (
    """
UPDATE crons SET {sets}, updated_at = now()
WHERE cron_id = %(cron_id)s AND user_id = %(owner)s
RETURNING *, """
    + THREAD_PUBLIC_ID
)
UPDATABLE_COLUMNS = (
    "schedule",
    "timezone",
    "end_time",
    "enabled",
    "on_run_completed",
    "payload",
    "request",
    "metadata",
    "next_run_at",
)
FILTER_SQL = """
WHERE user_id = %(owner)s
  AND (%(assistant_id)s::text IS NULL OR assistant_id = %(assistant_id)s)
  AND (%(thread_id)s::uuid IS NULL OR thread_id = %(thread_id)s::uuid)
  AND (%(enabled)s::boolean IS NULL OR enabled = %(enabled)s)
  AND metadata @> %(metadata)s
"""
SEARCH_CRONS_SQL = (
    f"SELECT *, {THREAD_PUBLIC_ID} FROM crons"
    + FILTER_SQL
    + "ORDER BY {order} LIMIT %(limit)s OFFSET %(offset)s"
)
COUNT_CRONS_SQL = "SELECT count(*) AS n FROM crons" + FILTER_SQL

# --- ops: any user's crons -------------------------------------------------------------------
OPS_LIST_CRONS_SQL = """
SELECT c.cron_id, c.user_id, c.assistant_id, c.thread_id, c.schedule, c.timezone, c.enabled,
       c.next_run_at, c.end_time, c.created_at,
       f.tick_at AS last_tick_at, f.outcome AS last_outcome, f.error AS last_error
FROM crons c
LEFT JOIN LATERAL (
    SELECT tick_at, outcome, error FROM cron_firings
    WHERE cron_id = c.cron_id ORDER BY tick_at DESC LIMIT 1
) f ON true
WHERE (%(user_id)s::text IS NULL OR c.user_id = %(user_id)s)
  AND (%(enabled)s::boolean IS NULL OR c.enabled = %(enabled)s)
ORDER BY c.created_at DESC, c.cron_id
LIMIT %(limit)s
"""
OPS_DELETE_CRON_SQL = (
    "DELETE FROM crons WHERE cron_id = %(cron_id)s"
    " RETURNING cron_id, user_id, assistant_id, thread_id, schedule, enabled"
)

# --- firing ------------------------------------------------------------------------------------
LOCK_DUE_SQL = """
SELECT c.*, now() AS db_now FROM crons c
WHERE c.enabled AND c.next_run_at <= now()
  AND (c.end_time IS NULL OR c.next_run_at <= c.end_time)
ORDER BY c.next_run_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""
INSERT_FIRING_SQL = """
INSERT INTO cron_firings (cron_id, tick_at, outcome) VALUES (%(cron_id)s, %(tick_at)s, 'claimed')
ON CONFLICT (cron_id, tick_at) DO NOTHING
RETURNING cron_id
"""
RECORD_FIRING_SQL = """
UPDATE cron_firings SET outcome = %(outcome)s, run_id = %(run_id)s, thread_id = %(thread_id)s,
       error = %(error)s, fired_at = clock_timestamp()
WHERE cron_id = %(cron_id)s AND tick_at = %(tick_at)s
"""
DISABLE_CRON_SQL = "UPDATE crons SET enabled = false WHERE cron_id = %(cron_id)s"
ADVANCE_CRON_SQL = """
UPDATE crons SET next_run_at = %(next_run_at)s
WHERE cron_id = %(cron_id)s AND next_run_at <= %(tick_at)s
"""
"""Only forward: a PATCH that rescheduled meanwhile (or a firing that already advanced the
cron) keeps its later `next_run_at`."""
PRUNE_FIRINGS_SQL = """
DELETE FROM cron_firings WHERE ctid IN (
    SELECT ctid FROM cron_firings
    WHERE fired_at < now() - make_interval(secs => %(keep_s)s) LIMIT %(limit)s)
"""
"""Safe at any age: a fired tick is behind its cron's `next_run_at` for good, so its row is
never needed again to refuse a second firing."""
FIRINGS_OF_SQL = """
SELECT * FROM cron_firings WHERE cron_id = %(cron_id)s ORDER BY tick_at
"""

Admit = Callable[[psycopg.Connection[DictRow], Cron], Admission]
"""Admits one firing's run on the firing transaction's connection (the manager's)."""
Advance = Callable[[Cron, dt.datetime], dt.datetime | None]
"""The cron's next tick once its due tick fired, given the database's now."""


@dataclass(frozen=True, slots=True)
class Fired:
    """One due tick handled by `fire_due`: what came of it, and the admission to finish after
    commit (None unless a run was created)."""

    cron: Cron
    tick_at: dt.datetime
    outcome: FiringOutcome | None  # None: the tick had fired already (the firing row exists)
    next_run_at: dt.datetime | None
    admission: Admission | None = None
    error: str | None = None


class CronStore:
    """Crons and their firings in Postgres."""

    def __init__(self, pool: DictPool) -> None:
        self._pool = pool

    def create(
        self, spec: CronSpec, owner: str, *, next_run_at: dt.datetime | None, max_per_user: int
    ) -> Cron:
        """Insert the cron; TooManyCrons at the user's limit, ThreadNotFound for a thread
        that is not the owner's."""
        params = {
            "cron_id": str(uuid.uuid4()),
            "owner": owner,
            "assistant_id": spec.assistant_id,
            "thread_id": spec.thread_id,
            "schedule": spec.schedule,
            "timezone": spec.timezone,
            "payload": _json(spec.payload),
            "request": _json(request_to_json(spec.request)),
            "metadata": _json(spec.metadata),
            "enabled": spec.enabled,
            "end_time": spec.end_time,
            "on_run_completed": spec.on_run_completed,
            "next_run_at": next_run_at,
        }
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(LOCK_USER_CRONS_SQL, {"owner": owner})
            row = conn.execute(COUNT_USER_CRONS_SQL, {"owner": owner}).fetchone()
            if row is not None and int(row["n"]) >= max_per_user:
                raise TooManyCrons(f"at most {max_per_user} crons per user")
            if spec.thread_id is not None:
                thread = {"thread_id": spec.thread_id, "owner": owner}
                if conn.execute(SHARE_THREAD_SQL, thread).fetchone() is None:
                    raise ThreadNotFound(f"thread {spec.thread_id} not found")
            created = conn.execute(INSERT_CRON_SQL, params).fetchone()
        if created is None:
            raise ThreadNotFound(f"thread {spec.thread_id} not found")
        return Cron.from_row(created)

    def get(self, cron_id: str, owner: str) -> Cron:
        """The cron, or CronNotFound (also for another user's)."""
        with self._pool.connection() as conn:
            row = conn.execute(GET_CRON_SQL, {"cron_id": cron_id, "owner": owner}).fetchone()
        if row is None:
            raise CronNotFound(f"cron {cron_id} not found")
        return Cron.from_row(row)

    def update(self, cron_id: str, owner: str, values: JSONObject) -> Cron:
        """Set the given columns (names from UPDATABLE_COLUMNS); CronNotFound otherwise."""
        unknown = set(values) - set(UPDATABLE_COLUMNS)
        if unknown:
            raise ValueError(f"not updatable: {sorted(unknown)}")
        params: dict[str, Any] = {"cron_id": cron_id, "owner": owner}
        for name, value in values.items():
            params[name] = _json(value) if name in ("payload", "metadata") else value
        if "request" in values:
            params["request"] = _json(values["request"])
        sets = ", ".join(f"{name} = %({name})s" for name in values) or "cron_id = cron_id"
        with self._pool.connection() as conn:
            row = conn.execute(UPDATE_CRON_SQL.format(sets=sets), params).fetchone()
        if row is None:
            raise CronNotFound(f"cron {cron_id} not found")
        return Cron.from_row(row)

    def delete(self, cron_id: str, owner: str) -> None:
        """Delete the cron; CronNotFound (also for another user's). A firing in progress
        holds the row lock, so the delete waits for it and no tick fires after."""
        with self._pool.connection() as conn:
            row = conn.execute(DELETE_CRON_SQL, {"cron_id": cron_id, "owner": owner}).fetchone()
        if row is None:
            raise CronNotFound(f"cron {cron_id} not found")

    def list_any(
        self, *, user_id: str | None, enabled: bool | None, limit: int
    ) -> list[dict[str, Any]]:
        """Any user's crons, newest first, each with its last firing (the ops view)."""
        params = {"user_id": user_id, "enabled": enabled, "limit": limit}
        with self._pool.connection() as conn:
            return list(conn.execute(OPS_LIST_CRONS_SQL, params).fetchall())

    def delete_any(self, cron_id: str) -> dict[str, Any] | None:
        """Delete any user's cron (the ops view); the row it was, or None. Like `delete`,
        it waits for a firing in progress."""
        with self._pool.connection() as conn:
            return conn.execute(OPS_DELETE_CRON_SQL, {"cron_id": cron_id}).fetchone()

    def search(
        self,
        owner: str,
        *,
        assistant_id: str | None,
        thread_id: str | None,
        enabled: bool | None,
        metadata: JSONObject,
        limit: int,
        offset: int,
        sort_by: str,
        sort_order: str,
    ) -> list[Cron]:
        """The owner's crons matching the filters."""
        column = CRON_SORT_COLUMNS[sort_by]
        order = f"{column} {'ASC' if sort_order == 'asc' else 'DESC'} NULLS LAST, cron_id"
        params = self._filters(owner, assistant_id, thread_id, enabled, metadata)
        with self._pool.connection() as conn:
            rows = conn.execute(
                SEARCH_CRONS_SQL.format(order=order),
                {**params, "limit": limit, "offset": offset},
            ).fetchall()
        return [Cron.from_row(r) for r in rows]

    def count(
        self,
        owner: str,
        *,
        assistant_id: str | None,
        thread_id: str | None,
        enabled: bool | None,
        metadata: JSONObject,
    ) -> int:
        """How many of the owner's crons match."""
        params = self._filters(owner, assistant_id, thread_id, enabled, metadata)
        with self._pool.connection() as conn:
            row = conn.execute(COUNT_CRONS_SQL, params).fetchone()
        return int(row["n"]) if row else 0

    @staticmethod
    def _filters(
        owner: str,
        assistant_id: str | None,
        thread_id: str | None,
        enabled: bool | None,
        metadata: JSONObject,
    ) -> dict[str, Any]:
        return {
            "owner": owner,
            "assistant_id": assistant_id,
            "thread_id": thread_id,
            "enabled": enabled,
            "metadata": _json(metadata),
        }

    # firing ------------------------------------------------------------------------------------
    def fire_due(
        self,
        limit: int,
        admit: Admit,
        advance: Advance,
        *,
        before_commit: Callable[[Sequence[Fired]], None] | None = None,
    ) -> list[Fired]:
        """Fire up to `limit` due crons in one transaction (see the module docstring);
        `before_commit` is a fault-injection point for tests (a scheduler killed mid-tick)."""
        with self._pool.connection() as conn, conn.transaction():
            rows = conn.execute(LOCK_DUE_SQL, {"limit": limit}).fetchall()
            fired = [
                self.fire_locked(conn, Cron.from_row(row), row["db_now"], admit, advance)
                for row in rows
            ]
            if before_commit is not None:
                before_commit(fired)
        return fired

    def fire_locked(
        self,
        conn: psycopg.Connection[DictRow],
        cron: Cron,
        now: dt.datetime,
        admit: Admit,
        advance: Advance,
    ) -> Fired:
        """Fire `cron`'s due tick (`next_run_at` as read) inside the caller's transaction:
        the firing row, the admission, the advance. A tick whose firing row exists admits
        nothing (the database's uniqueness, not the lock, is the guarantee)."""
        tick = cron.next_run_at
        assert tick is not None  # selected as due
        next_run_at = advance(cron, now)
        keys = {"cron_id": cron.cron_id, "tick_at": tick}
        if conn.execute(INSERT_FIRING_SQL, keys).fetchone() is None:
            conn.execute(ADVANCE_CRON_SQL, {**keys, "next_run_at": next_run_at})
            return Fired(cron, tick, None, next_run_at)
        admission: Admission | None = None
        error: str | None = None
        limited = disabled = False
        try:
            with conn.transaction():  # a savepoint: a failed admission undoes only itself
                admission = admit(conn, cron)
        except LimitExceeded as exc:
            error, limited = str(exc), True
        except (CronCannotFire, AssistantNotFound) as exc:
            error, disabled = f"{exc}: the cron is disabled", True
        except ThreadrunError as exc:
            error = str(exc)
        if limited:
            outcome = FiringOutcome.LIMITED
        elif disabled:
            outcome = FiringOutcome.DISABLED
            conn.execute(DISABLE_CRON_SQL, keys)
        elif admission is None:
            outcome = FiringOutcome.FAILED
        elif admission.run is None:
            outcome = FiringOutcome.REJECTED
        else:
            outcome = FiringOutcome.ADMITTED
        run = admission.run if admission is not None else None
        conn.execute(
            RECORD_FIRING_SQL,
            {
                **keys,
                "outcome": outcome,
                "run_id": run.run_id if run else None,
                "thread_id": run.thread_id if run else cron.thread_id,
                "error": error,
            },
        )
        conn.execute(ADVANCE_CRON_SQL, {**keys, "next_run_at": next_run_at})
        return Fired(cron, tick, outcome, next_run_at, admission, error)

    def firings(self, cron_id: str) -> list[dict[str, Any]]:
        """The recorded firings of a cron, oldest tick first (tests and ops)."""
        with self._pool.connection() as conn:
            return list(conn.execute(FIRINGS_OF_SQL, {"cron_id": cron_id}).fetchall())

    def prune_firings(self, keep_s: float, limit: int = 1000) -> int:
        """Delete firing records older than `keep_s`; how many went."""
        with self._pool.connection() as conn:
            return conn.execute(PRUNE_FIRINGS_SQL, {"keep_s": keep_s, "limit": limit}).rowcount
