"""Owner leases (L1-L3): a Redis lease `{epoch}|{owner}` with a TTL, fenced by the Postgres epoch.

The Postgres `owner_epoch` is the fencing token: a claim increments it in the same
UPDATE that makes the run `running`. The Redis lease carries that epoch so the fenced
Lua scripts (publish, renew) can reject a stale owner without a database round trip.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import redis.asyncio as aredis

from shared import lua
from shared.redis_keys import Keys


class RenewOutcome(enum.Enum):
    """What a renewal found."""

    RENEWED = "renewed"
    LOST = "lost"


class Renewal(NamedTuple):
    """One lease's renewal: the outcome, a pending cancel action ('' if none) and the
    attempt's newest event sequence number its stream still has (-1 when not asked)."""

    outcome: RenewOutcome
    cancel: str
    stream_seq: int = -1


def lease_value(epoch: int, owner: str) -> str:
    """The lease string stored in Redis."""
    return f"{epoch}|{owner}"


class LeaseManager:
    """Claim, renew (compare-and-extend) and release run leases."""

    def __init__(self, client: aredis.Redis, keys: Keys, *, ttl_s: float) -> None:
        self._client = client
        self._keys = keys
        self._ttl_ms = int(ttl_s * 1000)
        self._claim = lua.register(client, "lease_claim")
        self._renew = lua.register(client, "lease_renew")
        self._release = lua.register(client, "lease_release")

    async def acquire(self, run_id: str, epoch: int, owner: str) -> bool:
        """Take the lease for `epoch`; False if a higher epoch already holds it."""
        ok = await self._claim(
            keys=[self._keys.lease(run_id)],
            args=[lease_value(epoch, owner), epoch, self._ttl_ms],
        )
        return bool(ok)

    async def renew(self, run_id: str, value: str) -> tuple[RenewOutcome, str]:
        """Extend the lease if still ours; also return a pending cancel action ('' if none)."""
        ok, cancel, _ = await self._renew(
            keys=[self._keys.lease(run_id), self._keys.cancel(run_id)],
            args=[value, self._ttl_ms],
        )
        action = cancel.decode() if isinstance(cancel, bytes) else str(cancel or "")
        return (RenewOutcome.RENEWED if ok else RenewOutcome.LOST), action

    async def renew_many(
        self, leases: list[tuple[str, str]], *, stream_seq: bool = False
    ) -> list[Renewal]:
        """Renew many leases in one round trip: [(run_id, value)] -> [Renewal]; with
        `stream_seq`, each also says how far its stream has the attempt's events (a
        publisher that was answered for more repairs the tail, shared/bridge/publisher.py)."""
        if not leases:
            return []
        pipe = self._client.pipeline(transaction=False)
        for run_id, value in leases:
            keys = [self._keys.lease(run_id), self._keys.cancel(run_id)]
            if stream_seq:
                keys.append(self._keys.stream_meta(run_id))
            await self._renew(keys=keys, args=[value, self._ttl_ms], client=pipe)
        out = []
        for ok, cancel, seq in await pipe.execute():
            action = cancel.decode() if isinstance(cancel, bytes) else str(cancel or "")
            outcome = RenewOutcome.RENEWED if ok else RenewOutcome.LOST
            out.append(Renewal(outcome, action, int(seq)))
        return out

    async def release(self, run_id: str, value: str, *, ended: bool = False) -> bool:
        """Drop the lease if it is still ours; `ended` (the run's terminal status is
        committed): its pending cancel request goes too, in the same round trip."""
        keys = [self._keys.lease(run_id)]
        if ended:
            keys.append(self._keys.cancel(run_id))
        return bool(await self._release(keys=keys, args=[value]))

    async def holds(self, run_id: str, value: str) -> bool:
        """Whether `value` is the run's current lease."""
        current = await self._client.get(self._keys.lease(run_id))
        if isinstance(current, bytes):
            current = current.decode()
        return current == value

    async def is_held(self, run_id: str) -> bool:
        """Whether any live lease exists for the run."""
        return bool(await self._client.exists(self._keys.lease(run_id)))
