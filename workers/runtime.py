"""The per-process worker runtime: one asyncio loop thread shared by every run of the process.

Celery's `threads` pool gives each run task a thread; the thread submits the run's
coroutine to this loop and waits. Runs are I/O bound (model calls, Redis, Postgres),
so one loop serves many of them, with one async Postgres pool for the checkpointer and
one Redis client, instead of a loop and a pool per task. The lease keeper of the
process's runs (workers/lease_keeper.py) lives and dies with the runtime: it is started
with the loop and stopped at close.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import threading
import uuid
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from langgraph.pregel import Pregel

from shared import lua, redis_clients
from shared.agent.graphs import GraphRegistry
from shared.bridge.publisher import PublishBatcher, StreamPublisher
from shared.db import make_async_pool, make_pool
from shared.journal import RunEventStore
from shared.redis_keys import Keys
from shared.runs.leases import LeaseManager
from shared.runs.store import RunStore
from shared.runs.taskqueue import Dispatcher, make_celery
from shared.settings import Settings
from shared.state.accessor import CheckpointStateAccessor
from shared.state.modes import ensure_recorded_mode
from shared.state.savers import FencedPostgresSaver
from shared.store import WorkerStore
from shared.webhooks.store import WebhookStore
from workers.attempts import RunAttempt
from workers.lease_keeper import LeaseKeeper

log = logging.getLogger(__name__)
T = TypeVar("T")


class WorkerRuntime:
    """Everything a run needs, built once per worker process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.keys = Keys(settings.redis_prefix)
        self.registry = GraphRegistry.from_config(settings.config)
        # Store calls run in the loop's default executor (asyncio.to_thread: min(32, cores + 4)
        # threads), so that bounds the connections in use; a run's background journal write
        # may hold one beside its store call. Capped by db_pool_max, so one worker at the
        # default concurrency cannot take a default PostgreSQL's 100 connections.
        pool = make_pool(
            settings,
            name="worker-store",
            max_size=min(2 * settings.worker_concurrency + 2, settings.db_pool_max),
        )
        with pool.connection() as conn:
            ensure_recorded_mode(conn, settings)  # S4: refuse to start in another mode
        self.store = RunStore(pool)
        self.webhooks = WebhookStore(pool)  # the reaper's sweep of the webhook outbox
        self.events = RunEventStore(
            pool,
            max_payload_bytes=settings.event_payload_max_bytes,
            page_size=settings.event_page_size,
            page_size_max=settings.event_page_size_max,
            fence_idle_timeout_s=settings.fence_idle_timeout_s,
        )
        self.dispatcher = Dispatcher(make_celery(settings))
        self._graphs: dict[tuple[str, int], Pregel[Any, Any, Any, Any]] = {}
        self._slot = 0
        # uvloop: the loop's own overhead per event is a large share of a run's CPU
        # (measured with py-spy under the C=50 benchmark); fall back to asyncio.
        try:
            import uvloop

            self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop is a dependency
            self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="threadrun-loop", daemon=True
        )
        self._thread.start()
        self.submit(self._setup()).result(timeout=60)

    async def _setup(self) -> None:
        s = self.settings
        self.redis = redis_clients.async_client(s, health_check_interval=30)
        self.release_run = lua.register(self.redis, "limit_release_run")  # once per process
        # Every use of this pool goes through a saver, and a saver holds its lock for the
        # whole call: at most `checkpoint_savers` connections are ever in use at once.
        self.apool = await make_async_pool(s, name="worker-saver", max_size=s.checkpoint_savers + 2)
        # AsyncPostgresSaver serialises every call of one instance behind an asyncio
        # lock (needed for a single shared connection, not for a pool): with one saver,
        # 16 concurrent checkpoint writes took 16x one write in `make bench`. A few
        # savers on the same pool let runs checkpoint in parallel.
        self.leases = LeaseManager(self.redis, self.keys, ttl_s=s.lease_ttl_s)
        self.savers = [
            FencedPostgresSaver(
                self.apool, mode=s.checkpoint_mode, idle_timeout_s=s.fence_idle_timeout_s
            )
            for _ in range(s.checkpoint_savers)
        ]
        # S5: the run's head lookup, pre-run rollback point and rollback go through here.
        self.state = CheckpointStateAccessor(self.savers[0], self.registry)
        self.publisher = StreamPublisher(self.redis, self.keys, s)
        # The store graphs get at run time, scoped per run to the run's user.
        self.graph_store = await WorkerStore.open(s)
        self.batcher = PublishBatcher(self.publisher)
        # Renews the leases of the runs this process holds, from their claim on (L1).
        self.keeper = LeaseKeeper(self.leases, s)
        self.keeper.start()
        # Bind every graph to every saver now: the first copy of a graph costs ~150 ms,
        # which would otherwise sit between a claim and the run's first event.
        for graph_id in self.registry.ids():
            for slot in range(len(self.savers)):
                self.graph(graph_id, slot)

    @property
    def active(self) -> Mapping[str, RunAttempt]:
        """The attempts running on this worker, by run id: those whose lease the keeper
        holds, from the claim until their finalization is over."""
        return self.keeper.held

    def graph(self, graph_id: str, slot: int = 0) -> Pregel[Any, Any, Any, Any]:
        """The graph bound to checkpoint saver `slot` of this process (cached)."""
        key = (graph_id, slot % len(self.savers))
        graph = self._graphs.get(key)
        if graph is None:
            graph = self.registry.get(graph_id).copy(update={"checkpointer": self.savers[key[1]]})
            self._graphs[key] = graph
        return graph

    def run_graph(
        self, graph_id: str, slot: int, user_id: str | None
    ) -> Pregel[Any, Any, Any, Any]:
        """The graph of one run: bound to saver `slot`, its store scoped to `user_id` (none
        without a user: the unscoped store is never a graph's). A shallow copy, ~30 µs;
        subgraphs inherit the store through the run's config."""
        store = None if user_id is None else self.graph_store.views.for_user(user_id)
        return self.graph(graph_id, slot).copy(update={"store": store})

    def next_slot(self) -> int:
        """Round-robin choice of a checkpoint saver for a new run attempt."""
        self._slot += 1
        return self._slot

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run a coroutine on the shared loop from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        """Close pools and stop the loop."""

        async def _close() -> None:
            # After the shutdown waited for the held attempts (workers/tasks.py): a lease
            # still held then expires by itself.
            await self.keeper.stop()
            await self.redis.aclose()
            await self.graph_store.close()
            await self.apool.close()

        try:
            self.submit(_close()).result(timeout=10)
        except Exception:  # best effort at exit
            log.exception("runtime close failed")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.store.close()


_runtime: WorkerRuntime | None = None
_runtime_lock = threading.Lock()


def get_runtime(settings: Settings | None = None) -> WorkerRuntime:
    """The process's runtime, built on first use (thread-safe)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = WorkerRuntime(settings or Settings())
        return _runtime


def close_runtime() -> None:
    """Tear the process's runtime down (worker shutdown)."""
    global _runtime
    with _runtime_lock:
        if _runtime is not None:
            _runtime.close()
            _runtime = None
