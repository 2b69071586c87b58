"""The worker's Celery app: the shared configuration plus our tasks and lifecycle signals."""

from __future__ import annotations

import logging

import redis
from celery import signals

from shared import gc_tuning, logs, metrics, redis_clients
from shared.agent.providers import preflight
from shared.errors import ConfigError
from shared.ops.presence import PresenceWriter, presence_record
from shared.process_nice import lower_priority
from shared.project import activate
from shared.redis_keys import Keys
from shared.runs.taskqueue import (
    BACKGROUND_QUEUE,
    RUNS_QUEUE,
    drop_stale_bindings,
    make_celery,
)
from shared.settings import Settings

celery = make_celery(Settings())
celery.conf.include = ["workers.tasks", "workers.memory_tasks", "workers.webhook_tasks"]
logs.configure_celery(Settings())  # log_format=json: Celery leaves logging to shared/logs.py

log = logging.getLogger(__name__)


@signals.worker_init.connect
def _on_init(**_: object) -> None:
    """Multi-process metrics for this worker (shared/metrics.py); stray queue bindings of an
    older release dropped before consuming (shared/runs/taskqueue.py)."""
    settings = Settings()
    try:  # the project file (shared/project.py), its `env` before any graph imports
        activate(settings.config)
    except ConfigError as exc:
        log.critical("cannot start: %s", exc)
        raise SystemExit(f"threadrun worker: {exc}") from None
    # A worker started by itself (compose, k8s) refuses to start, like `make run` does,
    # when a configured provider's package or key is missing: never a silent pending run.
    if problems := preflight(settings):
        for problem in problems:
            log.critical("cannot start: %s", problem)
        raise SystemExit(f"threadrun worker: {'; '.join(problems)}")
    metrics.configure_worker(settings)
    lower_priority(settings.process_nice)  # before the pool and the loop start their threads
    client = redis_clients.sync_client(settings)
    try:
        if removed := drop_stale_bindings(client, settings):
            log.warning("removed %d stale queue binding(s) of an older release", removed)
    except redis.RedisError as exc:  # the broker connection reports an unreachable Redis
        log.warning("could not check queue bindings: %s", exc)
    finally:
        client.close()


@signals.worker_ready.connect
def _on_ready(sender: object = None, **_: object) -> None:
    """Build the runtime eagerly on the runs queues and start the reaper on `runs`."""
    from workers.runtime import get_runtime
    from workers.tasks import start_runs_services

    # worker_ready's sender is the worker's Consumer (it has the task consumer itself).
    consumer = sender if hasattr(sender, "task_consumer") else getattr(sender, "consumer", None)
    task_consumer = getattr(consumer, "task_consumer", None)
    queues = {q.name for q in task_consumer.queues} if task_consumer else set()
    _start_presence(consumer, queues)
    if not queues or RUNS_QUEUE in queues:
        start_runs_services()
    elif BACKGROUND_QUEUE in queues:  # a background worker: its runtime, not the reaper
        get_runtime().background.callers_here = False
    # Start-up is done (the runs runtime and its graphs are built): freeze that heap and
    # collect young objects less often (shared/gc_tuning.py).
    gc_tuning.settle(Settings().gc_threshold0)


@signals.worker_shutting_down.connect
def _on_shutting_down(**_: object) -> None:
    """R7: stop taking runs, hand owned runs back after a grace period."""
    from workers.tasks import shutdown_runs

    shutdown_runs()


_presence: list[PresenceWriter] = []
"""This process's presence writer (shared/ops/presence.py), once the worker is ready."""


def _start_presence(consumer: object, queues: set[str]) -> None:
    """Record this worker in Redis every `ops_presence_s`, for the ops view."""
    name = getattr(consumer, "hostname", None)
    if not isinstance(name, str) or _presence:
        return
    settings = Settings()
    pool = getattr(getattr(consumer, "controller", None), "concurrency", None)
    writer = PresenceWriter(
        redis_clients.sync_client(settings),
        Keys(settings.redis_prefix),
        presence_record(name, sorted(queues), pool if isinstance(pool, int) else None),
        settings.ops_presence_s,
    )
    writer.start()
    _presence.append(writer)


@signals.worker_shutdown.connect
def _on_shutdown(**_: object) -> None:
    """The worker has stopped (its runs handed back): its presence record goes at once."""
    while _presence:
        writer = _presence.pop()
        writer.stop()
        writer.client.close()
