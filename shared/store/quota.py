"""`max_store_items_per_user` (A3): how many items one user's namespaces may hold.

Counted in PostgreSQL from `owner_counts` (kind `store`, owner the user's label: the first
`.`-separated part of the store's `prefix`), which triggers on LangGraph's `store` table keep
(`install_counts`, run by the migration step after the store's own setup), so a user's count
is a read of at most 16 rows whatever they hold; counting their items read up to the quota's
index entries (10,000) at every put. A put of new keys that would take the user past the quota
is refused whole (429 naming the limit); a put that replaces an existing item never is, nor a
delete. Counted without a lock: concurrent puts of one user may pass it by as many.
"""

from __future__ import annotations

from collections.abc import Sequence

from langgraph.store.base import PutOp
from psycopg import Connection
from psycopg.rows import DictRow

from shared.db import AsyncDictPool, DictPool
from shared.errors import LimitExceeded
from shared.store.namespaces import user_label

COUNT_SQL = (
    "SELECT coalesce(sum(n), 0) AS n FROM owner_counts WHERE kind = 'store' AND owner = %(label)s"
)
PRESENT_SQL = (
    "SELECT count(*) AS n FROM store"
    " WHERE (prefix, key) IN (SELECT * FROM unnest(%(prefixes)s::text[], %(keys)s::text[]))"
)


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
        return {"label": user_label(user_id)}


def _present_params(items: list[tuple[str, str]]) -> dict[str, object]:
    return {"prefixes": [p for p, _ in items], "keys": [k for _, k in items]}


COUNT_TRIGGERS_SQL = """
CREATE OR REPLACE FUNCTION store_counts_apply() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    sign bigint := CASE TG_OP WHEN 'INSERT' THEN 1 ELSE -1 END;
BEGIN
    INSERT INTO owner_counts AS c (kind, owner, shard, n)
    SELECT 'store', split_part(prefix, '.', 1), (txid_current() % 16)::smallint, sign * count(*)
    FROM changed WHERE strpos(prefix, '.') > 0
    GROUP BY 2 ORDER BY 2
    ON CONFLICT (kind, owner, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;
CREATE TRIGGER store_count_insert AFTER INSERT ON store
REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION store_counts_apply();
CREATE TRIGGER store_count_delete AFTER DELETE ON store
REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION store_counts_apply();
CREATE TRIGGER store_count_truncate AFTER TRUNCATE ON store
FOR EACH STATEMENT EXECUTE FUNCTION owner_counts_truncate('store');
DELETE FROM owner_counts WHERE kind = 'store';
INSERT INTO owner_counts (kind, owner, shard, n)
SELECT 'store', split_part(prefix, '.', 1), 0, count(*) FROM store
WHERE strpos(prefix, '.') > 0 GROUP BY 2;
"""
"""The store's counts, as migration 0017 keeps threads' and assistants' (see it for the
shards): an item is its user's when its `prefix` starts with their label and a `.` (labels
have no `.`), what the count by `LIKE '<label>.%'` counted. An insert that replaces an item
(`ON CONFLICT DO UPDATE`, every put of an existing key) is no new row in the trigger's
transition table. Creating the triggers locks the table against writes until the counts
below are taken, in the same transaction."""

INSTALLED_SQL = (
    "SELECT 1 FROM pg_trigger WHERE tgrelid = 'store'::regclass AND tgname = 'store_count_insert'"
)


def install_counts(conn: Connection[DictRow]) -> bool:
    """Create the store's count triggers and take its counts, once (the store's table comes
    from LangGraph's own setup, after threadrun's migrations); True when it did. `conn`
    must use the simple query protocol (several statements), as the migration step's does."""
    with conn.transaction():
        if conn.execute(INSTALLED_SQL).fetchone() is not None:
            return False
        conn.execute(COUNT_TRIGGERS_SQL)
    return True
