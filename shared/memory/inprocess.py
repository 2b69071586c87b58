"""`InProcessMemoryBackend`: facts in a dict, for unit tests only (never a default, G2)."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Sequence

from shared.memory.base import (
    CATEGORIES,
    Fact,
    FailurePolicy,
    MemoryFactNotFound,
    NewFact,
    content_hash,
    superseded_ids,
)


class InProcessMemoryBackend:
    """The MemoryBackend contract over a dict guarded by a lock."""

    def __init__(self, *, failure_policy: FailurePolicy | None = None) -> None:
        self.failure_policy = failure_policy or FailurePolicy()
        self._facts: dict[tuple[str, str, str], Fact] = {}
        self._lock = threading.Lock()

    def list_facts(self, agent_name: str | None, user_id: str, limit: int) -> list[Fact]:
        """A user's facts, newest first."""
        with self._lock:
            facts = [
                f
                for f in self._facts.values()
                if f.user_id == user_id and (agent_name is None or f.agent_name == agent_name)
            ]
        facts.sort(key=lambda f: (-f.updated_at.timestamp(), f.fact_id))
        return facts[:limit]

    def upsert_facts(
        self,
        agent_name: str,
        user_id: str,
        facts: Sequence[NewFact],
        *,
        source_thread_id: str | None,
        trace_id: str | None,
    ) -> int:
        """Store facts idempotently (same text = same fact); delete the ones they replace."""
        now = dt.datetime.now(dt.UTC)
        replaced = {str(i) for i in superseded_ids(facts)}
        keep = {content_hash(f.content) for f in facts}
        with self._lock:
            for bucket, stored in list(self._facts.items()):
                if (
                    stored.fact_id in replaced
                    and bucket[:2] == (agent_name, user_id)
                    and bucket[2] not in keep
                ):
                    del self._facts[bucket]
            for f in facts:
                key = (agent_name, user_id, content_hash(f.content))
                old = self._facts.get(key)
                self._facts[key] = Fact(
                    fact_id=old.fact_id if old else str(uuid.uuid4()),
                    agent_name=agent_name,
                    user_id=user_id,
                    category=f.category if f.category in CATEGORIES else "fact",
                    content=f.content,
                    confidence=max(old.confidence if old else 0.0, min(max(f.confidence, 0), 1)),
                    source_thread_id=source_thread_id,
                    created_at=old.created_at if old else now,
                    updated_at=now,
                )
        return len(facts)

    def delete_fact(self, user_id: str, fact_id: str) -> None:
        """Delete one of the user's facts."""
        with self._lock:
            for key, f in self._facts.items():
                if f.fact_id == fact_id and f.user_id == user_id:
                    del self._facts[key]
                    return
        raise MemoryFactNotFound(f"memory fact {fact_id!r} not found")

    def close(self) -> None:
        """Nothing to release."""
