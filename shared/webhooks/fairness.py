"""Fair shares of the webhook workers: attempts in flight per receiver host and per owner.

A delivery thread is held for as long as its receiver takes to answer (up to the timeouts),
so a few slow receivers could hold every thread of the `webhooks` workers and delay every
other user's deliveries. Before an attempt is claimed, it takes a slot under
`webhook_host_concurrency` for its receiver's host and `webhook_user_concurrency` for the
run's owner, in Redis so the caps hold across every webhooks worker; an attempt that finds
either full is not claimed (its count and backoff untouched) but deferred by
`webhook_defer_s`, and the thread serves the next delivery. A slot expires after the
attempt's lease if its worker died holding it.

The slots are sorted sets of expiring members, the same Lua script as the per-user
connection slots (`shared/lua/limit_acquire_connection.lua`).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

import redis

from shared import lua
from shared.redis_keys import LimitKeys

log = logging.getLogger(__name__)


@dataclass
class GateSlots:
    """The slots one attempt holds (released by `DeliveryGate.leave`)."""

    keys: list[str] = field(default_factory=list)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)


class DeliveryGate:
    """Caps on attempts in flight per receiver host and per owner."""

    def __init__(
        self,
        client: redis.Redis,
        keys: LimitKeys,
        *,
        per_host: int,
        per_owner: int,
        ttl_s: float,
    ) -> None:
        self._redis = client
        self._keys = keys
        self._per_host = per_host
        self._per_owner = per_owner
        self._ttl_ms = int(ttl_s * 1000)
        self._acquire = lua.register(client, "limit_acquire_connection")

    def enter(self, host: str, owner: str | None) -> GateSlots | None:
        """The attempt's slots, or None when its host or its owner is at the cap (nothing
        is held then)."""
        slots = GateSlots()
        wanted = [(self._keys.webhook_host(host), self._per_host)]
        if owner:
            wanted.append((self._keys.webhooks(owner), self._per_owner))
        for key, limit in wanted:
            if not self._acquire(keys=[key], args=[limit, slots.token, self._ttl_ms]):
                self.leave(slots)
                return None
            slots.keys.append(key)
        return slots

    def leave(self, slots: GateSlots) -> None:
        """Free the attempt's slots (a failure is logged: they expire after the TTL)."""
        try:
            pipe = self._redis.pipeline(transaction=False)
            for key in slots.keys:
                pipe.zrem(key, slots.token)
            pipe.execute()
        except redis.RedisError:
            log.warning("could not free a webhook attempt's slots; they expire by themselves")
        slots.keys.clear()
