"""The `webhooks` queue: one task per delivery attempt of a run's webhook.

Whoever ends a run (a worker's finalize, the web cancelling a pending run, the reaper
failing one) sends `threadrun.webhooks.deliver(run_id)` right after the terminal commit;
a retry is the same task with a countdown; the reaper's sweep re-sends what a dead worker
or a lost message left (shared/webhooks/store.py). The task is thin: the attempt is
`WebhookService.deliver`. Messages are acked early like every task here: the outbox row,
not broker redelivery, is what makes a delivery durable.

The service is built once per process on first use: its own small pool, the checkpoint
accessor (final values, read like a thread object's), one httpx client and the secret.
The process needs no workspace volume: a temporary thread whose run had a webhook is
deleted by the reaper's recovery pass once the body is frozen.
"""

from __future__ import annotations

import logging
import threading
import uuid

from celery import signals

from shared import redis_clients
from shared.agent.graphs import GraphRegistry
from shared.db import make_pool
from shared.project import load_project
from shared.redis_keys import LimitKeys
from shared.runs.model import Run
from shared.runs.store import RunStore
from shared.runs.taskqueue import WEBHOOK_TASK, WEBHOOKS_QUEUE, Dispatcher
from shared.runs.webhook_delivery import WebhookService
from shared.settings import Settings
from shared.state.accessor import CheckpointStateAccessor
from shared.state.modes import ensure_recorded_mode
from shared.webhooks.fairness import DeliveryGate
from shared.webhooks.policy import EgressPolicy
from shared.webhooks.project_rules import project_rules
from shared.webhooks.retry import Backoff
from shared.webhooks.sender import Sender
from shared.webhooks.store import WebhookStore
from workers.celery_app import celery

log = logging.getLogger(__name__)
_lock = threading.Lock()
_service: WebhookService | None = None


def build_service(settings: Settings) -> WebhookService:
    """The process's webhook service (pools and clients opened here)."""
    pool = make_pool(settings, name="webhooks", max_size=min(4, settings.db_pool_max))
    with pool.connection() as conn:
        ensure_recorded_mode(conn, settings)  # S4: read checkpoints only in the recorded mode
    runs = RunStore(pool)
    store = WebhookStore(pool)
    state = CheckpointStateAccessor.for_pool(
        pool,
        GraphRegistry.from_config(settings.config),
        mode=settings.checkpoint_mode,
        snapshot_every=settings.checkpoint_snapshot_every,
    )
    configured = settings.webhook_secret
    if configured is not None and configured.get_secret_value():
        secret = configured.get_secret_value().encode()
    else:
        secret = store.deployment_secret()
        log.warning(
            "THREADRUN_WEBHOOK_SECRET is not set: signing with the deployment's generated"
            " secret (print it with `python -m shared.webhooks secret`)"
        )

    def read_values(run: Run) -> bytes | None:
        head = state.heads({run.thread_id: run.graph_id}).get(run.thread_id)
        return None if head is None else head.values_json

    dispatcher = Dispatcher.of(settings, celery=celery)
    project = load_project(settings.config)
    disabled = (
        f"webhooks are disabled by http.disable_webhooks in {project.path}"
        if project.http.disable_webhooks
        else None
    )
    return WebhookService(
        store,
        Sender(
            EgressPolicy.parse(settings.webhook_allow),
            timeout_s=settings.webhook_timeout_s,
            connect_timeout_s=settings.webhook_connect_timeout_s,
            max_response_bytes=settings.webhook_response_max_bytes,
        ),
        secret=secret,
        backoff=Backoff(
            base_s=settings.webhook_backoff_base_s,
            cap_s=settings.webhook_backoff_cap_s,
            retry_after_cap_s=settings.webhook_retry_after_cap_s,
            max_attempts=settings.webhook_max_attempts,
        ),
        load_run=runs.get_run_by_id,
        read_values=read_values,
        schedule=lambda run_id, delay: dispatcher.dispatch_webhook(run_id, countdown=delay or None),
        # An attempt in flight holds its claim this long; a worker that died mid-attempt
        # frees it then (a timeout's worth of connect, send and read, with a margin).
        lease_s=3 * settings.webhook_timeout_s + 5,
        disabled=disabled,
        extra_headers=project_rules(settings.config).headers,  # langgraph.json `webhooks`
        gate=DeliveryGate(
            redis_clients.sync_client(settings),
            LimitKeys(settings.redis_prefix),
            per_host=settings.webhook_host_concurrency,
            per_owner=settings.webhook_user_concurrency,
            ttl_s=3 * settings.webhook_timeout_s + 5,  # an attempt's lease, as above
        ),
    )


def service() -> WebhookService:
    """The process's service, built on first use."""
    global _service
    with _lock:
        if _service is None:
            _service = build_service(Settings())
        return _service


@signals.worker_ready.connect
def _build_on_ready(sender: object = None, **_: object) -> None:
    """Build the service when the worker consumes `webhooks`, so the first delivery does
    not pay for the pool and the graph registry (about 0.3 s, bench/webhooks.py p99)."""
    task_consumer = getattr(sender, "task_consumer", None)
    queues = {q.name for q in task_consumer.queues} if task_consumer is not None else set()
    if WEBHOOKS_QUEUE in queues:
        try:
            service()
        except Exception:  # the first task builds it (and reports the error) instead
            log.exception("building the webhook service failed")


@celery.task(name=WEBHOOK_TASK, ignore_result=True)
def deliver(run_id: str) -> str:
    """Make the next due attempt of the run's webhook (nothing if none is due)."""
    try:
        uuid.UUID(run_id)
    except (ValueError, TypeError):
        log.error("ignoring webhook task with a malformed id: %r", run_id)
        return "malformed"
    done = service().deliver(run_id)
    if done.attempt is None:
        return "nothing due"
    return f"attempt {done.attempt}: {done.outcome}"
