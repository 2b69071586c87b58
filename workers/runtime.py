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
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel
from langgraph.store.base import BaseStore

from shared import lua, redis_clients
from shared.agent.factories import RUN_ACCESS, server_runtime
from shared.agent.graphs import GraphRegistry
from shared.authz.loader import load_authorizer
from shared.authz.store import AuthorizedStore
from shared.authz.users import stored_user
from shared.bridge.publisher import PublishBatcher, StreamPublisher
from shared.db import make_async_pool, make_pool
from shared.journal import RunEventStore
from shared.ops.worker_history import AsyncWorkerHistory
from shared.project import load_project
from shared.redis_keys import Keys
from shared.retention.removal import ThreadRemover
from shared.runs.leases import LeaseManager
from shared.runs.store import RunStore
from shared.runs.taskqueue import Dispatcher
from shared.settings import Settings
from shared.state.accessor import CheckpointStateAccessor
from shared.state.modes import ensure_recorded_mode
from shared.state.savers import FencedPostgresSaver
from shared.store import WorkerStore
from shared.webhooks.store import WebhookStore
from workers.attempts import RunAttempt
from workers.background_share import BackgroundShare, CallerActivity
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
        # The project's auth (`auth.path`): a graph's store calls go through its store.*
        # handlers as the run's user (shared/authz/store.py).
        self.authorizer = load_authorizer(load_project(settings.config))
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
        # Temporary threads go through the one thread-removal path (its Redis keys on a
        # sync client: it runs in the loop's executor, inside the delete's transaction).
        self._sync_redis = redis_clients.sync_client(settings)
        self.remover = ThreadRemover(
            self.store, self._sync_redis, self.keys, settings.workspace_dir
        )
        self.webhooks = WebhookStore(pool)  # the reaper's sweep of the webhook outbox
        self.events = RunEventStore(
            pool,
            max_payload_bytes=settings.event_payload_max_bytes,
            page_size=settings.event_page_size,
            page_size_max=settings.event_page_size_max,
            fence_idle_timeout_s=settings.fence_idle_timeout_s,
        )
        self.dispatcher = Dispatcher.of(settings, self._sync_redis)
        self.callers = CallerActivity(self._sync_redis, self.keys.callers_busy())
        self.background = BackgroundShare(
            int(settings.worker_background_share * settings.worker_concurrency),
            settings.background_yield_slots,
            self.callers.busy,
        )
        self._graphs: dict[tuple[str, int], Pregel[Any, Any, Any, Any]] = {}
        self.graph_errors: dict[str, str] = {}  # graph id -> why it cannot be loaded
        self._slot = 0
        # uvloop: the loop's own overhead per event is a large share of a run's CPU
        # (measured with py-spy under the C=50 benchmark); fall back to asyncio.
        try:
            import uvloop

            self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop is a dependency
            self.loop = asyncio.new_event_loop()
        # The loop's `asyncio.to_thread` calls (store reads and writes, dispatches, a
        # temporary thread's removal) go to its default executor, which asyncio sizes by
        # the CPUs (6 threads on 2 cores): with `worker_concurrency` runs each making such
        # calls, a run's claim or finalize queued behind 30 others' for seconds
        # (`python -m bench.cron_load`). A thread per slot, and a few for the reaper.
        self.loop.set_default_executor(
            concurrent.futures.ThreadPoolExecutor(
                settings.worker_concurrency + 4, thread_name_prefix="threadrun-io"
            )
        )
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="threadrun-loop", daemon=True
        )
        self._thread.start()
        self.submit(self._setup()).result(timeout=60)

    async def _setup(self) -> None:
        s = self.settings
        self.redis = redis_clients.async_client(s, health_check_interval=30)
        self.release_run = lua.register(self.redis, "limit_release_run")  # once per process
        self.history = AsyncWorkerHistory(s, self.redis)  # the ops view's worker records
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
                self.apool,
                mode=s.checkpoint_mode,
                idle_timeout_s=s.fence_idle_timeout_s,
                snapshot_every=s.checkpoint_snapshot_every,
            )
            for _ in range(s.checkpoint_savers)
        ]
        # S5: the run's head lookup, pre-run rollback point and rollback go through here.
        self.state = CheckpointStateAccessor(self.savers[0], self.registry.reader("threads.read"))
        self.publisher = StreamPublisher(self.redis, self.keys, s)
        # The store graphs get at run time, scoped per run to the run's user.
        self.graph_store = await WorkerStore.open(s)
        self.batcher = PublishBatcher(self.publisher)
        # Renews the leases of the runs this process holds, from their claim on (L1).
        self.keeper = LeaseKeeper(self.leases, s)
        self.keeper.start()
        await self._load_graphs()

    async def _load_graphs(self) -> None:
        """Load every graph, each on its own: one that cannot be loaded is logged once here
        (its id, spec and error) and reported for the ops view (`Keys.ops_graphs`); its
        runs fail with that error, the other graphs are served.

        A graph value is bound to every saver now: the first copy of a graph costs
        ~150 ms, which would otherwise sit between a claim and the run's first event. A
        factory is called per run (as the official server calls it), once here as a
        schema read would to find out whether it fails."""
        report: dict[str, str] = {}
        for graph_id in self.registry.ids():
            source = self.registry.spec(graph_id).source
            error = await asyncio.to_thread(self.registry.check, graph_id)
            if error is not None:
                log.error("graph %r (%s) cannot be loaded: %s", graph_id, source, error)
                self.graph_errors[graph_id] = str(error)
            elif not self.registry.is_factory(graph_id):
                for slot in range(len(self.savers)):
                    self.graph(graph_id, slot)
            state: dict[str, Any] = {"graph_id": graph_id, "spec": source}
            state |= {"state": "error" if error else "ok", "error": str(error) if error else None}
            report[graph_id] = json.dumps({**state, "worker": self.worker_id, "at": time.time()})
        try:
            pipe = self.redis.pipeline(transaction=True)
            pipe.delete(self.keys.ops_graphs())
            if report:
                pipe.hset(self.keys.ops_graphs(), mapping=report)  # type: ignore[arg-type]
            await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - the report is for the ops view only
            log.warning("could not report the graphs' load state: %s", exc)

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

    @asynccontextmanager
    async def run_graph(
        self,
        graph_id: str,
        slot: int,
        user_id: str | None,
        config: Mapping[str, Any] | None = None,
        context: Any = None,
    ) -> AsyncIterator[Pregel[Any, Any, Any, Any]]:
        """The graph of one run, for the `async with` of its execution: bound to saver
        `slot`, its store scoped to `user_id` (none without a user: the unscoped store is
        never a graph's). A graph value's is a shallow copy, ~30 µs; subgraphs inherit the
        store through the run's config. A factory is called with the run's `config` and
        the execution runtime (its user, that store, the run's `context`), and what it
        returns stays entered until the `async with` ends. A graph that cannot be loaded
        raises its GraphConfigError here, on entry."""
        store: BaseStore | None = (
            None if user_id is None else self.graph_store.views.for_user(user_id)
        )
        auth_user = stored_user(
            ((config or {}).get("configurable") or {}).get("langgraph_auth_user")
        )
        if store is not None and self.authorizer is not None and auth_user is not None:
            store = AuthorizedStore(store, self.authorizer, auth_user)
        if not self.registry.is_factory(graph_id):
            yield self.graph(graph_id, slot).copy(update={"store": store})
            return
        run_config = cast(RunnableConfig, dict(config or {}))
        user = (run_config.get("configurable") or {}).get("langgraph_auth_user")
        runtime = server_runtime(
            RUN_ACCESS,
            store=store,
            user=user if hasattr(user, "identity") else None,
            context=context,
        )
        saver = self.savers[slot % len(self.savers)]
        async with self.registry.open(graph_id, run_config, runtime) as graph:
            yield graph.copy(update={"checkpointer": saver, "store": store})

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
        self._sync_redis.close()
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
