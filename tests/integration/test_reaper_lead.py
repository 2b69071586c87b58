"""R4, L4 on real Redis: the reaper's leader lock is taken or renewed in one atomic step."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
import redis
import redis.asyncio as aredis

from shared import lua
from shared.redis_keys import Keys
from shared.settings import Settings
from workers.reaper import _lead
from workers.runtime import WorkerRuntime


@dataclass
class _Runtime:
    """The three fields of a WorkerRuntime that `_lead` reads."""

    redis: aredis.Redis
    keys: Keys
    worker_id: str


class _Interleaved(aredis.Redis):
    """A client that runs `between` once, right after its `at`-th command returns."""

    at = 0
    sent = 0
    between: Callable[[], None] = staticmethod(lambda: None)

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        out = await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        self.sent += 1
        if self.sent == self.at:
            self.between()
        return out


@dataclass
class Leader:
    """Calls `_lead` as one worker on a private prefix."""

    settings: Settings
    keys: Keys
    sync: redis.Redis

    def lead(
        self, worker_id: str, ttl_ms: int, at: int = 0, between: Callable[[], None] | None = None
    ) -> bool:
        """`_lead` as `worker_id`; `between` runs after its `at`-th Redis command."""

        async def go() -> bool:
            client = _Interleaved.from_url(self.settings.redis_url)
            assert isinstance(client, _Interleaved)
            client.at = at
            if between is not None:
                client.between = between
            try:
                rt = cast(WorkerRuntime, _Runtime(client, self.keys, worker_id))
                return await _lead(rt, ttl_ms)
            finally:
                await client.aclose()

        return asyncio.run(go())

    def holder(self) -> bytes | None:
        return cast(bytes | None, self.sync.get(self.keys.reaper_leader()))

    def pttl(self) -> int:
        return int(self.sync.pttl(self.keys.reaper_leader()))


@pytest.fixture
def leader(settings: Settings, rclient: redis.Redis) -> Leader:
    """A fresh leader key under the session's private prefix."""
    return Leader(settings, Keys(f"{settings.redis_prefix}lead{uuid.uuid4().hex[:6]}:"), rclient)


def test_r4_lead_is_taken_renewed_and_refused_while_held(leader: Leader) -> None:
    """R4: a free lock is taken; the holder renews it; another worker is refused and
    neither takes nor extends it."""
    assert leader.lead("w-a", 5_000)
    assert leader.holder() == b"w-a"
    assert 0 < leader.pttl() <= 5_000

    assert not leader.lead("w-b", 60_000)
    assert leader.holder() == b"w-a"
    assert leader.pttl() <= 5_000  # B's longer TTL was not applied to A's lock

    leader.sync.pexpire(leader.keys.reaper_leader(), 500)
    assert leader.lead("w-a", 60_000)
    assert leader.holder() == b"w-a"
    assert leader.pttl() > 5_000  # renewed by its holder


def test_l4_lead_is_taken_over_after_the_ttl(leader: Leader) -> None:
    """L4: when the leader stops renewing, another worker leads within one lock TTL."""
    assert leader.lead("w-a", 200)
    assert not leader.lead("w-b", 200)
    time.sleep(0.35)
    assert leader.lead("w-b", 5_000)
    assert leader.holder() == b"w-b"
    assert not leader.lead("w-a", 200)


def test_r4_a_late_renew_never_extends_the_new_leaders_lock(leader: Leader) -> None:
    """R4: A's lock expired and B took it; A's next renew returns False and leaves B's lock
    (value and TTL) alone. With SET NX, GET, PEXPIRE as separate commands, A's PEXPIRE
    could land after B's take-over and extend B's lock on A's behalf."""
    assert leader.lead("w-a", 60_000)
    leader.sync.delete(leader.keys.reaper_leader())  # A's lock expires
    assert leader.lead("w-b", 2_000)
    assert not leader.lead("w-a", 60_000)
    assert leader.holder() == b"w-b"
    assert 0 < leader.pttl() <= 2_000


@pytest.mark.parametrize("at", [1, 2, 3, 4])
def test_r4_no_interleaving_lets_a_stale_leader_extend_the_new_lock(
    leader: Leader, at: int
) -> None:
    """R4: A holds the lock and renews it; A's lock expires and B takes it over right after
    A's `at`-th Redis command. Whatever the point, A never extends B's lock (the old SET NX,
    GET, PEXPIRE sequence did, with the take-over between its GET and its PEXPIRE)."""
    assert leader.lead("w-a", 60_000)
    key = leader.keys.reaper_leader()
    took_over: list[bool] = []

    def b_takes_over() -> None:
        leader.sync.delete(key)  # A's lock expires
        b_lead = lua.register(leader.sync, "reaper_lead")
        took_over.append(bool(b_lead(keys=[key], args=["w-b", 2_000])))

    leader.lead("w-a", 60_000, at=at, between=b_takes_over)
    if took_over:  # A sent at least `at` commands
        assert took_over == [True]
        assert leader.holder() == b"w-b"
        assert 0 < leader.pttl() <= 2_000
