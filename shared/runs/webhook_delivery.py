"""`WebhookService.deliver`: one attempt of a run's webhook, from claim to record.

Retries: the outbox, not Celery's `self.retry`. Every attempt is claimed in Postgres and
its result (with `next_attempt_at`) written back before the retry is scheduled, so the
attempt count, the backoff and the outcome are durable and visible; the retry is then
sent as a task with a `countdown` for low latency. Celery's own retry keeps that state in
the message only, and on Redis a message with a countdown waits in the worker's memory
(unacked, redelivered only after `visibility_timeout`, 12 h here) — a worker that dies
would lose or delay the retry. Here a lost countdown message costs at most
`webhook_stale_s` more: the reaper's sweep re-sends overdue deliveries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from shared import metrics, serde
from shared.runs.model import Run
from shared.runs.shapes import run_json
from shared.webhooks.fairness import DeliveryGate
from shared.webhooks.retry import AttemptOutcome, Backoff
from shared.webhooks.sender import AttemptResult, Sender
from shared.webhooks.signing import (
    ATTEMPT_HEADER,
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    signature_header,
)
from shared.webhooks.store import ClaimedAttempt, DeliveryState, WebhookStore

log = logging.getLogger(__name__)

USER_AGENT = "threadrun-webhooks/1"
RunLoader = Callable[[str], Run | None]
ValuesReader = Callable[[Run], bytes | None]
"""The run's thread's head values as encoded JSON (None: no checkpoint)."""


@dataclass(frozen=True, slots=True)
class Delivered:
    """What `deliver` did (the task's log line)."""

    attempt: int | None  # None: nothing claimed (no delivery, not due, in flight, done,
    # or deferred: its host or owner at the cap, back in `retry_in_s`)
    outcome: AttemptOutcome | None = None
    retry_in_s: float | None = None


def webhook_body(run: Run, values_json: bytes | None) -> bytes:
    """The POSTed body: the run as `runs.get` returns it, plus `values`, the thread's
    final values (null for a thread without a checkpoint)."""
    values: Any = orjson.Fragment(values_json) if values_json is not None else None
    return serde.dumps({**run_json(run), "values": values})


class WebhookService:
    """Delivers runs' webhooks; one per worker process (thread-safe)."""

    def __init__(
        self,
        store: WebhookStore,
        sender: Sender,
        *,
        secret: bytes,
        backoff: Backoff,
        load_run: RunLoader,
        read_values: ValuesReader,
        schedule: Callable[[str, float], object],
        after_freeze: Callable[[Run], object] | None = None,
        lease_s: float = 30.0,
        disabled: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        gate: DeliveryGate | None = None,
    ) -> None:
        """`gate`: the caps on attempts in flight per receiver host and per owner
        (shared/webhooks/fairness.py); an attempt over one is parked until a slot is
        handed to it."""
        self.store = store
        self._gate = gate
        self.sender = sender
        self._secret = secret
        self._backoff = backoff
        self._load_run = load_run
        self._read_values = read_values
        self._schedule = schedule
        self._after_freeze = after_freeze
        self._lease_s = lease_s
        self._disabled = disabled  # why no webhook is sent (`http.disable_webhooks`), if so
        self._extra = dict(extra_headers or {})  # langgraph.json `webhooks.headers`

    def deliver(self, run_id: str) -> Delivered:
        """Take the attempt's fair share (host and owner caps), then claim it, freeze the
        body if it is the first, POST, record; over a cap, nothing is claimed and the
        delivery is parked until a slot of that share is handed to it. A delivery a slot
        was handed to (here, or when this attempt frees its own) is sent again at once."""
        if self._gate is None:
            return self._deliver(run_id)
        target = self.store.target(run_id)
        if target is None:
            return Delivered(None)  # nothing pending: what the claim would find
        url, owner = target
        entry = self._gate.enter(_host_of(url), owner, run_id)
        self._wake(entry.woken)
        if entry.slots is None:
            metrics.webhook_delivery("deferred")
            return Delivered(None)
        try:
            return self._deliver(run_id)
        finally:
            self._wake(self._gate.leave(entry.slots))

    def _wake(self, run_ids: list[str]) -> None:
        for woken in run_ids:
            self._schedule(woken, 0.0)

    def _deliver(self, run_id: str) -> Delivered:
        claim = self.store.claim(run_id, self._lease_s)
        if claim is None:
            return Delivered(None)
        if self._disabled is not None:
            # The run ran; its delivery is closed (never retried or re-sent by the sweep),
            # so that a temporary thread waiting for the body can go.
            self.store.record(
                run_id,
                claim.attempt,
                state=DeliveryState.FAILED,
                status=None,
                error=self._disabled,
                delay_s=None,
                event={},
            )
            metrics.webhook_delivery("disabled")
            return Delivered(claim.attempt, AttemptOutcome.REJECTED)
        body = claim.body
        if body is None:
            body = self._freeze(claim)
            if body is None:
                return Delivered(claim.attempt, AttemptOutcome.REJECTED)
        headers = {  # the project's static headers first: ours win on a shared name
            **self._extra,
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            DELIVERY_HEADER: run_id,
            ATTEMPT_HEADER: str(claim.attempt),
            EVENT_HEADER: "run.ended",
            SIGNATURE_HEADER: signature_header(self._secret, body, delivery_id=run_id),
        }
        result = self.sender.post(claim.url, body, headers)
        delay = self._backoff.next_delay(result.outcome, claim.attempt, result.retry_after_s)
        self._record(claim, result, delay)
        if delay is not None:
            self._schedule(run_id, delay)
        return Delivered(claim.attempt, result.outcome, delay)

    def _freeze(self, claim: ClaimedAttempt) -> bytes | None:
        """The first attempt's body, kept for every retry; None (and the delivery failed)
        when the run is gone before its body could be read."""
        run = self._load_run(claim.run_id)
        if run is None or not run.terminal:
            self.store.record(
                claim.run_id,
                claim.attempt,
                state=DeliveryState.FAILED,
                status=None,
                error="the run was deleted before its webhook could be sent",
                delay_s=None,
                event={},
            )
            metrics.webhook_delivery("gone")
            return None
        body = self.store.freeze(claim.run_id, webhook_body(run, self._read_values(run)))
        if self._after_freeze is not None:
            try:
                self._after_freeze(run)  # a temporary thread may go now
            except Exception:  # the recovery pass deletes it later
                log.exception("after-freeze hook failed", extra={"run_id": run.run_id})
        return body

    def _record(self, claim: ClaimedAttempt, result: AttemptResult, delay: float | None) -> None:
        if result.outcome is AttemptOutcome.DELIVERED:
            state = DeliveryState.DELIVERED
        else:
            state = DeliveryState.PENDING if delay is not None else DeliveryState.FAILED
        event = {
            "url_host": _host_of(claim.url),
            "address": result.address,
            "attempt": claim.attempt,
            "outcome": result.outcome,
            "status_code": result.status,
            "error": result.error,
            "duration_ms": round(result.duration_s * 1000, 1),
            "will_retry": delay is not None,
            "retry_in_s": round(delay, 3) if delay is not None else None,
            "state": state,
        }
        if not self.store.record(
            claim.run_id,
            claim.attempt,
            state=state,
            status=result.status,
            error=result.error,
            delay_s=delay,
            event=event,
        ):
            log.warning("webhook attempt result fenced", extra={"run_id": claim.run_id})
        metrics.webhook_delivery(str(result.outcome))
        log.info(
            "webhook attempt %d: %s%s",
            claim.attempt,
            result.outcome,
            f" (retry in {delay:.1f} s)" if delay is not None else "",
            extra={"run_id": claim.run_id, "thread_id": claim.thread_id},
        )


def _host_of(url: str) -> str:
    return urlsplit(url).hostname or ""
