"""Copies of thread heads: what a thread object shows of its head checkpoint (`values`,
`interrupts`), kept in `thread_heads` so a page of thread objects is one cheap query instead
of every thread's head computed through its graph (migration 0011).

Why a copy is never wrong, only sometimes unused: each copy names the head checkpoint it
was made from, and a read takes it only while that id is still the thread's head (the
newest checkpoint of the root namespace, looked up in the same statement, one backward
primary-key probe per thread). A head moved by a path that wrote no copy (a worker that
died after its last checkpoint, a reaper that failed the run, a row older than the
migration) is read from the checkpoint, as before, and the copy is refreshed then.

Who writes:
- a run's finalize, in its fenced terminal transaction (`RunStore.finish(..., also=)`):
  after the epoch check succeeded, so a stale owner never writes one (L2);
- the web after it moves a head itself (state update, compaction, copy, prune) and a read
  that found a copy stale: *unfenced* writes, which take effect only while the thread is
  not busy (checked in the writing statement, after the head was read), so a copy of a
  run's intermediate head (its interrupt writes may still be coming) is never kept.
Every write keeps the newer of two copies (checkpoint ids are time-ordered uuid6, the order
LangGraph picks its head by), so a slow writer never puts an older head back.

Size: heads whose encoded values exceed `thread_values_max_bytes` are recorded without
values (`values_json` NULL): reads of such a thread go to the checkpoint, and the table
never holds a second copy of a huge state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson
from psycopg import Connection, Cursor
from psycopg.rows import DictRow

if TYPE_CHECKING:
    from shared.state.accessor import ThreadHead

log = logging.getLogger(__name__)

READ_SQL = """
SELECT t.thread_id,
       (SELECT c.checkpoint_id FROM checkpoints c
        WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = ''
        ORDER BY c.checkpoint_id DESC LIMIT 1) AS head_id,
       h.copy_id, h.values_json, h.interrupts
FROM unnest(%(thread_ids)s::text[]) AS t (thread_id)
LEFT JOIN LATERAL (
    SELECT h.checkpoint_id AS copy_id, h.values_json::text AS values_json,
           h.interrupts::text AS interrupts
    FROM thread_heads h WHERE h.thread_id = t.thread_id::uuid
    LIMIT 1
) h ON true
"""
"""For each thread: its head checkpoint's id (None: no checkpoint) and its copy, if any.
The copy is a primary-key probe per thread: the LIMIT keeps the lateral subquery from
becoming a plain join, whose plan, cached by a connection while `thread_heads` was small,
scanned the whole table on every read."""

WRITE_SQL = """
INSERT INTO thread_heads AS h (thread_id, checkpoint_id, values_json, interrupts, updated_at)
SELECT c.thread_id, c.checkpoint_id, c.values_json::json, c.interrupts::json, now()
FROM unnest(%(thread_ids)s::uuid[], %(checkpoint_ids)s::text[], %(values)s::text[],
            %(interrupts)s::text[]) AS c (thread_id, checkpoint_id, values_json, interrupts)
WHERE (SELECT %(fenced)s OR t.status <> 'busy' FROM threads t WHERE t.thread_id = c.thread_id)
ON CONFLICT (thread_id) DO UPDATE
SET checkpoint_id = excluded.checkpoint_id, values_json = excluded.values_json,
    interrupts = excluded.interrupts, updated_at = excluded.updated_at
WHERE h.checkpoint_id <= excluded.checkpoint_id
"""
"""Upsert copies, the newer head winning; unfenced ones only for threads not busy (the
module docstring says why); a thread deleted meanwhile is skipped (its subquery is NULL), not
an error. The thread is checked by a per-row subquery, one primary-key probe per copy, not a
join: a join's plan, cached by the connection while `threads` was small, hashed the whole
table on every write, a cost that grew with the number of threads."""


@dataclass(frozen=True, slots=True)
class StoredHead:
    """What `read` finds for one thread."""

    head_id: str | None
    """The thread's head checkpoint now (None: it has no checkpoint)."""
    copy_id: str | None
    """The head its copy was made from (None: no copy)."""
    values_json: str | None
    interrupts_json: str | None

    @property
    def current(self) -> bool:
        """The copy is of the head as it is now."""
        return self.copy_id is not None and self.copy_id == self.head_id

    @property
    def usable(self) -> bool:
        """The copy can answer for the head (current and not over the size cap)."""
        return self.current and self.values_json is not None


def read(cur: Cursor[DictRow], thread_ids: Sequence[str]) -> dict[str, StoredHead]:
    """Each thread's head checkpoint id and stored copy, in one statement."""
    cur.execute(READ_SQL, {"thread_ids": list(thread_ids)})
    return {
        str(r["thread_id"]): StoredHead(
            r["head_id"], r["copy_id"], r["values_json"], r["interrupts"]
        )
        for r in cur.fetchall()
    }


def write(
    conn: Connection[DictRow] | Cursor[DictRow],
    heads: Iterable[tuple[str, ThreadHead]],
    *,
    max_bytes: int,
    fenced: bool,
) -> None:
    """Store copies of heads (thread id, head with its checkpoint id); `fenced`: the caller
    holds the run's fence in this transaction (finalize), else only idle threads take it."""
    rows = [(tid, h) for tid, h in heads if h.checkpoint_id is not None]
    if not rows:
        return
    conn.execute(
        WRITE_SQL,
        {
            "thread_ids": [tid for tid, _ in rows],
            "checkpoint_ids": [h.checkpoint_id for _, h in rows],
            "values": [
                h.values_json.decode() if len(h.values_json) <= max_bytes else None for _, h in rows
            ],
            "interrupts": [orjson.dumps(h.interrupts).decode() for _, h in rows],
            "fenced": fenced,
        },
    )


def write_fenced(
    conn: Connection[DictRow], heads: Sequence[tuple[str, ThreadHead]], *, max_bytes: int
) -> None:
    """A run's finalize: store its thread's head copy inside the fenced terminal transaction
    (`RunStore.finish(also=...)`), which runs it under a savepoint: a failure here is rolled
    back alone and logged, since the run's terminal status must never depend on a cache
    (reads then find no current copy and compute the head from the checkpoint)."""
    write(conn, heads, max_bytes=max_bytes, fenced=True)
