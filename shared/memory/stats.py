"""Memory queue numbers for the ops dashboard: cheap (three Redis commands, no SQL)."""

from __future__ import annotations

from typing import Any

import redis

from shared.redis_keys import MemoryKeys
from shared.settings import Settings


def memory_stats(settings: Settings, client: redis.Redis) -> dict[str, Any]:
    """backlog (admitted, not yet extracted), leased, skipped (M5) and the other counters."""
    keys = MemoryKeys(settings.redis_prefix)
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.due)
    pipe.zcard(keys.leases)
    pipe.hgetall(keys.stats)
    due, leased, raw = pipe.execute()
    counters = {"admitted": 0, "merged": 0, "skipped": 0, "extracted": 0, "dropped": 0}
    for key, value in (raw or {}).items():
        counters[key.decode() if isinstance(key, bytes) else str(key)] = int(value)
    return {
        "backlog": int(due) + int(leased),
        "pending": int(due),
        "leased": int(leased),
        "backlog_limit": settings.memory_backlog_limit,
        **counters,
    }
