"""The web process's services, built once per app and reached through `current_services()`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import redis
from flask import current_app

from shared import redis_clients
from shared.agent.graphs import GraphRegistry
from shared.assistants.manager import AssistantManager
from shared.assistants.store import AssistantStore
from shared.bridge.base import StreamItem
from shared.bridge.hub import SubscriptionHub
from shared.bridge.subscriber import StreamSubscriber
from shared.bridge.thread_follow import ThreadFollower
from shared.crons.manager import CronManager
from shared.crons.store import CronStore
from shared.db import make_pool
from shared.journal import RunEventStore
from shared.ops.store import OpsStore
from shared.project import Project, load_project
from shared.redis_keys import Keys
from shared.retention import policy as retention_policy
from shared.runs.limits import RunLimits
from shared.runs.manager import RunManager, webhook_checks
from shared.runs.store import RunStore
from shared.runs.taskqueue import Dispatcher
from shared.settings import Settings
from shared.state.accessor import CheckpointStateAccessor
from shared.state.modes import ensure_recorded_mode
from shared.store import StoreConfig, UserStores, web_stores


@dataclass
class Services:
    """Everything a view needs; no module-level globals hold connections."""

    settings: Settings
    registry: GraphRegistry
    assistants: AssistantManager
    runs: RunManager
    store: RunStore
    subscriber: StreamSubscriber
    state: CheckpointStateAccessor
    redis: redis.Redis
    events: RunEventStore
    items: UserStores  # the store's items (/store/...), per user
    audit: OpsStore  # the audit trail (`ops_audit`): ops actions and thread deletions
    crons: CronManager  # crons; fired by the scheduler (workers/cron_beat.py)
    follower: ThreadFollower  # thread streams (GET /threads/{id}/stream)
    run_limits: RunLimits  # runs_per_minute, max_active_runs (shared with the cron firings)

    @classmethod
    def build(cls, settings: Settings) -> Services:
        """Open pools and clients for this process."""
        pool = make_pool(settings, name="web")
        with pool.connection() as conn:
            ensure_recorded_mode(conn, settings)  # S4: refuse to start in another mode
        # Blocking reads (XREAD BLOCK for one heartbeat) must never hit the socket timeout
        # (redis-py's default is 5 s, equal to the default heartbeat): give them a margin.
        # A bounded pool that waits: under gevent thousands of connections may need Redis at
        # once, and redis-py's default pool fails beyond 100 (MaxConnectionsError).
        client = redis_clients.sync_client(
            settings,
            blocking=True,
            max_connections=settings.web_redis_connections,
            timeout=settings.web_redis_wait_s,
            health_check_interval=30,
            socket_timeout=settings.stream_heartbeat_s + 10,
            socket_connect_timeout=5,
            socket_keepalive=True,
        )
        keys = Keys(settings.redis_prefix)
        registry = GraphRegistry.from_config(settings.config)
        quotas = load_project(settings.config).owner_quotas  # A3: per storage owner
        assistants = AssistantManager(
            AssistantStore(
                pool, max_per_owner=settings.max_assistants_per_user if quotas else None
            ),
            registry,
        )
        assistants.ensure_system()  # each graph's system assistant (idempotent, race-safe)
        store = RunStore(
            pool,
            default_ttl=retention_policy.default_ttl(settings),  # P6
            max_threads_per_user=settings.max_threads_per_user if quotas else None,  # A3
        )
        state = CheckpointStateAccessor.for_pool(
            pool,
            registry.reader("threads.read"),  # a factory sees the access context of a read
            mode=settings.checkpoint_mode,
            values_max_bytes=settings.thread_values_max_bytes,
            snapshot_every=settings.checkpoint_snapshot_every,
        )
        manager = RunManager(
            store,
            Dispatcher.of(settings, client),
            client,
            keys,
            assistants=assistants,
            checkpoints=state,  # a run from an unknown checkpoint is a 404
            default_strategy=settings.default_multitask_strategy,
            max_after_s=settings.run_after_seconds_max,
            **webhook_checks(settings),  # THREADRUN_WEBHOOK_ALLOW, langgraph.json `webhooks`
        )
        hub = SubscriptionHub(
            client,
            linger_s=settings.stream_hub_linger_s,
            reconnect_base_s=settings.redis_retry_base_s,
            reconnect_cap_s=settings.redis_retry_cap_s,
        )
        subscriber = StreamSubscriber(client, keys, settings, hub=hub)
        return cls(
            settings=settings,
            registry=registry,
            assistants=assistants,
            runs=manager,
            store=store,
            subscriber=subscriber,
            state=state,
            redis=client,
            events=RunEventStore(
                pool,
                max_payload_bytes=settings.event_payload_max_bytes,
                page_size=settings.event_page_size,
                page_size_max=settings.event_page_size_max,
            ),
            items=web_stores(
                pool,
                StoreConfig.from_file(settings.config),
                max_item_bytes=settings.max_store_item_bytes,
                max_items=settings.max_store_items_per_user if quotas else None,  # A3
            ),
            audit=OpsStore(pool),
            crons=CronManager(
                CronStore(pool),
                manager,
                max_per_user=settings.cron_max_per_user,
                min_interval_s=settings.cron_min_interval_s,
                batch_size=settings.cron_batch_size,
            ),
            run_limits=RunLimits(client, settings, manager.ended_among),
            follower=ThreadFollower(
                subscriber,
                store,
                client,
                keys,
                heartbeat_s=settings.stream_heartbeat_s,
                poll_s=settings.thread_stream_poll_s,
            ),
        )

    def run_batches(
        self, run_id: str, cursor: str | None, *, admitted: bool = False
    ) -> Iterator[list[StreamItem]]:
        """A run's stream after `cursor`, batch by batch, ended as a run stream ends (its
        `end`, or a gap; an unstarted run's durable end): what every protocol follows."""
        return self.subscriber.subscribe_batches(
            run_id,
            cursor,
            is_terminal=lambda: self.runs.is_terminal(run_id),
            unstarted_end=lambda: self.runs.unstarted_end(run_id),
            admitted=admitted,
        )


def current_services() -> Services:
    """The Services of the current Flask app."""
    return current_app.extensions["threadrun"]  # type: ignore[no-any-return]


def current_project() -> Project:
    """The project file the current Flask app serves, as read at its start (no re-read on
    a hot path: `load_project` stats the file)."""
    return current_app.extensions["threadrun_project"]  # type: ignore[no-any-return]
