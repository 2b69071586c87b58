"""The debounced memory queue in Redis (SPEC M4, M5).

Why not Celery countdowns: a 30 s `countdown`/`eta` task sits in the worker's memory
after an early ack (lost if the worker dies) or, with late acks on Redis, comes back
after the visibility timeout while the first copy may still run, and a burst of 20
updates would still be 20 tasks. Instead an admitted update is written to Redis at
once and only a *due* bucket becomes a Celery task:

- `updates:<bucket>` — a list of the bucket's admitted updates (JSON), in order;
- `due` — a sorted set bucket -> due time; each admission moves the time to
  now + debounce (latest wins), but never past the bucket's first admission + max wait
  (`first` hash), so a thread that keeps talking is still extracted; an urgent
  admission makes it due now, and an urgent bucket is never pushed back by a later
  ordinary admission (`urgent` hash);
- `claims`/`leases` — a drain pass (`claim`) atomically renames a due bucket's list to
  `batch:<token>` and leases the token until now + claim_ttl; then it sends the
  extraction task with the token. The task acks (`ack`) after the facts are stored.
  A token whose lease runs out (the memory worker died before, during or after the
  task) is re-leased and re-sent by the next drain pass (`reclaim`), so an admitted
  update is lost only with Redis itself; facts are stored idempotently, so a batch
  extracted twice stores nothing twice.
- `stats` — counters: admitted, merged, skipped (M5), extracted, dropped.

Backlog = pending buckets + leased batches. Past `memory_backlog_limit` an ordinary
update is skipped and counted; correction/reinforcement and urgent (pre-summary)
updates are always admitted. Every key carries the `{memory}` hash tag, so the
multi-key scripts stay valid on Redis Cluster.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from shared import lua
from shared.memory.base import AdmitOutcome, MemoryUpdate
from shared.redis_keys import MemoryKeys


def bucket_of(agent_name: str, user_id: str, thread_id: str) -> str:
    """The debounce key of (agent_name, user_id, thread_id), safe in a key name."""
    raw = json.dumps([agent_name, user_id, thread_id]).encode("utf-8")
    return hashlib.sha1(raw, usedforsecurity=False).hexdigest()


class MemoryQueue:
    """Admit, claim, reclaim and ack debounced memory updates (sync redis-py)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        *,
        debounce_s: float,
        max_wait_s: float | None = None,
        backlog_limit: int,
        claim_ttl_s: float,
        max_attempts: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.redis = client
        self.keys = MemoryKeys(prefix)
        self.debounce_s = debounce_s
        self.max_wait_s = max_wait_s if max_wait_s is not None else 10 * debounce_s
        self.backlog_limit = backlog_limit
        self.claim_ttl_s = claim_ttl_s
        self.max_attempts = max_attempts
        self.clock = clock
        self._admit = lua.register(client, "memory_admit")
        self._claim = lua.register(client, "memory_claim")
        self._reclaim = lua.register(client, "memory_reclaim")
        self._ack = lua.register(client, "memory_ack")

    def admit(self, update: MemoryUpdate) -> AdmitOutcome:
        """Write the update durably to its bucket (or skip it under backpressure)."""
        k = self.keys
        bucket = bucket_of(update.agent_name, update.user_id, update.thread_id)
        now = self.clock()
        code = self._admit(
            keys=[k.due, k.updates(bucket), k.leases, k.stats, k.urgent, k.first],
            args=[
                bucket,
                json.dumps(update.as_json()),
                now + self.debounce_s,
                self.backlog_limit,
                "1" if update.priority else "0",
                "1" if update.urgent else "0",
                now,
                self.max_wait_s,
            ],
        )
        return {0: AdmitOutcome.SKIPPED, 1: AdmitOutcome.ADMITTED}.get(
            int(code), AdmitOutcome.MERGED
        )

    def claim_due(self, limit: int) -> list[str]:
        """Lease due buckets as batches; returns their tokens (send one task each)."""
        k = self.keys
        now = self.clock()
        tokens: list[str] = []
        for raw in self.redis.zrangebyscore(k.due, "-inf", now, start=0, num=limit):
            bucket = raw.decode() if isinstance(raw, bytes) else str(raw)
            token = uuid.uuid4().hex
            claimed = self._claim(
                keys=[
                    k.due,
                    k.updates(bucket),
                    k.batch(token),
                    k.leases,
                    k.claims,
                    k.urgent,
                    k.first,
                ],
                args=[bucket, token, now, now + self.claim_ttl_s],
            )
            if int(claimed) == 1:
                tokens.append(token)
        return tokens

    def reclaim_expired(self, limit: int) -> list[str]:
        """Re-lease batches whose lease ran out (dead or stuck worker); returns their tokens."""
        k = self.keys
        now = self.clock()
        tokens: list[str] = []
        for raw in self.redis.zrangebyscore(k.leases, "-inf", now, start=0, num=limit):
            token = raw.decode() if isinstance(raw, bytes) else str(raw)
            n = self._reclaim(
                keys=[k.leases, k.claims, k.batch(token), k.stats],
                args=[token, now, now + self.claim_ttl_s, self.max_attempts],
            )
            if int(n) > 0:
                tokens.append(token)
        return tokens

    def load(self, token: str) -> list[MemoryUpdate]:
        """The updates of a claimed batch ([] if it was acked already)."""
        raw = self.redis.lrange(self.keys.batch(token), 0, -1)
        return [MemoryUpdate.from_json(json.loads(r)) for r in raw]

    def ack(self, token: str) -> bool:
        """Remove a processed batch; False if another attempt acked it first."""
        k = self.keys
        return int(self._ack(keys=[k.leases, k.claims, k.batch(token), k.stats], args=[token])) == 1

    def backlog(self) -> int:
        """Admitted, not yet extracted: pending buckets + leased batches."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(self.keys.due)
        pipe.zcard(self.keys.leases)
        due, leased = pipe.execute()
        return int(due) + int(leased)

    def counters(self) -> dict[str, int]:
        """The queue's counters (admitted, merged, skipped, extracted, dropped)."""
        raw: dict[Any, Any] = self.redis.hgetall(self.keys.stats)
        out = {"admitted": 0, "merged": 0, "skipped": 0, "extracted": 0, "dropped": 0}
        for key, value in raw.items():
            name = key.decode() if isinstance(key, bytes) else str(key)
            out[name] = int(value)
        return out
