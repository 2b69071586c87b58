"""The audit event store (SPEC J4): append-only `run_events`, per-run seq, cursor pages.

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
the run row before they append, so the two orders agree and cannot deadlock. The
allocator takes `greatest(counter, max(seq))`, which keeps it correct next to a writer
that still appends with `max(seq) + 1` (RunStore until it moves to `APPEND_EVENT_SQL`,
an old process during a rolling deploy); once every writer uses the counter that term
is one index probe. `bench/journal_bench.py`: a batch of 20 runs at ~0.9x the events/s of
a raw COPY of 20 (and ~1.2x a raw multi-row INSERT); a single append costs ~0.25 ms more
than a bare INSERT.

Rows. The store takes an event's thread_id from the run row it locks, so it is always
the run's own. Payloads
are sent as binary text arrays: psycopg's text-format array quoting of JSON cost 3x the
statement itself on 500-event batches.

Pages. A run's events are ordered by seq; a thread's by (runs.seq, seq), i.e. run
admission order then seq, with the cursor `"<run_seq>:<seq>"`. Both take an
exclusive `after` and/or `before` bound, read forward (ascending, the default) or
backward (the `limit` events just before `before`), and always return ascending pages.
"""

from __future__ import annotations

import contextlib
import enum
import re
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import psycopg

from shared import serde
from shared.db import DictPool
from shared.errors import LeaseLost, RunNotFound, StoreError

Direction = Literal["forward", "backward"]
Usage = dict[str, int]
UsageSummary = dict[str, Any]
ThreadCursor = tuple[int, int]

DEFAULT_TAG = "lead_agent"
USAGE_KEYS = ("input_tokens", "output_tokens", "total_tokens")
MODEL_END = "model.end"
DELIVERY_TYPE = "run.delivery"
MAX_SEQ = (1 << 63) - 1

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
DEFAULT_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE_MAX = 500


class Category(enum.StrEnum):
    """Event categories (J4)."""

    MESSAGE = "message"
    MODEL = "model"
    TOOL = "tool"
    MIDDLEWARE = "middleware"
    MEMORY = "memory"
    ARTIFACT = "artifact"
    WORKSPACE = "workspace"
    LIFECYCLE = "lifecycle"
    DELIVERY = "delivery"


CATEGORIES = frozenset(c.value for c in Category)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One audit event; `seq` is None until the store assigned it."""

    run_id: str
    thread_id: str
    category: str
    type: str
    payload: dict[str, Any]
    seq: int | None = None
    created_at: datetime = field(default_factory=_now)

    def to_json(self) -> dict[str, Any]:
        """The API shape of the event."""
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "seq": self.seq,
            "category": self.category,
            "type": self.type,
            "payload": self.payload,
            "created_at": self.created_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class EventPage:
    """One page of events in ascending order.

    `has_more` says whether more events exist past the page in the direction read
    (newer when forward, older when backward). `first`/`last` are the cursors of the
    first/last event (a seq for a run's page, `"<run_seq>:<seq>"` for a thread's): pass
    `last` as `after` to read on, `first` as `before` to read back.
    """

    events: list[RunEvent]
    has_more: bool
    first: str | None
    last: str | None


# --- pure helpers -----------------------------------------------------------------------------
_NUL_ESCAPE = re.compile(r"(\\+)u0000")


def _drop_nul(text: str) -> str:
    """Replace JSON `\\u0000` escapes (Postgres jsonb refuses them) with U+FFFD."""
    if "u0000" not in text:
        return text

    def repl(m: re.Match[str]) -> str:
        slashes = m.group(1)
        if len(slashes) % 2 == 0:  # an escaped backslash followed by the text "u0000"
            return m.group(0)
        return slashes[:-1] + "\\ufffd"

    return _NUL_ESCAPE.sub(repl, text)


def encode_payload(payload: Mapping[str, Any], max_bytes: int) -> str:
    """The payload as JSON text; past `max_bytes` it becomes a truncation marker.

    The marker is `{"_truncated": true, "original_bytes": N, "preview": …}`, where the
    preview is the start of the original JSON text (half the budget, cut on a character
    boundary), so the marker itself stays within `max_bytes` for any budget over ~100.
    """
    raw = serde.dumps(payload)
    if len(raw) > max_bytes:
        preview = raw[: max(0, max_bytes // 2)].decode("utf-8", errors="ignore")
        raw = serde.dumps({"_truncated": True, "original_bytes": len(raw), "preview": preview})
    return _drop_nul(raw.decode())


def truncate_payload(payload: Mapping[str, Any], max_bytes: int) -> dict[str, Any]:
    """What the store keeps of `payload` (the marker when it is too large)."""
    value = serde.loads(encode_payload(payload, max_bytes))
    assert isinstance(value, dict)
    return value


def check_category(category: str) -> str:
    """`category` if it is one of J4's, else ValueError."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown event category {category!r}")
    return category


def empty_usage() -> Usage:
    """Zero token counts."""
    return dict.fromkeys(USAGE_KEYS, 0)


def add_usage(into: Usage, other: Mapping[str, Any]) -> Usage:
    """Add the token counts of `other` to `into` (missing or bad counts count as 0)."""
    for key in USAGE_KEYS:
        value = other.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            into[key] += value
    return into


def usage_summary(by_tag: Mapping[str, Mapping[str, Any]]) -> UsageSummary:
    """`{"total": usage, "by_tag": {tag: usage}}` from per-tag counts."""
    total = empty_usage()
    tags: dict[str, Usage] = {}
    for tag in sorted(by_tag):
        tags[tag] = add_usage(empty_usage(), by_tag[tag])
        add_usage(total, tags[tag])
    return {"total": total, "by_tag": tags}


def summarize_usage(events: Iterable[RunEvent]) -> UsageSummary:
    """Sum the `model.end` usage of events by tag (J2); no IO."""
    by_tag: dict[str, Usage] = defaultdict(empty_usage)
    for ev in events:
        if ev.category == Category.MODEL and ev.type == MODEL_END:
            usage = ev.payload.get("usage")
            if isinstance(usage, Mapping):
                add_usage(by_tag[str(ev.payload.get("tag") or DEFAULT_TAG)], usage)
    return usage_summary(by_tag)


def format_thread_cursor(cursor: ThreadCursor) -> str:
    """`"<run_seq>:<seq>"`."""
    return f"{cursor[0]}:{cursor[1]}"


def parse_thread_cursor(text: str) -> ThreadCursor:
    """The pair of a `"<run_seq>:<seq>"` cursor; ValueError when malformed."""
    run_seq, sep, seq = text.partition(":")
    if not sep or not run_seq.isdigit() or not seq.isdigit():
        raise ValueError(f"malformed thread event cursor {text[:64]!r}")
    return int(run_seq), int(seq)


def page_limit(limit: int | None, default: int, maximum: int) -> int:
    """The page size to use: `default` when None, at most `maximum`; ValueError below 1."""
    n = default if limit is None else limit
    if n < 1:
        raise ValueError(f"limit must be at least 1, got {n}")
    return min(n, maximum)


def _direction(direction: Direction | None, after: object, before: object) -> Direction:
    if direction is None:
        return "backward" if before is not None and after is None else "forward"
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
    return direction


# --- the contract -------------------------------------------------------------------------------
class EventStore(Protocol):
    """Append-only audit events of runs (J4). Sync: async callers use asyncio.to_thread."""

    def append(self, event: RunEvent) -> RunEvent:
        """Append one event; returns it with its seq."""
        ...

    def append_batch(self, events: Sequence[RunEvent]) -> list[RunEvent]:
        """Append events atomically, each run's in the given order; returns them with seqs."""
        ...

    def append_receipt(self, event: RunEvent, *, epoch: int | None = None) -> RunEvent | None:
        """Append a `run.delivery` receipt once per (run_id, payload.attempt); None if present.

        With `epoch`, only while that epoch owns the running run (L2), else LeaseLost.
        """
        ...

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
        """A page of the run's events, by seq."""
        ...

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
        ...

    def run_usage(self, run_id: str) -> UsageSummary:
        """The run's token usage by tag and in total (J2)."""
        ...

    def thread_usage(self, thread_id: str) -> UsageSummary:
        """The thread's token usage: total, by tag, and `by_run` totals."""
        ...

    def get_receipt(self, run_id: str, attempt: int | None = None) -> RunEvent | None:
        """The delivery receipt of an attempt (the latest attempt's when None)."""
        ...


# --- Postgres -----------------------------------------------------------------------------------
# The allocator: the next `n` seqs of one run (see the module docstring). It takes the
# run row's FOR KEY SHARE lock first (the lock the FK check would take at the end of the
# statement anyway), so every writer locks the run row before the counter row: RunStore
# locks the run row (UPDATE, FOR UPDATE) before it appends, and the same order on both
# sides means no deadlock. A missing run allocates nothing (RunNotFound).
_ALLOC_CTE = """
WITH run AS (
    SELECT run_id, thread_id FROM runs WHERE run_id = %(run_id)s FOR KEY SHARE
), alloc AS (
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
# (None = now()); a `thread_id` param is accepted and ignored. RunStore's lifecycle
# events use this too (same allocator).
_INSERT_ONE = """
INSERT INTO run_events (run_id, seq, thread_id, category, type, payload, created_at)
SELECT run.run_id, alloc.last_seq, run.thread_id, %(category)s, %(type)s,
       %(payload)s::jsonb, coalesce(%(created_at)s::timestamptz, now())
FROM run, alloc
"""
APPEND_EVENT_SQL = _ALLOC_CTE.replace("%(n)s", "1") + _INSERT_ONE + "RETURNING seq, created_at\n"
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
RUN_EXISTS_SQL = "SELECT 1 FROM runs WHERE run_id = %(run_id)s"
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
RUN_USAGE_SQL = """
SELECT coalesce(payload ->> 'tag', 'lead_agent') AS tag,
       sum(coalesce((payload -> 'usage' ->> 'input_tokens')::bigint, 0)) AS input_tokens,
       sum(coalesce((payload -> 'usage' ->> 'output_tokens')::bigint, 0)) AS output_tokens,
       sum(coalesce((payload -> 'usage' ->> 'total_tokens')::bigint, 0)) AS total_tokens
FROM run_events
WHERE run_id = %(run_id)s AND category = 'model' AND type = 'model.end'
GROUP BY 1
"""
THREAD_USAGE_SQL = """
SELECT e.run_id::text AS run_id, coalesce(e.payload ->> 'tag', 'lead_agent') AS tag,
       sum(coalesce((e.payload -> 'usage' ->> 'input_tokens')::bigint, 0)) AS input_tokens,
       sum(coalesce((e.payload -> 'usage' ->> 'output_tokens')::bigint, 0)) AS output_tokens,
       sum(coalesce((e.payload -> 'usage' ->> 'total_tokens')::bigint, 0)) AS total_tokens
FROM run_events e
WHERE e.thread_id = %(thread_id)s AND e.category = 'model' AND e.type = 'model.end'
GROUP BY 1, 2
"""
GET_RECEIPT_SQL = f"""
SELECT {_EVENT_COLUMNS} FROM run_events
WHERE run_id = %(run_id)s AND category = 'delivery' AND type = 'run.delivery'
  AND (%(attempt)s::text IS NULL OR payload ->> 'attempt' = %(attempt)s::text)
ORDER BY seq DESC
LIMIT 1
"""


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
        if event.category != Category.DELIVERY or event.type != DELIVERY_TYPE:
            raise ValueError("a receipt is a delivery/run.delivery event")
        if not isinstance(event.payload.get("attempt"), int):
            raise ValueError("a receipt's payload needs an integer attempt")
        params = {
            "run_id": event.run_id,
            "thread_id": event.thread_id,
            "category": event.category,
            "type": event.type,
            "payload": _drop_nul(serde.dumps_str(event.payload)),
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
        way = _direction(direction, after, before)
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


# --- in process (unit tests only, G2) ---------------------------------------------------------------
class MemoryEventStore:
    """A process-local EventStore for unit tests; never a multi-process default (G2).

    A thread's run order is the order in which its runs first appended an event.
    """

    def __init__(
        self,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        page_size: int = DEFAULT_PAGE_SIZE,
        page_size_max: int = DEFAULT_PAGE_SIZE_MAX,
    ) -> None:
        self.max_payload_bytes = max_payload_bytes
        self.page_size = page_size
        self.page_size_max = page_size_max
        self._lock = threading.Lock()
        self._events: dict[str, list[RunEvent]] = defaultdict(list)
        self._run_seq: dict[str, int] = {}
        self._thread_runs: dict[str, list[str]] = defaultdict(list)

    def append(self, event: RunEvent) -> RunEvent:
        """Append one event."""
        return self.append_batch([event])[0]

    def append_batch(self, events: Sequence[RunEvent]) -> list[RunEvent]:
        """Append events, all or none."""
        for ev in events:
            check_category(ev.category)
        stored = [
            replace(ev, payload=truncate_payload(ev.payload, self.max_payload_bytes))
            for ev in events
        ]
        with self._lock:
            return [self._add(ev) for ev in stored]

    def _add(self, ev: RunEvent) -> RunEvent:
        log = self._events[ev.run_id]
        if ev.run_id not in self._run_seq:
            self._run_seq[ev.run_id] = len(self._run_seq) + 1
            self._thread_runs[ev.thread_id].append(ev.run_id)
        out = replace(ev, seq=(log[-1].seq or 0) + 1 if log else 1)
        log.append(out)
        return out

    def append_receipt(self, event: RunEvent, *, epoch: int | None = None) -> RunEvent | None:
        """Append a receipt once per (run_id, attempt); `epoch` is not checked (no runs)."""
        if event.category != Category.DELIVERY or event.type != DELIVERY_TYPE:
            raise ValueError("a receipt is a delivery/run.delivery event")
        if not isinstance(event.payload.get("attempt"), int):
            raise ValueError("a receipt's payload needs an integer attempt")
        with self._lock:
            if self._receipt(event.run_id, event.payload["attempt"]) is not None:
                return None
            return self._add(replace(event, payload=serde.to_jsonable(event.payload)))

    def _receipt(self, run_id: str, attempt: int | None) -> RunEvent | None:
        for ev in reversed(self._events.get(run_id, [])):
            if (
                ev.category == Category.DELIVERY
                and ev.type == DELIVERY_TYPE
                and (attempt is None or ev.payload.get("attempt") == attempt)
            ):
                return ev
        return None

    def _page(
        self,
        keyed: list[tuple[Any, RunEvent]],
        after: Any,
        before: Any,
        categories: Sequence[str] | None,
        limit: int | None,
        way: Direction,
        fmt: Any,
    ) -> EventPage:
        n = page_limit(limit, self.page_size, self.page_size_max)
        cats = {check_category(c) for c in categories} if categories is not None else None
        hits = [
            (k, ev)
            for k, ev in keyed
            if (after is None or k > after)
            and (before is None or k < before)
            and (cats is None or ev.category in cats)
        ]
        page = hits[:n] if way == "forward" else hits[-n:] if hits else []
        return EventPage(
            [ev for _, ev in page],
            len(hits) > n,
            fmt(page[0][0]) if page else None,
            fmt(page[-1][0]) if page else None,
        )

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
        """A page of the run's events, by seq."""
        way = _direction(direction, after_seq, before_seq)
        with self._lock:
            keyed = [(ev.seq, ev) for ev in self._events.get(run_id, [])]
        return self._page(keyed, after_seq, before_seq, categories, limit, way, str)

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
        way = _direction(direction, after, before)
        with self._lock:
            keyed = [
                ((self._run_seq[run_id], ev.seq), ev)
                for run_id in self._thread_runs.get(thread_id, [])
                for ev in self._events[run_id]
            ]
        return self._page(keyed, after, before, categories, limit, way, format_thread_cursor)

    def run_usage(self, run_id: str) -> UsageSummary:
        """The run's token usage."""
        with self._lock:
            events = list(self._events.get(run_id, []))
        return summarize_usage(events)

    def thread_usage(self, thread_id: str) -> UsageSummary:
        """The thread's token usage with `by_run` totals."""
        with self._lock:
            runs = {r: list(self._events[r]) for r in self._thread_runs.get(thread_id, [])}
        by_tag: dict[str, Usage] = defaultdict(empty_usage)
        by_run: dict[str, Usage] = {}
        for run_id, events in runs.items():
            summary = summarize_usage(events)
            for tag, usage in summary["by_tag"].items():
                add_usage(by_tag[tag], usage)
            if summary["by_tag"]:
                by_run[run_id] = summary["total"]
        return {**usage_summary(by_tag), "by_run": dict(sorted(by_run.items()))}

    def get_receipt(self, run_id: str, attempt: int | None = None) -> RunEvent | None:
        """The delivery receipt of `attempt` (the latest one's when None)."""
        with self._lock:
            return self._receipt(run_id, attempt)
