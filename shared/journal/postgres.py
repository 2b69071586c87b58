"""The Postgres event store (SPEC J4): append-only `run_events`, per-run seq, cursor pages.

Seq allocation. Every writer takes a run's next seqs from its `run_event_seqs` row
with one upsert (`INSERT … ON CONFLICT DO UPDATE … RETURNING last_seq`) in the same
statement as the insert of the events (`APPEND_BATCH_SQL`). Concurrent appenders, in
any number of processes, queue on that one narrow row until their commit, so seqs are
strictly increasing in commit order and never collide. We chose a counter row over
`SELECT … FOR UPDATE` on the `runs` row plus `max(seq) + 1`: the runs row is wide and
hot (claim, finish, cancel and the reaper all update it), and some writers append
without having locked it (RunStore's `fenced` event), so `max + 1` races with them; the
counter is private to event writers. Lock order is the run row (FOR KEY SHARE, which
the FK check takes anyway), then the counter row: RunStore's transactions lock or update
the run row before they append (`append_in`), so the two orders agree and cannot
deadlock. The allocator takes `greatest(counter, max(seq))`, which keeps it correct next
to a writer that still appends with `max(seq) + 1` (an old process during a rolling
deploy); once every writer uses the counter that term is one index probe.
`bench/journal_bench.py`: a batch of 20 runs at ~0.9x the events/s of a raw COPY of 20
(and ~1.2x a raw multi-row INSERT); a single append costs ~0.25 ms more than a bare
INSERT.

Rows. The store takes an event's thread_id from the run row it locks, so it is always
the run's own. Payloads are sent as binary text arrays: psycopg's text-format array
quoting of JSON cost 3x the statement itself on 500-event batches.

All SQL of the store is in the constants below, referenced by name.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import psycopg
from psycopg.rows import DictRow

from shared.db import DictPool
from shared.errors import LeaseLost, RunNotFound, StoreError
from shared.journal.base import Category, EventPage, RunEvent, check_category
from shared.journal.delivery import check_receipt
from shared.journal.pages import (
    DEFAULT_PAGE_SIZE,
    DEFAULT_PAGE_SIZE_MAX,
    MAX_SEQ,
    Direction,
    ThreadCursor,
    format_thread_cursor,
    page_direction,
    page_limit,
)
from shared.journal.payload import DEFAULT_MAX_PAYLOAD_BYTES, encode_payload, payload_json
from shared.journal.usage import (
    USAGE_KEYS,
    Usage,
    UsageSummary,
    add_usage,
    empty_usage,
    usage_summary,
)

# --- SQL ------------------------------------------------------------------------------------------
# The allocator: the next `n` seqs of one run (see the module docstring). It takes the
# run row's FOR KEY SHARE lock first (the lock the FK check would take at the end of the
# statement anyway), so every writer locks the run row before the counter row: RunStore
# locks the run row (UPDATE, FOR UPDATE) before it appends, and the same order on both
# sides means no deadlock. A missing run allocates nothing (RunNotFound).
_ALLOC = """alloc AS (
    INSERT INTO run_event_seqs AS c (run_id, last_seq)
    SELECT run.run_id,
           coalesce((SELECT max(seq) FROM run_events WHERE run_id = %(run_id)s), 0) + %(n)s
    FROM run
    ON CONFLICT (run_id) DO UPDATE
    SET last_seq = greatest(c.last_seq,
                            coalesce((SELECT max(seq) FROM run_events
                                      WHERE run_id = %(run_id)s), 0)) + %(n)s
    RETURNING last_seq
)
"""
_ALLOC_CTE = (
    """
WITH run AS (
    SELECT run_id, thread_id FROM runs WHERE run_id = %(run_id)s FOR KEY SHARE
), """
    + _ALLOC
)
APPEND_BATCH_SQL = (
    _ALLOC_CTE
    + """
INSERT INTO run_events (run_id, seq, thread_id, category, type, payload, created_at)
SELECT run.run_id, alloc.last_seq - %(n)s + u.i, run.thread_id, u.category, u.type,
       u.payload::jsonb, u.created_at
FROM run, alloc,
     unnest(%(categories)b::text[], %(types)b::text[], %(payloads)b::text[],
            %(created_at)b::timestamptz[]) WITH ORDINALITY AS u(category, type, payload, created_at, i)
ORDER BY u.i
RETURNING seq
"""
)
# One event. Params: run_id, category, type, payload (JSON text or Jsonb) and created_at
# (None = now()); a `thread_id` param is accepted and ignored. `append_in` runs it in a
# caller's transaction (RunStore's lifecycle events: same allocator).
_INSERT_ONE = """
INSERT INTO run_events (run_id, seq, thread_id, category, type, payload, created_at)
SELECT run.run_id, alloc.last_seq, run.thread_id, %(category)s, %(type)s,
       %(payload)s::jsonb, coalesce(%(created_at)s::timestamptz, now())
FROM run, alloc
"""
APPEND_EVENT_SQL = _ALLOC_CTE.replace("%(n)s", "1") + _INSERT_ONE + "RETURNING seq, created_at\n"


def with_event(update_sql: str, payload_sql: str) -> str:
    """One statement: `update_sql` (an `UPDATE runs ... RETURNING *` of the run
    `%(run_id)s`) and, when it changed the row, an event in that run's journal whose
    payload is the SQL expression `payload_sql` over the updated row (`changed`); it
    returns what the update returned. Params: those of the update, `category` and `type`.

    In autocommit mode that is one round trip with its commit, where the update and an
    `append_in` take a transaction of their own (two in pipeline mode, four without). The
    update holds the run row's lock, which the allocator takes first everywhere else, so
    the lock order is the same."""
    return (
        f"WITH changed AS ({update_sql}),\n"
        "run AS (SELECT run_id, thread_id FROM changed),\n"
        + _ALLOC.replace("%(n)s", "1")
        + """, event AS (
INSERT INTO run_events (run_id, seq, thread_id, category, type, payload, created_at)
SELECT run.run_id, alloc.last_seq, run.thread_id, %(category)s, %(type)s, """
        + payload_sql
        + """, now()
FROM run, alloc, changed
)
SELECT * FROM changed
"""
    )


APPEND_RECEIPT_SQL = (
    _ALLOC_CTE.replace("%(n)s", "1")
    + _INSERT_ONE
    + """ON CONFLICT (run_id, (payload ->> 'attempt'))
    WHERE category = 'delivery' AND type = 'run.delivery' DO NOTHING
RETURNING seq, created_at
"""
)
# L2: the receipt of an attempt is written only while its epoch owns the running run; the
# share lock holds until commit, so a re-claim (epoch + 1) cannot slip in between.
APPEND_FENCED_RECEIPT_SQL = APPEND_RECEIPT_SQL.replace(
    "SELECT run_id, thread_id FROM runs WHERE run_id = %(run_id)s FOR KEY SHARE",
    "SELECT run_id, thread_id FROM runs,"
    " (SELECT set_config('idle_in_transaction_session_timeout', %(idle)s, true)) AS t"
    " WHERE run_id = %(run_id)s AND owner_epoch = %(epoch)s AND status = 'running'"
    " FOR SHARE OF runs",
    1,
)
RUN_OWNER_SQL = "SELECT owner_epoch, status FROM runs WHERE run_id = %(run_id)s"
_EVENT_COLUMNS = "run_id::text, thread_id::text, seq, category, type, payload, created_at"
LIST_RUN_EVENTS_SQL = f"""
SELECT {_EVENT_COLUMNS} FROM run_events
WHERE run_id = %(run_id)s AND seq > %(after)s AND seq < %(before)s
  AND (%(categories)s::text[] IS NULL OR category = ANY(%(categories)s::text[]))
ORDER BY seq {{order}}
LIMIT %(limit)s
"""
# The thread's runs in admission order (runs_thread_seq), and from each run at most
# `limit` events by its primary key (run_id, seq): a page reads O(limit) rows per run it
# touches, however long the runs are. The cursor's bounds apply inside its own run only.
LIST_THREAD_EVENTS_SQL = """
SELECT e.run_id::text, e.thread_id::text, e.seq, e.category, e.type, e.payload, e.created_at,
       r.seq AS run_seq
FROM (SELECT run_id, seq FROM runs
      WHERE thread_id = %(thread_id)s AND seq >= %(after_run)s AND seq <= %(before_run)s) r
CROSS JOIN LATERAL (
    SELECT * FROM run_events e
    WHERE e.run_id = r.run_id
      AND e.seq > CASE WHEN r.seq = %(after_run)s THEN %(after_seq)s ELSE 0 END
      AND e.seq < CASE WHEN r.seq = %(before_run)s THEN %(before_seq)s ELSE {max_seq} END
      AND (%(categories)s::text[] IS NULL OR e.category = ANY(%(categories)s::text[]))
    ORDER BY e.seq {order}
    LIMIT %(limit)s
) e
ORDER BY r.seq {order}, e.seq {order}
LIMIT %(limit)s
"""
# Usage reads the run's (the thread's) rows by its own key first, then picks `model.end`:
# without the MATERIALIZED fence the planner, with no statistics yet, prefers the small
# partial index run_events_model_end_at and reads every `model.end` row ever written, a
# cost that grows with the table instead of with the run (J2).
RUN_USAGE_SQL = """
WITH e AS MATERIALIZED (
    SELECT category, type, payload FROM run_events WHERE run_id = %(run_id)s
)
SELECT coalesce(payload ->> 'tag', 'lead_agent') AS tag,
       sum(coalesce((payload -> 'usage' ->> 'input_tokens')::bigint, 0)) AS input_tokens,
       sum(coalesce((payload -> 'usage' ->> 'output_tokens')::bigint, 0)) AS output_tokens,
       sum(coalesce((payload -> 'usage' ->> 'total_tokens')::bigint, 0)) AS total_tokens
FROM e
WHERE category = 'model' AND type = 'model.end'
GROUP BY 1
"""
THREAD_USAGE_SQL = """
WITH e AS MATERIALIZED (
    SELECT run_id, category, type, payload FROM run_events WHERE thread_id = %(thread_id)s
)
SELECT e.run_id::text AS run_id, coalesce(e.payload ->> 'tag', 'lead_agent') AS tag,
       sum(coalesce((e.payload -> 'usage' ->> 'input_tokens')::bigint, 0)) AS input_tokens,
       sum(coalesce((e.payload -> 'usage' ->> 'output_tokens')::bigint, 0)) AS output_tokens,
       sum(coalesce((e.payload -> 'usage' ->> 'total_tokens')::bigint, 0)) AS total_tokens
FROM e
WHERE e.category = 'model' AND e.type = 'model.end'
GROUP BY 1, 2
"""
GET_RECEIPT_SQL = f"""
SELECT {_EVENT_COLUMNS} FROM run_events
WHERE run_id = %(run_id)s AND category = 'delivery' AND type = 'run.delivery'
  AND (%(attempt)s::text IS NULL OR payload ->> 'attempt' = %(attempt)s::text)
ORDER BY seq DESC
LIMIT 1
"""


def append_in(
    conn: psycopg.Connection[DictRow],
    run_id: str,
    category: Category,
    type: str,
    payload: Mapping[str, Any],
) -> int | None:
    """Append one event in the caller's transaction; its seq, or None if there is no such run.

    For writers that change a run and record it atomically (RunStore's lifecycle events):
    the event commits or rolls back with the caller's transaction and takes its seq from
    the same counter as the store's appends. Lock the run row before calling (see the
    module docstring). The event is stamped with the transaction's `now()` and its
    payload is kept whole (the caller's own small payloads, not a tool's output).
    """
    row = conn.execute(APPEND_EVENT_SQL, _append_params(run_id, category, type, payload))
    got = row.fetchone()
    return None if got is None else int(got["seq"])


def queue_in(
    conn: psycopg.Connection[DictRow],
    run_id: str,
    category: Category,
    type: str,
    payload: Mapping[str, Any],
) -> None:
    """`append_in` without reading its seq back: in pipeline mode (`conn.pipeline()`) the
    insert goes with the transaction's other statements in one round trip instead of
    forcing one of its own."""
    conn.execute(APPEND_EVENT_SQL, _append_params(run_id, category, type, payload))


def _append_params(
    run_id: str, category: Category, type: str, payload: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "category": check_category(category),
        "type": type,
        "payload": payload_json(payload),
        "created_at": None,
    }


def _row_event(row: Mapping[str, Any]) -> RunEvent:
    return RunEvent(
        run_id=row["run_id"],
        thread_id=row["thread_id"],
        category=row["category"],
        type=row["type"],
        payload=row["payload"],
        seq=int(row["seq"]),
        created_at=row["created_at"],
    )


def _usage_row(row: Mapping[str, Any]) -> Usage:
    return {k: int(row[k]) for k in USAGE_KEYS}


class RunEventStore:
    """Run events in Postgres (`run_events`, `run_event_seqs`)."""

    def __init__(
        self,
        pool: DictPool,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        page_size: int = DEFAULT_PAGE_SIZE,
        page_size_max: int = DEFAULT_PAGE_SIZE_MAX,
        fence_idle_timeout_s: float = 5.0,
    ) -> None:
        self._pool = pool
        self._fence_idle = f"{int(fence_idle_timeout_s * 1000)}ms"
        self.max_payload_bytes = max_payload_bytes
        self.page_size = page_size
        self.page_size_max = page_size_max

    # appends -----------------------------------------------------------------------------
    def append(self, event: RunEvent) -> RunEvent:
        """Append one event; returns it with its seq."""
        return self.append_batch([event])[0]

    def append_batch(self, events: Sequence[RunEvent]) -> list[RunEvent]:
        """Append events atomically, one statement per run; returns them with seqs.

        A batch of one run (the journal's) is a single autocommit statement; events of
        several runs share one transaction.
        """
        if not events:
            return []
        groups: dict[str, list[int]] = defaultdict(list)
        for i, ev in enumerate(events):
            check_category(ev.category)
            groups[ev.run_id].append(i)
        out: list[RunEvent | None] = [None] * len(events)
        try:
            with self._pool.connection() as conn:
                tx = conn.transaction() if len(groups) > 1 else contextlib.nullcontext()
                with tx:
                    for run_id, idx in groups.items():
                        group = [events[i] for i in idx]
                        rows = conn.execute(APPEND_BATCH_SQL, self._batch_params(run_id, group))
                        seqs = sorted(int(r["seq"]) for r in rows.fetchall())
                        if not seqs:
                            raise RunNotFound(f"run {run_id} not found")
                        if len(seqs) != len(group):  # pragma: no cover - a broken invariant
                            raise StoreError(f"appended {len(seqs)} of {len(group)} events")
                        for i, seq in zip(idx, seqs, strict=True):
                            e = events[i]
                            out[i] = RunEvent(
                                e.run_id,
                                e.thread_id,
                                e.category,
                                e.type,
                                e.payload,
                                seq,
                                e.created_at,
                            )
        except psycopg.Error as exc:
            raise StoreError(f"appending {len(events)} run events failed: {exc}") from exc
        return [ev for ev in out if ev is not None]

    def _batch_params(self, run_id: str, group: Sequence[RunEvent]) -> dict[str, Any]:
        return {
            "run_id": run_id,
            "n": len(group),
            "categories": [ev.category for ev in group],
            "types": [ev.type for ev in group],
            "payloads": [encode_payload(ev.payload, self.max_payload_bytes) for ev in group],
            "created_at": [ev.created_at for ev in group],
        }

    def append_receipt(self, event: RunEvent, *, epoch: int | None = None) -> RunEvent | None:
        """Append a delivery receipt unless one exists for its (run_id, attempt) (J5).

        With `epoch` the write is fenced (L2): it commits only while that epoch owns the
        running run, and raises LeaseLost when a newer owner exists or the run ended.

        Not truncated: the receipt is the proof of delivery and its size is bounded by
        its presented paths. A conflict rolls the transaction back, so the seq the
        allocator took is returned and no gap is left.
        """
        check_receipt(event)
        params = {
            "run_id": event.run_id,
            "thread_id": event.thread_id,
            "category": event.category,
            "type": event.type,
            "payload": payload_json(event.payload),
            "created_at": event.created_at,
            "epoch": epoch,
            "idle": self._fence_idle,
        }
        sql = APPEND_RECEIPT_SQL if epoch is None else APPEND_FENCED_RECEIPT_SQL
        try:
            with self._pool.connection() as conn:
                with conn.transaction() as tx:
                    row = conn.execute(sql, params).fetchone()
                    if row is None:
                        raise psycopg.Rollback(tx)
                if row is None:
                    owner = conn.execute(RUN_OWNER_SQL, {"run_id": event.run_id}).fetchone()
                    if owner is None:
                        raise RunNotFound(f"run {event.run_id} not found")
                    if epoch is not None and (
                        owner["owner_epoch"] != epoch or owner["status"] != "running"
                    ):
                        raise LeaseLost(f"run {event.run_id}: receipt fenced (epoch {epoch})")
                    return None
        except psycopg.Error as exc:
            raise StoreError(f"writing the delivery receipt failed: {exc}") from exc
        return replace(event, seq=int(row["seq"]), created_at=row["created_at"])

    # reads -------------------------------------------------------------------------------
    def _page_args(
        self,
        direction: Direction | None,
        after: object,
        before: object,
        categories: Sequence[str] | None,
        limit: int | None,
    ) -> tuple[Direction, int, list[str] | None]:
        """The direction, page size and checked categories of a page request."""
        way = page_direction(direction, after, before)
        n = page_limit(limit, self.page_size, self.page_size_max)
        cats = [check_category(c) for c in categories] if categories is not None else None
        return way, n, cats

    def list_run_events(
        self,
        run_id: str,
        *,
        after_seq: int | None = None,
        before_seq: int | None = None,
        categories: Sequence[str] | None = None,
        limit: int | None = None,
        direction: Direction | None = None,
    ) -> EventPage:
        """A page of the run's events, by seq (see the module docstring)."""
        way, n, cats = self._page_args(direction, after_seq, before_seq, categories, limit)
        sql = LIST_RUN_EVENTS_SQL.format(order="ASC" if way == "forward" else "DESC")
        params = {
            "run_id": run_id,
            "after": after_seq if after_seq is not None else 0,
            "before": before_seq if before_seq is not None else MAX_SEQ,
            "categories": cats,
            "limit": n + 1,
        }
        with self._pool.connection() as conn:
            rows = conn.execute(sql, params).fetchall()
        events = [_row_event(r) for r in rows[:n]]
        if way == "backward":
            events.reverse()
        return EventPage(
            events,
            len(rows) > n,
            str(events[0].seq) if events else None,
            str(events[-1].seq) if events else None,
        )

    def list_thread_events(
        self,
        thread_id: str,
        *,
        after: ThreadCursor | None = None,
        before: ThreadCursor | None = None,
        categories: Sequence[str] | None = None,
        limit: int | None = None,
        direction: Direction | None = None,
    ) -> EventPage:
        """A page of the thread's events, by (run order, seq)."""
        way, n, cats = self._page_args(direction, after, before, categories, limit)
        order = "ASC" if way == "forward" else "DESC"
        lo = after if after is not None else (0, 0)
        hi = before if before is not None else (MAX_SEQ, MAX_SEQ)
        params = {
            "thread_id": thread_id,
            "after_run": lo[0],
            "after_seq": lo[1],
            "before_run": hi[0],
            "before_seq": hi[1],
            "categories": cats,
            "limit": n + 1,
        }
        with self._pool.connection() as conn:
            sql = LIST_THREAD_EVENTS_SQL.format(order=order, max_seq=MAX_SEQ)
            rows = conn.execute(sql, params).fetchall()
        page = rows[:n]
        if way == "backward":
            page.reverse()
        cursors = [format_thread_cursor((int(r["run_seq"]), int(r["seq"]))) for r in page]
        return EventPage(
            [_row_event(r) for r in page],
            len(rows) > n,
            cursors[0] if cursors else None,
            cursors[-1] if cursors else None,
        )

    def run_usage(self, run_id: str) -> UsageSummary:
        """The run's token usage by tag and in total, summed from its `model.end` events."""
        with self._pool.connection() as conn:
            rows = conn.execute(RUN_USAGE_SQL, {"run_id": run_id}).fetchall()
        return usage_summary({r["tag"]: _usage_row(r) for r in rows})

    def thread_usage(self, thread_id: str) -> UsageSummary:
        """The thread's token usage: total, by tag, and each run's total in `by_run`."""
        with self._pool.connection() as conn:
            rows = conn.execute(THREAD_USAGE_SQL, {"thread_id": thread_id}).fetchall()
        by_tag: dict[str, Usage] = defaultdict(empty_usage)
        by_run: dict[str, Usage] = defaultdict(empty_usage)
        for r in rows:
            add_usage(by_tag[r["tag"]], _usage_row(r))
            add_usage(by_run[r["run_id"]], _usage_row(r))
        return {**usage_summary(by_tag), "by_run": dict(sorted(by_run.items()))}

    def get_receipt(self, run_id: str, attempt: int | None = None) -> RunEvent | None:
        """The delivery receipt of `attempt` (the latest one's when None)."""
        params = {"run_id": run_id, "attempt": None if attempt is None else str(attempt)}
        with self._pool.connection() as conn:
            row = conn.execute(GET_RECEIPT_SQL, params).fetchone()
        return _row_event(row) if row else None
