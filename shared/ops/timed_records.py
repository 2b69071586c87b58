"""A Redis hash of records that processes rewrite every period, each stamped with its write
time (`at`, Unix seconds): `make run` supervisors' children (supervision.py) and the
workers' presence (presence.py). A record counts STALE_PERIODS periods after its last write;
one older than PRUNE_S, or one that cannot be read, is removed by the reader."""

from __future__ import annotations

import time
from typing import Any

import redis

from shared import serde

STALE_PERIODS = 3
"""A record counts this many periods after its last write."""
PRUNE_S = 3600.0
"""A record older than this is removed by the reader (its writer is long gone)."""


def read_fresh(client: redis.Redis, key: str, period_s: float) -> list[dict[str, Any]]:
    """The records of `key` written within STALE_PERIODS periods (with their `at`), in the
    hash's order; stale ones past PRUNE_S and unreadable ones are removed."""
    now = time.time()
    live: list[dict[str, Any]] = []
    for field, raw in client.hgetall(key).items():
        try:
            record = serde.loads(raw)
            at = float(record["at"])
        except (ValueError, KeyError, TypeError):
            client.hdel(key, field)
            continue
        if now - at > PRUNE_S:
            client.hdel(key, field)
        elif now - at <= period_s * STALE_PERIODS:
            live.append(record)
    return live
