"""The `memory` queue (SPEC M4): a drain loop that leases due buckets, and the extraction task.

The drain loop runs in every memory worker (`make run` starts one); claims are atomic
in Redis, so several loops never take the same bucket. Each pass first re-leases the
batches whose lease ran out (a worker died or hung mid-batch), then claims due
buckets, and sends one extraction task per batch token. Messages are acked early like
every task here: a lost message is found again by its expired lease, not redelivered
by the broker (see shared/memory/queue.py).
"""

from __future__ import annotations

import logging
import re
import threading
from functools import cache

from celery import signals
from langchain_core.language_models import BaseChatModel

from shared.agent.model import make_model
from shared.memory.services import memory_manager
from shared.runs.taskqueue import MEMORY_QUEUE, MEMORY_TASK
from shared.settings import Settings
from workers.celery_app import celery

log = logging.getLogger(__name__)
_TOKEN = re.compile(r"[0-9a-f]{32}")


@cache
def _settings() -> Settings:
    return Settings()


@cache
def extraction_model() -> BaseChatModel:
    """`memory_model`, else the run model (M4); one per process."""
    s = _settings()
    return (
        make_model(s.model_copy(update={"model": s.memory_model}))
        if s.memory_model
        else make_model(s)
    )


@celery.task(name=MEMORY_TASK, ignore_result=True)
def extract(token: str) -> str:
    """Extract and store one leased batch; on failure it stays leased and is re-sent later."""
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        log.error("ignoring memory task with a malformed token: %r", token)
        return "malformed"
    try:
        stored = memory_manager(_settings()).process(token, extraction_model())
    except Exception:  # the lease brings the batch back
        log.exception("memory batch %s failed; retried when its lease runs out", token)
        return "failed"
    return f"stored {stored}"


class MemoryDrain:
    """The loop that turns due buckets and expired leases into extraction tasks."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-drain", daemon=True)

    def start(self) -> None:
        """Start the loop thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop after the current pass."""
        self._stop.set()
        self._thread.join(timeout=5)

    def drain_once(self) -> int:
        """One pass: re-lease expired batches, claim due buckets, send their tasks."""
        queue = memory_manager(self.settings).queue
        batch = self.settings.memory_drain_batch
        tokens = queue.reclaim_expired(batch) + queue.claim_due(batch)
        for token in tokens:
            celery.send_task(MEMORY_TASK, args=[token], queue=MEMORY_QUEUE)
        return len(tokens)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sent = self.drain_once()
                if sent:
                    log.info("memory drain: %d batches sent", sent)
            except Exception:  # Redis hiccup: try again next pass
                log.exception("memory drain pass failed")
            self._stop.wait(self.settings.memory_drain_interval_s)


_drain: MemoryDrain | None = None


@signals.worker_ready.connect
def _start_drain(sender: object = None, **_: object) -> None:
    """Start the drain loop on workers that consume the memory queue."""
    global _drain
    # The sender is the worker's Consumer; its task consumer lists the queues of -Q.
    task_consumer = getattr(sender, "task_consumer", None)
    queues = {q.name for q in task_consumer.queues} if task_consumer is not None else set()
    if MEMORY_QUEUE in queues and _drain is None:
        _drain = MemoryDrain(_settings())
        _drain.start()
        log.info("memory drain started")


@signals.worker_shutting_down.connect
def _stop_drain(**_: object) -> None:
    if _drain is not None:
        _drain.stop()
