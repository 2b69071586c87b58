"""`max_store_items_per_user` (A3): how many items one user's namespaces may hold.

Counted in PostgreSQL on the store's own table (LangGraph's `store`: one row per item,
`prefix` the namespace joined with `.`, indexed with `text_pattern_ops`), so a user's count
is one index range read of at most the quota's entries (`LIKE '<label>.%'`), whatever the
table's size. A put of new keys that would take the user past the quota is refused whole
(429 naming the limit); a put that replaces an existing item never is, nor a delete.
Counted without a lock: concurrent puts of one user may pass it by as many.
"""

from __future__ import annotations

from collections.abc import Sequence

from langgraph.store.base import PutOp

from shared.db import AsyncDictPool, DictPool
from shared.errors import LimitExceeded
from shared.store.namespaces import user_label

COUNT_SQL = (
    "SELECT count(*) AS n FROM (SELECT 1 FROM store"
    " WHERE prefix LIKE %(pattern)s ESCAPE '\\' LIMIT %(max)s) q"
)
PRESENT_SQL = (
    "SELECT count(*) AS n FROM store"
    " WHERE (prefix, key) IN (SELECT * FROM unnest(%(prefixes)s::text[], %(keys)s::text[]))"
)


def _pattern(user_id: str) -> str:
    """LIKE pattern of every stored prefix of the user's items (the label escaped: it is
    percent-encoded, and `%` and `_` are LIKE's wildcards)."""
    label = user_label(user_id).replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return label + ".%"


def _new_items(puts: Sequence[PutOp]) -> list[tuple[str, str]]:
    """(stored prefix, key) of the puts that store a value (deletes have none), once each."""
    return list(
        dict.fromkeys((".".join(op.namespace), op.key) for op in puts if op.value is not None)
    )


def _refusal(limit: int) -> LimitExceeded:
    return LimitExceeded(
        "max_store_items_per_user", f"at most {limit} store items per user: delete some first"
    )


class ItemQuota:
    """The check before a user's puts (the stored namespaces: `scope_op` applied)."""

    def __init__(
        self, limit: int, *, pool: DictPool | None = None, apool: AsyncDictPool | None = None
    ) -> None:
        self.limit = limit
        self._pool = pool
        self._apool = apool

    def check(self, user_id: str, puts: Sequence[PutOp]) -> None:
        """LimitExceeded when the puts' new items take the user past the quota."""
        items = _new_items(puts)
        if not items or self._pool is None:
            return
        with self._pool.connection() as conn:
            row = conn.execute(COUNT_SQL, self._count_params(user_id)).fetchone()
            have = int(row["n"]) if row else 0
            if have + len(items) <= self.limit:
                return
            row = conn.execute(PRESENT_SQL, _present_params(items)).fetchone()
        if have + len(items) - (int(row["n"]) if row else 0) > self.limit:
            raise _refusal(self.limit)

    async def acheck(self, user_id: str, puts: Sequence[PutOp]) -> None:
        """`check` on the async pool (a graph's store at run time)."""
        items = _new_items(puts)
        if not items or self._apool is None:
            return
        async with self._apool.connection() as conn:
            cur = await conn.execute(COUNT_SQL, self._count_params(user_id))
            row = await cur.fetchone()
            have = int(row["n"]) if row else 0
            if have + len(items) <= self.limit:
                return
            cur = await conn.execute(PRESENT_SQL, _present_params(items))
            row = await cur.fetchone()
        if have + len(items) - (int(row["n"]) if row else 0) > self.limit:
            raise _refusal(self.limit)

    def _count_params(self, user_id: str) -> dict[str, object]:
        return {"pattern": _pattern(user_id), "max": self.limit}


def _present_params(items: list[tuple[str, str]]) -> dict[str, object]:
    return {"prefixes": [p for p, _ in items], "keys": [k for _, k in items]}
