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
from dataclasses import dataclass
from typing import Any

import redis

from shared.memory.base import AdmitOutcome, MemoryUpdate

# KEYS: due, updates:<bucket>, leases, stats, urgent, first
# ARGV: bucket, update JSON, now + debounce, backlog limit, priority (0|1), urgent (0|1),
#       now, max wait
# Returns 0 skipped, 1 admitted (new pending bucket), 2 merged into a pending bucket.
ADMIT_LUA = """
local pending = redis.call('ZSCORE', KEYS[1], ARGV[1])
if ARGV[5] == '0' then
  local backlog = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[3])
  if backlog >= tonumber(ARGV[4]) then
    redis.call('HINCRBY', KEYS[4], 'skipped', 1)
    return 0
  end
end
redis.call('RPUSH', KEYS[2], ARGV[2])
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[5], ARGV[1], '1')
  redis.call('ZADD', KEYS[1], ARGV[7], ARGV[1])
elseif redis.call('HEXISTS', KEYS[5], ARGV[1]) == 0 then
  local first = redis.call('HGET', KEYS[6], ARGV[1])
  if not first then
    redis.call('HSET', KEYS[6], ARGV[1], ARGV[7])
    first = ARGV[7]
  end
  local due = math.min(tonumber(ARGV[3]), tonumber(first) + tonumber(ARGV[8]))
  redis.call('ZADD', KEYS[1], due, ARGV[1])
end
if pending then
  redis.call('HINCRBY', KEYS[4], 'merged', 1)
  return 2
end
redis.call('HINCRBY', KEYS[4], 'admitted', 1)
return 1
"""

# KEYS: due, updates:<bucket>, batch:<token>, leases, claims, urgent, first
# ARGV: bucket, token, now, lease deadline
# Returns 1 when the bucket was due and is now the leased batch <token>, else 0.
CLAIM_LUA = """
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) > tonumber(ARGV[3]) then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
redis.call('HDEL', KEYS[7], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('RENAME', KEYS[2], KEYS[3])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[2])
redis.call('HSET', KEYS[5], ARGV[2], '0')
return 1
"""

# KEYS: leases, claims, batch:<token>, stats
# ARGV: token, now, new deadline, max attempts
# Returns the attempt number when the expired lease was renewed, 0 when the lease is
# not expired (or gone), -1 when the batch was dropped after max attempts.
RECLAIM_LUA = """
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) > tonumber(ARGV[2]) then return 0 end
local n = redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
if n >= tonumber(ARGV[4]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('DEL', KEYS[3])
  redis.call('HINCRBY', KEYS[4], 'dropped', 1)
  return -1
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return n
"""

# KEYS: leases, claims, batch:<token>, stats
# ARGV: token. Returns 1 if this call acked the batch, 0 if it was already gone.
ACK_LUA = """
local had = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3])
if had == 1 then redis.call('HINCRBY', KEYS[4], 'extracted', 1) end
return had
"""


@dataclass(frozen=True)
class MemoryKeys:
    """Key names of the memory queue under one prefix (one hash tag for all)."""

    prefix: str

    def _k(self, name: str) -> str:
        return f"{self.prefix}{{memory}}:{name}"

    @property
    def due(self) -> str:
        """Sorted set: pending bucket -> due time."""
        return self._k("due")

    @property
    def urgent(self) -> str:
        """Hash: buckets holding an urgent update (never pushed back)."""
        return self._k("urgent")

    @property
    def first(self) -> str:
        """Hash: pending bucket -> time of its first admission (bounds the debounce)."""
        return self._k("first")

    @property
    def leases(self) -> str:
        """Sorted set: claimed batch token -> lease deadline."""
        return self._k("leases")

    @property
    def claims(self) -> str:
        """Hash: claimed batch token -> reclaim count."""
        return self._k("claims")

    @property
    def stats(self) -> str:
        """Hash of counters."""
        return self._k("stats")

    def updates(self, bucket: str) -> str:
        """List of a bucket's admitted updates."""
        return self._k(f"updates:{bucket}")

    def batch(self, token: str) -> str:
        """List of a claimed batch's updates."""
        return self._k(f"batch:{token}")


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
        self._admit = client.register_script(ADMIT_LUA)
        self._claim = client.register_script(CLAIM_LUA)
        self._reclaim = client.register_script(RECLAIM_LUA)
        self._ack = client.register_script(ACK_LUA)

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
        raw: dict[Any, Any] = self.redis.hgetall(self.keys.stats)  # type: ignore[assignment]
        out = {"admitted": 0, "merged": 0, "skipped": 0, "extracted": 0, "dropped": 0}
        for key, value in raw.items():
            name = key.decode() if isinstance(key, bytes) else str(key)
            out[name] = int(value)
        return out
