"""Webhooks on real PostgreSQL: the outbox row is written in the run's admission
transaction, an attempt is claimed only once the run has ended, each attempt is recorded
with its audit event, retries wait for their backoff, a delivered row is never sent again,
the reaper's sweep finds ended runs whose dispatch was lost, and a temporary thread waits
for its webhook's body before it is deleted."""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from psycopg_pool import ConnectionPool

from shared.redis_keys import Keys
from shared.retention.removal import ThreadRemover
from shared.runs.model import (
    MultitaskStrategy,
    OnCompletion,
    RunRequest,
    RunStatus,
    ThreadStatus,
)
from shared.runs.store import AdmitItem, RunStore
from shared.runs.webhook_delivery import WebhookService
from shared.webhooks.policy import EgressPolicy
from shared.webhooks.retry import AttemptOutcome, Backoff
from shared.webhooks.sender import AttemptResult, Sender
from shared.webhooks.store import DeliveryState, WebhookStore
from threadrun import webhooks as client_webhooks

OWNER = "alice"
URL = "https://hooks.example.com/in"
SECRET = b"integration-secret"


def request(webhook: str | None = URL, **kw: Any) -> RunRequest:
    return RunRequest(
        thread_id=str(uuid.uuid4()),
        assistant_id="lead_agent",
        create_thread=True,
        webhook=webhook,
        **kw,
    )


def admit(store: RunStore, req: RunRequest) -> str:
    item = AdmitItem(req, str(uuid.uuid4()), "lead_agent", MultitaskStrategy.ENQUEUE)
    admission = store.admit_many(OWNER, [item])[0]
    assert admission.run is not None
    return admission.run.run_id


def end(store: RunStore, run_id: str) -> None:
    claim = store.claim(run_id, "worker-1")
    assert claim.run is not None, claim.outcome
    fin = store.finish(
        run_id,
        claim.run.thread_id,
        claim.run.owner_epoch,
        status=RunStatus.SUCCESS,
        error=None,
        thread_status=ThreadStatus.IDLE,
    )
    assert not fin.fenced


def backdate(pool: ConnectionPool, run_id: str, seconds: float) -> None:
    """Pretend the run ended (and its delivery fell due) `seconds` ago."""
    with pool.connection() as conn:
        conn.execute(
            "UPDATE runs SET ended_at = ended_at - make_interval(secs => %s) WHERE run_id = %s",
            (seconds, run_id),
        )
        conn.execute(
            "UPDATE webhook_deliveries SET next_attempt_at = next_attempt_at"
            " - make_interval(secs => %s) WHERE run_id = %s",
            (seconds, run_id),
        )


class FakeSender(Sender):
    """Answers from a script instead of the network (records what it was given)."""

    def __init__(self, outcomes: list[AttemptResult]) -> None:
        super().__init__(EgressPolicy(), timeout_s=1, max_response_bytes=0)
        self.outcomes = outcomes
        self.sent: list[tuple[str, bytes, Mapping[str, str]]] = []

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> AttemptResult:
        self.sent.append((url, body, dict(headers)))
        return self.outcomes.pop(0)


def service(
    store: RunStore,
    hooks: WebhookStore,
    sender: Sender,
    scheduled: list[tuple[str, float]],
    disabled: str | None = None,
    extra_headers: dict[str, str] | None = None,
) -> WebhookService:
    return WebhookService(
        hooks,
        sender,
        secret=SECRET,
        backoff=Backoff(base_s=2, cap_s=10, retry_after_cap_s=30, max_attempts=3),
        load_run=store.get_run_by_id,
        read_values=lambda run: b'{"messages":["final"]}',
        schedule=lambda run_id, delay: scheduled.append((run_id, delay)),
        lease_s=30,
        disabled=disabled,
        extra_headers=extra_headers,
    )


@pytest.fixture
def hooks(pool: ConnectionPool) -> WebhookStore:
    return WebhookStore(pool)


def test_the_outbox_row_is_written_with_the_run(store: RunStore, hooks: WebhookStore) -> None:
    """Webhooks: inserted at admission, pending; the URL stored with the run; no row for a
    run without a webhook."""
    run_id = admit(store, request())
    delivery = hooks.get(run_id)
    assert delivery is not None
    assert (delivery.state, delivery.attempts, delivery.url) == (DeliveryState.PENDING, 0, URL)
    run = store.get_run_by_id(run_id)
    assert run is not None and run.webhook == URL
    assert hooks.get(admit(store, request(webhook=None))) is None


def test_attempts_wait_for_the_end_then_retry_then_deliver_once(
    store: RunStore, hooks: WebhookStore, pool: ConnectionPool
) -> None:
    """Webhooks: no attempt while the run is inflight; a 500 is retried after the backoff
    (not before), a 200 delivers, a delivered row is never claimed or swept again; each
    attempt is an audit event of the run; every attempt sends the same body, signed."""
    run_id = admit(store, request())
    scheduled: list[tuple[str, float]] = []
    sender = FakeSender(
        [
            AttemptResult(AttemptOutcome.RETRYABLE_STATUS, 0.01, status=500, error="HTTP 500"),
            AttemptResult(AttemptOutcome.DELIVERED, 0.01, status=200),
        ]
    )
    svc = service(store, hooks, sender, scheduled)
    assert svc.deliver(run_id).attempt is None  # pending: nothing to send yet
    end(store, run_id)
    first = svc.deliver(run_id)
    assert (first.attempt, first.outcome) == (1, AttemptOutcome.RETRYABLE_STATUS)
    assert scheduled and scheduled[0][0] == run_id and 1 <= scheduled[0][1] <= 2
    assert svc.deliver(run_id).attempt is None  # the backoff has not passed
    backdate(pool, run_id, 5)
    second = svc.deliver(run_id)
    assert (second.attempt, second.outcome) == (2, AttemptOutcome.DELIVERED)
    delivery = hooks.get(run_id)
    assert delivery is not None and delivery.state is DeliveryState.DELIVERED
    assert delivery.last_status == 200 and delivery.delivered_at is not None
    backdate(pool, run_id, 3600)
    assert svc.deliver(run_id).attempt is None and hooks.sweep(0.1) == []  # never again

    (url1, body1, h1), (_, body2, h2) = sender.sent
    assert url1 == URL and body1 == body2
    doc = orjson.loads(body1)
    assert doc["run_id"] == run_id and doc["status"] == "success"
    assert doc["values"] == {"messages": ["final"]} and doc["kwargs"]["webhook"] == URL
    assert (h1["X-Threadrun-Delivery"], h1["X-Threadrun-Attempt"], h2["X-Threadrun-Attempt"]) == (
        run_id,
        "1",
        "2",
    )
    client_webhooks.verify(SECRET, h2, body2)
    events = [e for e in store.run_events(run_id) if e["type"] == "webhook.attempt"]
    assert [(e["payload"]["attempt"], e["payload"]["will_retry"]) for e in events] == [
        (1, True),
        (2, False),
    ]
    assert events[0]["payload"]["status_code"] == 500
    assert events[0]["payload"]["url_host"] == "hooks.example.com"


def test_disable_webhooks_closes_the_delivery_without_sending(
    store: RunStore, hooks: WebhookStore, pool: ConnectionPool
) -> None:
    """`http.disable_webhooks`: the run ran, nothing is sent, and the delivery is closed
    (failed, with the reason) so that neither a retry nor the sweep sends it later."""
    run_id = admit(store, request())
    end(store, run_id)
    sender = FakeSender([])
    svc = service(
        store, hooks, sender, [], disabled="webhooks are disabled by http.disable_webhooks"
    )
    assert svc.deliver(run_id).attempt == 1
    delivery = hooks.get(run_id)
    assert delivery is not None and delivery.state is DeliveryState.FAILED
    assert delivery.last_error == "webhooks are disabled by http.disable_webhooks"
    backdate(pool, run_id, 3600)
    assert svc.deliver(run_id).attempt is None and hooks.sweep(0.1) == []
    assert sender.sent == []


def test_the_projects_static_headers_go_with_every_attempt(
    store: RunStore, hooks: WebhookStore
) -> None:
    """`webhooks.headers`: sent with the delivery; a header of threadrun's own (the
    signature) cannot be replaced by one of the project's."""
    run_id = admit(store, request())
    end(store, run_id)
    sender = FakeSender([AttemptResult(AttemptOutcome.DELIVERED, 0.01, status=200)])
    extra = {"X-Token": "t0k", "X-Threadrun-Signature": "forged"}
    assert service(store, hooks, sender, [], extra_headers=extra).deliver(run_id).attempt == 1
    ((_, body, headers),) = sender.sent
    assert headers["X-Token"] == "t0k"
    assert headers["X-Threadrun-Signature"] != "forged"
    client_webhooks.verify(SECRET, headers, body)


def test_a_4xx_fails_at_once_and_max_attempts_ends_it(
    store: RunStore, hooks: WebhookStore, pool: ConnectionPool
) -> None:
    """Webhooks: no retry on other 4xx; retryable failures stop at max_attempts."""
    rejected = admit(store, request())
    end(store, rejected)
    sender = FakeSender([AttemptResult(AttemptOutcome.REJECTED, 0.0, status=404)])
    assert service(store, hooks, sender, []).deliver(rejected).retry_in_s is None
    delivery = hooks.get(rejected)
    assert delivery is not None and delivery.state is DeliveryState.FAILED

    flaky = admit(store, request())
    end(store, flaky)
    timeouts = [AttemptResult(AttemptOutcome.TIMEOUT, 0.0, error="t") for _ in range(3)]
    svc = service(store, hooks, FakeSender(timeouts), [])
    for n in (1, 2, 3):
        backdate(pool, flaky, 60)
        assert svc.deliver(flaky).attempt == n
    delivery = hooks.get(flaky)
    assert delivery is not None and (delivery.state, delivery.attempts) == (
        DeliveryState.FAILED,
        3,
    )


def test_the_sweep_finds_ended_runs_whose_dispatch_was_lost(
    store: RunStore, hooks: WebhookStore, pool: ConnectionPool
) -> None:
    """Webhooks: a run that ended and whose delivery was never attempted (the worker died
    between its terminal commit and its dispatch) is swept — after `stale_s`, once per
    `stale_s`; an inflight run's delivery is not."""
    inflight = admit(store, request())
    ended = admit(store, request())
    end(store, ended)
    swept = hooks.sweep(30)
    assert ended not in swept and inflight not in swept  # the dispatch has its chance first
    backdate(pool, ended, 60)
    assert ended in hooks.sweep(30)
    assert ended not in hooks.sweep(30)  # dispatched just now
    assert inflight not in hooks.sweep(0.001)


def test_a_temporary_thread_waits_for_the_webhook_body(
    store: RunStore, hooks: WebhookStore, tmp_path: Path, rclient: redis.Redis, redis_prefix: str
) -> None:
    """Webhooks: a run without a thread (on_completion=delete) keeps its thread until the
    delivery has read the final values into its body; then the thread may go, and the
    delivery (its body frozen) still goes out."""
    remover = ThreadRemover(store, rclient, Keys(redis_prefix), tmp_path)
    req = request(on_completion=OnCompletion.DELETE)
    run_id = admit(store, req)
    end(store, run_id)
    assert not remover.delete_temporary(req.thread_id)
    sender = FakeSender(
        [
            AttemptResult(AttemptOutcome.CONNECTION_ERROR, 0.0, error="refused"),
            AttemptResult(AttemptOutcome.DELIVERED, 0.0, status=204),
        ]
    )
    svc = service(store, hooks, sender, [])
    assert svc.deliver(run_id).outcome is AttemptOutcome.CONNECTION_ERROR
    assert remover.delete_temporary(req.thread_id)  # body frozen: it may go
    assert store.get_run_by_id(run_id) is None
    with hooks._pool.connection() as conn:  # the retry is due now
        conn.execute(
            "UPDATE webhook_deliveries SET next_attempt_at = now() WHERE run_id = %s", (run_id,)
        )
    assert svc.deliver(run_id).outcome is AttemptOutcome.DELIVERED
    assert sender.sent[0][1] == sender.sent[1][1]


def test_a_run_deleted_before_its_first_attempt_fails_its_delivery(
    store: RunStore, hooks: WebhookStore
) -> None:
    """Webhooks: the thread deleted by its owner before the body was read: the delivery
    ends `failed` (nothing to send), and is swept no more."""
    req = request()
    run_id = admit(store, req)
    end(store, run_id)
    store.delete_thread(req.thread_id, OWNER)
    assert service(store, hooks, FakeSender([]), []).deliver(run_id).attempt == 1
    delivery = hooks.get(run_id)
    assert delivery is not None and delivery.state is DeliveryState.FAILED
    assert run_id not in hooks.sweep(0.001)


def test_the_generated_secret_is_one_per_deployment(hooks: WebhookStore) -> None:
    """Webhooks: without THREADRUN_WEBHOOK_SECRET every process signs with the same key."""
    assert hooks.deployment_secret() == hooks.deployment_secret()
    assert len(hooks.deployment_secret()) == 64


def test_jitter_is_random_enough() -> None:
    """Webhooks: two deliveries failing together do not come back at the same moment."""
    b = Backoff(base_s=2, cap_s=10, retry_after_cap_s=30, max_attempts=3)
    delays = {round(b.delay(3, random.Random(seed)), 6) for seed in range(20)}
    assert len(delays) > 10
