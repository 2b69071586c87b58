"""What every part of `RunStore` (shared/runs/store.py) stands on: the pool they share and
the small helpers their statements have in common.

`RunStore` is one object composed of one class per concept (threads, admission, reads,
claims, the reaper's queries, temporary threads); each is a `StoreBase`, so they all reach
the same `self._pool`, and a transaction of one part (a finish) appends its lifecycle event
the same way as any other (`_lifecycle`).
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from shared import serde
from shared.db import DictPool
from shared.errors import LimitExceeded
from shared.journal import Category, queue_in
from shared.runs.model import ThreadTTL
from shared.runs.queries import query

SET_LOCK_TIMEOUT_SQL = query("set_lock_timeout")
THREAD_QUOTA_SQL = query("thread_quota")


def json_param(value: Any) -> Jsonb | None:
    """`value` as a jsonb parameter (SQL NULL for None)."""
    return None if value is None else Jsonb(value, dumps=serde.dumps_str)


def is_uuid(value: str) -> bool:
    """Whether `value` parses as a UUID (ids a client sent, before a `::uuid` cast)."""
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def lock_timeout(conn: psycopg.Connection[DictRow], seconds: float | None) -> None:
    """A transaction-local lock_timeout (no-op for None)."""
    if seconds is not None:
        conn.execute(SET_LOCK_TIMEOUT_SQL, (f"{int(seconds * 1000)}ms",))


class StoreBase:
    """The pool the parts of `RunStore` share, and the TTL a new thread gets."""

    default_ttl: ThreadTTL | None = None
    """The TTL of a thread created without one (`checkpointer.ttl.default_ttl`, P6): by
    `POST /threads` or by an admission (`if_not_exists=create`, a run without a thread); set
    by `RunStore(pool, default_ttl=...)` in the processes that create threads."""

    max_threads_per_user: int | None = None
    """How many threads one owner may have (A3, `max_threads_per_user`; None: no quota);
    set by `RunStore(pool, max_threads_per_user=...)` in the processes that create threads."""

    def __init__(self, pool: DictPool) -> None:
        self._pool = pool

    def check_thread_quota(
        self,
        conn: psycopg.Connection[DictRow],
        owner: str,
        thread_id: str | None,
        public_id: str | None = None,
    ) -> None:
        """LimitExceeded (429 `max_threads_per_user`) when the owner has its quota of
        threads and the one to create (storage `thread_id`, or the owner's `public_id`) is
        not one of them. Counted in the creating transaction (the owner's `owner_counts`
        rows, at most 16 whatever it has) without a lock: concurrent creations of one owner
        may pass it by as many."""
        limit = self.max_threads_per_user
        if limit is None:
            return
        row = conn.execute(
            THREAD_QUOTA_SQL,
            {"owner": owner, "thread_id": thread_id, "public_id": public_id},
        ).fetchone()
        if row is not None and int(row["n"]) >= limit and not row["present"]:
            raise LimitExceeded(
                "max_threads_per_user",
                f"at most {limit} threads per user: delete some (or let them expire) first",
            )

    def ttl_params(self, ttl: ThreadTTL | None = None) -> dict[str, object]:
        """The TTL parameters of a new thread: `ttl`, else the deployment's default."""
        ttl = ttl or self.default_ttl
        return ttl.params() if ttl is not None else ThreadTTL.no_params()

    @property
    def pool(self) -> DictPool:
        """The pool the store's parts share (the retention sweep's lock and prune use it)."""
        return self._pool

    def close(self) -> None:
        """Close the pool."""
        self._pool.close()

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
