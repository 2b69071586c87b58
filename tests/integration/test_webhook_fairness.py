"""Webhooks, fair shares (shared/webhooks/fairness.py): one user's slow receivers cannot hold
every delivery thread. An attempt takes a slot for its receiver's host and for its run's
owner in Redis before it is claimed; over either share it is not claimed (its attempt count
and backoff untouched) but deferred, and another user's delivery to another host goes out
at once while the slow ones hang.
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
from shared.webhooks.fairness import DeliveryGate
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
        defer_s=0.5,
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


def test_a_slow_host_holds_two_threads_and_another_users_delivery_goes_out(
    store: RunStore, pool: ConnectionPool, client: redis.Redis, settings: Settings
) -> None:
    """4 of alice's deliveries to one hanging host: 2 attempts hang, 2 are deferred
    unclaimed (attempts 0, back in 0.5-1 s); bob's delivery to another host is delivered
    while they hang; once the host answers, the deferred ones go out."""
    sender = HangingSender()
    svc, scheduled = service(store, pool, client, settings, sender)
    alice = f"alice-{uuid.uuid4().hex[:6]}"
    slow = [ended_run(store, alice, "https://slow.example/in") for _ in range(4)]
    bob = ended_run(store, f"bob-{uuid.uuid4().hex[:6]}", "https://fast.example/in")
    with ThreadPoolExecutor(4) as pool_:
        futures = [pool_.submit(svc.deliver, run_id) for run_id in slow]
        wait_for(lambda: sender.hanging == 2 and len(scheduled) == 2, 10, what="2 hang, 2 wait")
        deferred = [run_id for run_id, _ in scheduled]
        assert all(0.5 <= delay <= 1.0 for _, delay in scheduled)
        assert all(svc.store.get(r).attempts == 0 for r in deferred)  # type: ignore[union-attr]
        assert svc.deliver(bob).outcome is AttemptOutcome.DELIVERED  # not behind alice's
        sender.release.set()
        done = [f.result(10) for f in futures]
    assert sorted(d.attempt is not None for d in done) == [False, False, True, True]
    for run_id in deferred:
        assert svc.deliver(run_id).outcome is AttemptOutcome.DELIVERED


def test_one_owner_holds_at_most_its_share_across_hosts(
    store: RunStore, pool: ConnectionPool, client: redis.Redis, settings: Settings
) -> None:
    """An owner's deliveries to 4 different hanging hosts: 3 in flight (its share), the
    fourth deferred; the slots are freed when the attempts end."""
    sender = HangingSender()
    svc, scheduled = service(store, pool, client, settings, sender)
    owner = f"carol-{uuid.uuid4().hex[:6]}"
    runs = [ended_run(store, owner, f"https://slow{i}.example/in") for i in range(4)]
    with ThreadPoolExecutor(4) as pool_:
        futures = [pool_.submit(svc.deliver, run_id) for run_id in runs]
        wait_for(lambda: sender.hanging == 3 and len(scheduled) == 1, 10, what="3 hang, 1 waits")
        sender.release.set()
        for f in futures:
            f.result(10)
    key = LimitKeys(settings.redis_prefix).webhooks(owner)
    assert client.zcard(key) == 0
    assert svc.deliver(scheduled[0][0]).outcome is AttemptOutcome.DELIVERED
