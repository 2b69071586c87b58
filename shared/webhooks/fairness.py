"""Fair shares of the webhook workers: attempts in flight per receiver host and per owner.

A delivery thread is held for as long as its receiver takes to answer (up to the timeouts),
so a few slow receivers could hold every thread of the `webhooks` workers and delay every
other user's deliveries. Before an attempt is claimed, it takes a slot under
`webhook_host_concurrency` for its receiver's host and `webhook_user_concurrency` for the
run's owner, in Redis so the caps hold across every webhooks worker.

An attempt that finds a share full is not claimed (its count and backoff untouched) but
parked on that share, and the thread serves the next delivery. When an attempt of the
share ends, its slot is handed to the delivery parked there longest, which is sent again
at once; newcomers park behind it. Before, a deferred attempt came back every second: a
slow receiver's backlog of thousands of deliveries kept the workers busy re-checking it,
and another user's delivery waited behind them (`python -m bench.cron_load`).

Nothing is lost when a hand-over is (a worker dies between the hand-over and the send, a
slot expires after its attempt's lease because its worker died): the parked delivery is
still pending in PostgreSQL, and the reaper's sweep re-sends it after `webhook_stale_s`.

The slots and the parked deliveries are sorted sets (`shared/lua/webhook_gate_*.lua`).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

import redis

from shared import lua
from shared.redis_keys import LimitKeys

log = logging.getLogger(__name__)


PARKED_TTL_MS = 24 * 3600 * 1000
"""A share's parked deliveries are dropped after a day without a change (the sweep re-sends
what is still pending)."""


@dataclass
class GateSlots:
    """The slots one attempt holds, (key, limit) each (released by `DeliveryGate.leave`)."""

    keys: list[tuple[str, int]] = field(default_factory=list)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class Entry:
    """What `DeliveryGate.enter` gives: the attempt's slots (None: it is parked), and the
    deliveries a free slot was handed to (to send again)."""

    slots: GateSlots | None
    woken: list[str] = field(default_factory=list)


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
        self._enter = lua.register(client, "webhook_gate_enter")
        self._leave = lua.register(client, "webhook_gate_leave")

    def enter(self, host: str, owner: str | None, run_id: str) -> Entry:
        """The attempt's slots for its host and its owner; or, on the first share that is
        full, the run parked there and nothing held."""
        slots, woken = GateSlots(), []
        wanted = [(self._keys.webhook_host(host), self._per_host)]
        if owner:
            wanted.append((self._keys.webhooks(owner), self._per_owner))
        for key, limit in wanted:
            got = self._enter(
                keys=[key, parked(key)],
                args=[limit, slots.token, self._ttl_ms, run_id, PARKED_TTL_MS],
            )
            woken += [_text(w) for w in got[1:]]
            if int(got[0]) != 1:
                return Entry(None, woken + self.leave(slots))
            slots.keys.append((key, limit))
        return Entry(slots, woken)

    def leave(self, slots: GateSlots) -> list[str]:
        """Free the attempt's slots, each handed to the delivery parked there longest;
        returns those (to send again). A failure is logged: the slots expire after the
        TTL, and the sweep re-sends what is parked."""
        woken: list[str] = []
        try:
            for key, limit in slots.keys:
                got = self._leave(keys=[key, parked(key)], args=[slots.token, limit, self._ttl_ms])
                if got:
                    woken.append(_text(got))
        except redis.RedisError:
            log.warning("could not free a webhook attempt's slots; they expire by themselves")
        slots.keys.clear()
        return woken


def parked(key: str) -> str:
    """The parked deliveries of the share whose slots are `key` (same hash tag)."""
    return f"{key}:parked"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
