"""`PostgresMemoryBackend`: the default fact store (M1), table `memory_facts` (0004)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from shared.db import DictPool
from shared.memory.base import (
    CATEGORIES,
    Fact,
    FailurePolicy,
    MemoryFactNotFound,
    NewFact,
    content_hash,
    superseded_ids,
)

LIST_SQL = """
SELECT fact_id, agent_name, user_id, category, content, confidence, source_thread_id,
       created_at, updated_at
FROM memory_facts
WHERE user_id = %(user_id)s AND (%(agent_name)s::text IS NULL OR agent_name = %(agent_name)s)
ORDER BY updated_at DESC, fact_id
LIMIT %(limit)s
"""

# Same text in the same bucket is the same fact: a repeated extraction refreshes it.
UPSERT_SQL = """
INSERT INTO memory_facts (fact_id, agent_name, user_id, category, content, content_hash,
                          confidence, source_thread_id, trace_id)
VALUES (%(fact_id)s, %(agent_name)s, %(user_id)s, %(category)s, %(content)s, %(hash)s,
        %(confidence)s, %(source_thread_id)s, %(trace_id)s)
ON CONFLICT (agent_name, user_id, content_hash) DO UPDATE
SET category = EXCLUDED.category,
    content = EXCLUDED.content,
    confidence = GREATEST(memory_facts.confidence, EXCLUDED.confidence),
    source_thread_id = EXCLUDED.source_thread_id,
    trace_id = EXCLUDED.trace_id,
    updated_at = now()
"""

DELETE_SQL = "DELETE FROM memory_facts WHERE fact_id = %(fact_id)s AND user_id = %(user_id)s"
# A correction supersedes the facts it replaces: only this agent's facts of this user, and
# never one this same step stores again (same text).
SUPERSEDE_SQL = """
DELETE FROM memory_facts
WHERE agent_name = %(agent_name)s AND user_id = %(user_id)s
  AND fact_id = ANY(%(ids)s::uuid[]) AND content_hash <> ALL(%(keep)s::text[])
"""


def _fact(row: dict[str, Any]) -> Fact:
    return Fact(
        fact_id=str(row["fact_id"]),
        agent_name=row["agent_name"],
        user_id=row["user_id"],
        category=row["category"],
        content=row["content"],
        confidence=float(row["confidence"]),
        source_thread_id=row["source_thread_id"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


class PostgresMemoryBackend:
    """Facts in Postgres, through the process's sync pool."""

    def __init__(
        self,
        pool: DictPool,
        *,
        owns_pool: bool = False,
        failure_policy: FailurePolicy | None = None,
    ) -> None:
        self._pool = pool
        self._owns_pool = owns_pool
        self.failure_policy = failure_policy or FailurePolicy()

    def list_facts(self, agent_name: str | None, user_id: str, limit: int) -> list[Fact]:
        """A user's facts, newest first."""
        with self._pool.connection() as conn:
            rows = conn.execute(
                LIST_SQL, {"agent_name": agent_name, "user_id": user_id, "limit": limit}
            ).fetchall()
        return [_fact(r) for r in rows]

    def upsert_facts(
        self,
        agent_name: str,
        user_id: str,
        facts: Sequence[NewFact],
        *,
        source_thread_id: str | None,
        trace_id: str | None,
    ) -> int:
        """Store facts idempotently in one transaction."""
        params = [
            {
                "fact_id": uuid.uuid4(),
                "agent_name": agent_name,
                "user_id": user_id,
                "category": f.category if f.category in CATEGORIES else "fact",
                "content": f.content,
                "hash": content_hash(f.content),
                "confidence": min(max(f.confidence, 0.0), 1.0),
                "source_thread_id": source_thread_id,
                "trace_id": trace_id,
            }
            for f in facts
        ]
        if not params:
            return 0
        replaced = superseded_ids(facts)
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            if replaced:
                cur.execute(
                    SUPERSEDE_SQL,
                    {
                        "agent_name": agent_name,
                        "user_id": user_id,
                        "ids": replaced,
                        "keep": [p["hash"] for p in params],
                    },
                )
            cur.executemany(UPSERT_SQL, params)
        return len(params)

    def delete_fact(self, user_id: str, fact_id: str) -> None:
        """Delete one of the user's facts."""
        try:
            fid = uuid.UUID(fact_id)
        except ValueError:
            raise MemoryFactNotFound(f"memory fact {fact_id!r} not found") from None
        with self._pool.connection() as conn:
            deleted = conn.execute(DELETE_SQL, {"fact_id": fid, "user_id": user_id}).rowcount
        if not deleted:
            raise MemoryFactNotFound(f"memory fact {fact_id!r} not found")

    def close(self) -> None:
        """Close the pool if this backend opened it."""
        if self._owns_pool:
            self._pool.close()
