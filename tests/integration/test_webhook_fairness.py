"""Webhooks, fair shares (shared/webhooks/fairness.py): one user's slow receivers cannot hold
every delivery thread. An attempt takes a slot for its receiver's host and for its run's
owner in Redis before it is claimed; over either share it is not claimed (its attempt count
and backoff untouched) but parked until a slot of that share is handed to it, oldest first,
and another user's delivery to another host goes out at once while the slow ones hang.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from psycopg_pool import ConnectionPool

from shared.redis_keys import LimitKeys
from shared.runs.model import MultitaskStrategy, RunRequest
from shared.runs.store import AdmitItem, RunStore
from shared.runs.webhook_delivery import WebhookService
from shared.settings import Settings
from shared.tools.testing import wait_for
from shared.webhooks.fairness import DeliveryGate, parked
from shared.webhooks.policy import EgressPolicy
from shared.webhooks.retry import AttemptOutcome, Backoff
from shared.webhooks.sender import AttemptResult, Sender
from shared.webhooks.store import WebhookStore
from tests.integration.test_webhooks_outbox import end


class HangingSender(Sender):
    """`slow*` hosts hang until `release` is set; any other host answers 200 at once."""

    def __init__(self) -> None:
        super().__init__(EgressPolicy(), timeout_s=1, max_response_bytes=0)
        self.release = threading.Event()
        self.hanging = 0
        self._lock = threading.Lock()

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> AttemptResult:
        if "//slow" in url:
            with self._lock:
                self.hanging += 1
            self.release.wait(20)
        return AttemptResult(AttemptOutcome.DELIVERED, 0.01, status=200)


@pytest.fixture
def client(settings: Settings) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(settings.redis_url)
    yield c
    c.close()


def service(
    store: RunStore, pool: ConnectionPool, client: redis.Redis, settings: Settings, sender: Sender
) -> tuple[WebhookService, list[tuple[str, float]]]:
    scheduled: list[tuple[str, float]] = []
    gate = DeliveryGate(client, LimitKeys(settings.redis_prefix), per_host=2, per_owner=3, ttl_s=30)
    svc = WebhookService(
        WebhookStore(pool),
        sender,
        secret=b"s",
        backoff=Backoff(base_s=2, cap_s=10, retry_after_cap_s=30, max_attempts=3),
        load_run=store.get_run_by_id,
        read_values=lambda run: b"{}",
        schedule=lambda run_id, delay: scheduled.append((run_id, delay)),
        gate=gate,
    )
    return svc, scheduled


def ended_run(store: RunStore, owner: str, url: str) -> str:
    req = RunRequest(
        thread_id=str(uuid.uuid4()), assistant_id="lead_agent", create_thread=True, webhook=url
    )
    item = AdmitItem(req, str(uuid.uuid4()), "lead_agent", MultitaskStrategy.ENQUEUE)
    run = store.admit_many(owner, [item])[0].run
    assert run is not None
    end(store, run.run_id)
    return run.run_id


def parked_on(client: redis.Redis, key: str) -> list[str]:
    return [m.decode() for m in client.zrange(parked(key), 0, -1)]


def test_a_slow_host_holds_two_threads_and_another_users_delivery_goes_out(
    store: RunStore, pool: ConnectionPool, client: redis.Redis, settings: Settings
) -> None:
    """4 of alice's deliveries to one hanging host: 2 attempts hang, 2 are parked unclaimed
    (attempts 0, nothing scheduled: no polling); bob's delivery to another host is
    delivered while they hang; as each hanging attempt ends, its slot is handed to a parked
    one, sent again at once (delay 0), which then goes out."""
    sender = HangingSender()
    svc, scheduled = service(store, pool, client, settings, sender)
    alice = f"alice-{uuid.uuid4().hex[:6]}"
    slow = [ended_run(store, alice, "https://slow.example/in") for _ in range(4)]
    bob = ended_run(store, f"bob-{uuid.uuid4().hex[:6]}", "https://fast.example/in")
    host = LimitKeys(settings.redis_prefix).webhook_host("slow.example")
    with ThreadPoolExecutor(4) as pool_:
        futures = [pool_.submit(svc.deliver, run_id) for run_id in slow]
        wait_for(
            lambda: sender.hanging == 2 and len(parked_on(client, host)) == 2,
            10,
            what="2 hang, 2 parked",
        )
        waiting = parked_on(client, host)
        assert scheduled == []
        assert all(svc.store.get(r).attempts == 0 for r in waiting)  # type: ignore[union-attr]
        assert svc.deliver(bob).outcome is AttemptOutcome.DELIVERED  # not behind alice's
        sender.release.set()
        done = [f.result(10) for f in futures]
    assert sorted(d.attempt is not None for d in done) == [False, False, True, True]
    assert sorted(scheduled) == sorted((r, 0.0) for r in waiting)
    assert parked_on(client, host) == []
    for run_id in waiting:
        assert svc.deliver(run_id).outcome is AttemptOutcome.DELIVERED
    assert client.zcard(host) == 0


def test_a_freed_slot_goes_to_the_delivery_parked_longest_not_a_newcomer(
    store: RunStore, pool: ConnectionPool, client: redis.Redis, settings: Settings
) -> None:
    """With one slot per host: A in flight, B parked, then C parked behind B. A's end hands
    the slot to B; C, sent again before B arrives, stays parked; B's end hands it to C."""
    sender = HangingSender()
    svc, scheduled = service(store, pool, client, settings, sender)
    svc._gate._per_host = 1  # type: ignore[union-attr]
    owner = f"dave-{uuid.uuid4().hex[:6]}"
    a, b, c = (ended_run(store, owner, "https://slow-one.example/in") for _ in range(3))
    host = LimitKeys(settings.redis_prefix).webhook_host("slow-one.example")
    with ThreadPoolExecutor(1) as pool_:
        fa = pool_.submit(svc.deliver, a)
        wait_for(lambda: sender.hanging == 1, 10, what="A in flight")
        assert svc.deliver(b).attempt is None
        assert svc.deliver(c).attempt is None
        assert parked_on(client, host) == [b, c]
        sender.release.set()
        assert fa.result(10).outcome is AttemptOutcome.DELIVERED
    assert scheduled == [(b, 0.0)]
    assert svc.deliver(c).attempt is None  # the slot is B's
    assert svc.deliver(b).outcome is AttemptOutcome.DELIVERED
    assert scheduled == [(b, 0.0), (c, 0.0)]
    assert svc.deliver(c).outcome is AttemptOutcome.DELIVERED
    assert client.zcard(host) == 0 and parked_on(client, host) == []


def test_one_owner_holds_at_most_its_share_across_hosts(
    store: RunStore, pool: ConnectionPool, client: redis.Redis, settings: Settings
) -> None:
    """An owner's deliveries to 4 different hanging hosts: 3 in flight (its share), the
    fourth parked on the owner's share and handed a slot when one ends; the slots are free
    once every attempt ended."""
    sender = HangingSender()
    svc, scheduled = service(store, pool, client, settings, sender)
    owner = f"carol-{uuid.uuid4().hex[:6]}"
    runs = [ended_run(store, owner, f"https://slow{i}.example/in") for i in range(4)]
    key = LimitKeys(settings.redis_prefix).webhooks(owner)
    with ThreadPoolExecutor(4) as pool_:
        futures = [pool_.submit(svc.deliver, run_id) for run_id in runs]
        wait_for(
            lambda: sender.hanging == 3 and len(parked_on(client, key)) == 1,
            10,
            what="3 hang, 1 parked",
        )
        sender.release.set()
        for f in futures:
            f.result(10)
    assert len(scheduled) == 1
    assert svc.deliver(scheduled[0][0]).outcome is AttemptOutcome.DELIVERED
    assert client.zcard(key) == 0
