"""The per-user limits on admitting runs (A3, A4): `runs_per_minute` and `max_active_runs`.

One home for every way a run is admitted: the HTTP routes and the WebSocket's `run.create`
(through app/admission.py, which decides whether the caller is throttled at all) and the
cron scheduler's firings (shared/crons/manager.py, as the cron's owner). The counters live
in Redis so they hold across processes; they are small Lua scripts (`shared/lua/limit_*`)
rather than a rate-limit library: the active runs are a set of expiring reservations bound
to run ids, which fixed or moving windows do not model.

A reservation is taken before the admission's transaction and bound to the run id after it
committed (`RunSlot.bind`), or released when it failed; a process that dies in between
leaves a reservation that expires after `limit_slot_ttl_s`. A run leaves the set when it
ends (`RunManager.release_active`: finalize, the cancel of a pending run, the reaper); as a
safety net, a full set is pruned of members whose run has ended and tried once more.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass

import redis

from shared import lua
from shared.errors import LimitExceeded
from shared.redis_keys import ACTIVE_SET_TTL_MS, LimitKeys
from shared.settings import Settings

EndedAmong = Callable[[Collection[str]], Collection[str]]
"""Those of the given run ids that have ended or are gone (`RunManager.ended_among`)."""


@dataclass
class RunSlot:
    """A reserved active-run slot; `bind` it to the admitted run or `release` it."""

    limits: RunLimits | None
    user_id: str
    token: str
    done: bool = False
    position: int = 0
    """How many runs (and admissions in flight) the user held when this slot was taken:
    what fair dispatch orders by (shared/runs/priority.py)."""

    def bind(self, run_id: str) -> None:
        """The admission succeeded: the slot now counts this run until it ends."""
        if not self.done and self.limits is not None:
            self.limits.bind(self, run_id)
        self.done = True

    def release(self) -> None:
        """The admission failed: free the reservation."""
        if not self.done and self.limits is not None:
            self.limits.release(self)
        self.done = True


def unlimited_slot(user_id: str) -> RunSlot:
    """The slot of a caller no limit applies to: bind and release do nothing."""
    return RunSlot(None, user_id, "", done=True)


class RunLimits:
    """`runs_per_minute` and `max_active_runs` per user, in Redis."""

    def __init__(self, client: redis.Redis, settings: Settings, ended_among: EndedAmong) -> None:
        self.redis = client
        self.settings = settings
        self.keys = LimitKeys(settings.redis_prefix)
        self._ended_among = ended_among
        self._rate = lua.register(client, "limit_rate")
        self._reserve = lua.register(client, "limit_reserve_run")
        self._bind = lua.register(client, "limit_bind_run")

    def check_rate(self, user_id: str, runs: int = 1) -> None:
        """`runs_per_minute` per user (GCRA: a burst of the full minute, then steady); a batch
        of `runs` conforms as a whole or is refused without counting (429)."""
        self.gcra(
            self.keys.rate(user_id),
            "runs_per_minute",
            self.settings.runs_per_minute,
            "runs per minute",
            runs,
        )

    def gcra(self, key: str, name: str, limit: int, what: str, n: int = 1) -> None:
        """`limit` per minute on `key` (GCRA: a burst of the full minute, then steady); `n`
        at once conform as a whole or are refused without counting."""
        interval = 60_000 / limit
        allowed, wait_ms = self._rate(keys=[key], args=[interval, interval * (limit - 1), n])
        if not allowed:
            raise LimitExceeded(
                name,
                f"at most {limit} {what} per user",
                retry_after=max(1, math.ceil(int(wait_ms) / 1000)),
            )

    def reserve(self, user_id: str) -> RunSlot:
        """A slot under `max_active_runs` (pending + running runs of the user), or 429."""
        limit = self.settings.max_active_runs
        token = f"r:{uuid.uuid4().hex}"
        keys = [self.keys.active(user_id), self.keys.reserved(user_id)]
        args: list[str | int] = [limit, token, int(self.settings.limit_slot_ttl_s * 1000)]
        for attempt in range(2):
            out = self._reserve(keys=keys, args=args)
            if int(out[0]) == 1:
                return RunSlot(self, user_id, token, position=int(out[1]) if len(out) > 1 else 0)
            if attempt == 0:
                members = [x.decode() if isinstance(x, bytes) else str(x) for x in out[1:]]
                ended = list(self._ended_among(members))
                if not ended:
                    break
                self.redis.zrem(keys[0], *ended)
        raise LimitExceeded(
            "max_active_runs",
            f"at most {limit} pending or running runs per user",
            retry_after=self.settings.active_runs_retry_after_s,
        )

    def bind(self, slot: RunSlot, run_id: str) -> None:
        """The reservation becomes the run's membership of the user's active set."""
        k = self.keys
        self._bind(
            keys=[k.active(slot.user_id), k.reserved(slot.user_id), k.ended(slot.user_id)],
            args=[slot.token, run_id, ACTIVE_SET_TTL_MS],
        )

    def release(self, slot: RunSlot) -> None:
        """Free a reservation that no run took."""
        self.redis.zrem(self.keys.reserved(slot.user_id), slot.token)
