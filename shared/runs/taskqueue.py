"""The Celery application both sides share: task names, queues and the settings, with reasons.

The web process only *sends* tasks (by name, so `app` never imports `workers`); the
worker process registers them (workers/tasks.py).
"""

from __future__ import annotations

import logging

import redis
from celery import Celery
from kombu.entity import Exchange, Queue
from kombu.transport import redis as kombu_redis

from shared import redis_clients
from shared.redis_keys import Keys
from shared.runs.priority import BACKGROUND, REDISPATCH
from shared.runs.run_queue import NEXT, NEXT_BACKGROUND, RunQueue
from shared.settings import Settings

RUN_TASK = "threadrun.runs.execute"
MEMORY_TASK = "threadrun.memory.extract"
WEBHOOK_TASK = "threadrun.webhooks.deliver"
RUNS_QUEUE = "runs"
BACKGROUND_QUEUE = "runs.background"
"""The messages of background runs (cron firings): a runs worker consumes it with `runs`
by default; a deployment may give it workers of its own at a lower OS priority
(`process_nice`, `make run`'s `background_workers`), so firings never take CPU from a
caller's run."""
RUNS_WORKER_QUEUES = f"{RUNS_QUEUE},{BACKGROUND_QUEUE}"
"""A runs worker's queues unless background runs have workers of their own."""
MEMORY_QUEUE = "memory"
WEBHOOKS_QUEUE = "webhooks"

log = logging.getLogger(__name__)


class _SentinelChannel(kombu_redis.SentinelChannel):
    """kombu's Sentinel channel on the project's Sentinel connections: kombu's own choice,
    redis-py's `SentinelManagedConnection`, can keep an interrupted reply for the next
    command and retries against the old primary (shared/redis_clients.py)."""

    connection_class = redis_clients.SentinelConnection
    # kombu's own Sentinel + TLS class is the same pair of bases as this one.
    connection_class_ssl = redis_clients.SentinelSSLConnection  # type: ignore[assignment]


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's `sentinel://` transport with `_SentinelChannel`."""

    Channel = _SentinelChannel


def make_celery(settings: Settings) -> Celery:
    """A Celery app bound to our Redis, with every choice explained."""
    # With Sentinel: kombu's `sentinel://` transport finds the master (and the new one after
    # a failover), on our connection class (SentinelTransport above); no result backend is
    # used (task_ignore_result below).
    broker, sentinel_options = redis_clients.celery_broker(settings)
    app = Celery("threadrun", broker=broker, set_as_current=False)
    if redis_clients.sentinel_enabled(settings):
        app.conf.broker_transport = f"{__name__}:SentinelTransport"
    app.conf.update(
        # Every key Celery writes carries our prefix, so deployments and test runs that
        # share one Redis never see each other's queues.
        broker_transport_options={
            **sentinel_options,
            "global_keyprefix": Keys(settings.redis_prefix).celery_prefix(),
            # Early acks (below) mean no message is ever "unacked", so the visibility
            # timeout never fires a redelivery of a long run; keep it long anyway.
            "visibility_timeout": 12 * 3600,
        },
        # Each queue on its own exchange and key: a Queue without them gets Celery's
        # defaults (exchange and key `runs`), which bound `memory` to the runs key too,
        # so every run task was copied onto the memory queue and vice versa.
        task_queues=[
            Queue(RUNS_QUEUE, Exchange(RUNS_QUEUE), routing_key=RUNS_QUEUE),
            Queue(BACKGROUND_QUEUE, Exchange(BACKGROUND_QUEUE), routing_key=BACKGROUND_QUEUE),
            Queue(MEMORY_QUEUE, Exchange(MEMORY_QUEUE), routing_key=MEMORY_QUEUE),
            Queue(WEBHOOKS_QUEUE, Exchange(WEBHOOKS_QUEUE), routing_key=WEBHOOKS_QUEUE),
        ],
        task_default_queue=RUNS_QUEUE,
        task_routes={
            RUN_TASK: {"queue": RUNS_QUEUE},
            MEMORY_TASK: {"queue": MEMORY_QUEUE},
            WEBHOOK_TASK: {"queue": WEBHOOKS_QUEUE},
        },
        # Ack on receipt: recovery of a lost run is the reaper's job (leases + Postgres),
        # never broker redelivery, which on Redis can duplicate a still-running task or
        # loop forever with task_reject_on_worker_lost (R4, L3).
        task_acks_late=False,
        # One message reserved per free slot: a busy worker does not hoard runs. Which run a
        # message starts is decided when a slot takes it (shared/runs/run_queue.py).
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        result_backend=None,
        task_serializer="json",
        accept_content=["json"],
        # Task events for Flower and `celery events` (`task_events`): the workers'
        # received/started/succeeded events and the client's "sent" event (one PUBLISH per
        # dispatch, `python -m bench.ops`; ~3 ms of CPU per run at C=50, docs/performance.md).
        # Off by default: Flower sends the workers `enable_events` every 5 s while it runs,
        # so its task views work without every run paying for them.
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
        broker_connection_retry_on_startup=True,
        # A lost broker connection: keep retrying forever (runs in progress keep their
        # leases; nothing is redelivered because nothing is unacked).
        broker_connection_max_retries=None,
        # Runs are bounded by leases and cancel, not by Celery's time limits, which would
        # kill a thread mid-checkpoint; the worker loop enforces its own limits.
        task_time_limit=None,
        task_soft_time_limit=None,
        worker_hijack_root_logger=False,
    )
    return app


class _Sent:
    """What a send returns: the task id only. Nobody reads our tasks' results, and Celery's
    default AsyncResult fetches the app's result backend, a thread-local: under gevent every
    request greenlet built a new (disabled) backend, a fifth of send_task's CPU."""

    __slots__ = ("id", "ignored")

    def __init__(self, id: str) -> None:  # send_task calls result_cls(task_id)
        self.id = id


class Dispatcher:
    """Sends run tasks after their rows are committed (R4)."""

    def __init__(self, celery: Celery, queue: RunQueue) -> None:
        self._celery = celery
        self.queue = queue

    @classmethod
    def of(
        cls, settings: Settings, client: redis.Redis | None = None, celery: Celery | None = None
    ) -> Dispatcher:
        """The deployment's dispatcher: its Celery app (a new one when None), and its run
        queue on `client` (a new client of the data node when None)."""
        client = client if client is not None else redis_clients.sync_client(settings)
        app = celery if celery is not None else make_celery(settings)
        return cls(app, RunQueue(client, Keys(settings.redis_prefix)))

    def _send(self, name: str, run_id: str, queue: str, countdown: float | None = None) -> None:
        self._celery.send_task(
            name,
            args=[run_id],
            queue=queue,
            countdown=countdown,
            ignore_result=True,  # no backend call per send (task_ignore_result is the worker's)
            result_cls=_Sent,
        )

    def dispatch_run(self, run_id: str, priority: int = REDISPATCH) -> None:
        """Queue one run at `priority` (shared/runs/priority.py) and send the message a
        free slot starts it with (shared/runs/run_queue.py): on the background queue when
        the run waits as a background run (a cron firing, also when re-dispatched while
        it waits), else on the runs queue. A run whose message is lost is re-dispatched by
        the reaper."""
        if self.queue.enqueue(run_id, priority).priority >= BACKGROUND[0]:
            self._send(RUN_TASK, NEXT_BACKGROUND, BACKGROUND_QUEUE)
        else:
            self._send(RUN_TASK, NEXT, RUNS_QUEUE)

    def send_next(self) -> None:
        """Send one more message for the best waiting background run (a worker's owed
        one, workers/background_share.py); a failed send is left to the reaper (R4)."""
        try:
            self._send(RUN_TASK, NEXT_BACKGROUND, BACKGROUND_QUEUE)
        except Exception:  # noqa: BLE001 - any broker failure: the reaper re-dispatches
            log.warning("sending an owed run message failed; the reaper will retry")

    def dispatch_later(self, run_id: str, countdown_s: float) -> None:
        """Enqueue the run's execution to start no sooner than `countdown_s` from now (a
        message naming the run: it bypasses the run queue); a failed send is left to the
        reaper (R4), like `dispatch_quietly`."""
        try:
            self._send(RUN_TASK, run_id, RUNS_QUEUE, countdown_s)
        except Exception:  # noqa: BLE001 - any broker failure: the reaper re-dispatches
            log.warning("delayed dispatch failed; the reaper will retry", extra={"run_id": run_id})

    def dispatch_quietly(self, run_id: str, priority: int = REDISPATCH) -> bool:
        """Dispatch after commit; on failure log it and leave the run to the reaper (R4).

        The run row is committed, so a failed send loses nothing: the reaper re-dispatches
        a pending head whose dispatch is older than `dispatch_stale_s`.
        """
        try:
            self.dispatch_run(run_id, priority)
        except Exception:  # any broker failure: the reaper re-dispatches (R4)
            log.exception("dispatch failed; the reaper will retry", extra={"run_id": run_id})
            return False
        return True

    def dispatch_webhook(self, run_id: str, countdown: float | None = None) -> bool:
        """Send the webhook delivery of a run that ended (or its retry after `countdown`
        seconds); on failure log it: the reaper's sweep re-sends overdue deliveries."""
        try:
            self._send(WEBHOOK_TASK, run_id, WEBHOOKS_QUEUE, countdown)
        except Exception:  # any broker failure: the outbox row stays pending
            log.exception("webhook dispatch failed; the sweep will retry", extra={"run_id": run_id})
            return False
        return True


_BINDING_SEP = "\x06\x16"  # kombu's Redis transport: routing_key SEP pattern SEP queue


def drop_stale_bindings(client: redis.Redis, settings: Settings) -> int:
    """Unbind queues that an older release bound to another queue's exchange.

    Releases before the per-queue exchanges above bound `memory` to the `runs` exchange,
    so a Redis that outlived the upgrade keeps copying run tasks onto the memory queue.
    kombu never removes a binding by itself; each worker drops the strays at start.
    Returns how many bindings were removed.
    """
    keys = Keys(settings.redis_prefix)
    removed = 0
    for exchange in (RUNS_QUEUE, BACKGROUND_QUEUE, MEMORY_QUEUE, WEBHOOKS_QUEUE):
        for kind in ("binding", "binding_permanent"):
            key = keys.kombu_bindings(kind, exchange)
            for member in client.smembers(key):
                text = member.decode(errors="replace") if isinstance(member, bytes) else member
                queue = str(text).split(_BINDING_SEP)[-1]
                if queue != exchange:
                    removed += int(client.srem(key, member))
    return removed
