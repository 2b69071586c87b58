"""The deployment's store on LangGraph's `PostgresStore`: tables, the web's and the workers' views.

`setup` runs from the migration step (`shared.db.migrate`), never from a web or worker
process, so processes starting together never race on the store's own migrations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from langgraph.store.base import BaseStore
from langgraph.store.postgres import AsyncPostgresStore, PostgresStore
from psycopg import Connection
from psycopg.rows import DictRow

from shared.db import AsyncDictPool, DictPool, make_async_pool
from shared.project import load_project
from shared.settings import Settings
from shared.store.config import StoreConfig
from shared.store.quota import ItemQuota, install_counts
from shared.store.scoped import UserScopedStore


@dataclass(frozen=True)
class UserStores:
    """Hands out per-user views of the deployment's store."""

    open_store: Callable[[], BaseStore]
    semantic: bool
    """Whether search takes a `query` (an embeddings index is configured)."""
    max_item_bytes: int | None = None
    """The JSON size of one item's value a put may have (`max_store_item_bytes`, 413)."""
    quota: ItemQuota | None = None
    """`max_store_items_per_user` (429); None: no quota (off under the project's auth.path,
    whose users share one owner)."""

    def for_user(self, user_id: str) -> UserScopedStore:
        """The store as `user_id` sees it: their namespaces only, without their label."""
        return UserScopedStore(
            self.open_store(), user_id, max_item_bytes=self.max_item_bytes, quota=self.quota
        )


def setup(conn: Connection[DictRow], config: StoreConfig) -> None:
    """Create or upgrade the store's tables (and its vector tables with an index).

    `conn` must be in autocommit: the store's migrations create indexes concurrently.
    """
    PostgresStore(conn, index=config.setup_index()).setup()
    install_counts(conn)


def web_stores(
    pool: DictPool,
    config: StoreConfig,
    *,
    max_item_bytes: int | None = None,
    max_items: int | None = None,
) -> UserStores:
    """Views on the web's sync pool, one `PostgresStore` per call.

    A `PostgresStore` holds an instance lock for the whole of each batch even on a pool
    (langgraph-checkpoint-postgres 3.2), so one shared instance would serialise every store
    request of a web process; an instance costs ~6 µs.
    """
    index, ttl = config.index(), config.ttl()

    def open_store() -> BaseStore:
        return PostgresStore(pool, index=index, ttl=ttl)

    quota = ItemQuota(max_items, pool=pool) if max_items is not None else None
    return UserStores(open_store, config.semantic, max_item_bytes, quota)


@dataclass
class WorkerStore:
    """A worker process's `AsyncPostgresStore` on its own small pool, with its views."""

    pool: AsyncDictPool
    store: AsyncPostgresStore
    views: UserStores

    @classmethod
    async def open(cls, settings: Settings) -> WorkerStore:
        """Build it inside the loop that will use it (the store binds to the running loop)."""
        config = StoreConfig.from_file(settings.config)
        # Nothing held while idle: most runs of most graphs never touch the store.
        pool = await make_async_pool(
            settings, name="worker-graph-store", max_size=settings.store_db_pool_max, min_size=0
        )
        store = AsyncPostgresStore(pool, index=config.index(), ttl=config.ttl())
        if config.section.ttl.sweep_interval_minutes is not None:
            await store.start_ttl_sweeper()
        quota = None
        if load_project(settings.config).owner_quotas:
            quota = ItemQuota(settings.max_store_items_per_user, apool=pool)
        views = UserStores(lambda: store, config.semantic, settings.max_store_item_bytes, quota)
        return cls(pool, store, views)

    async def close(self) -> None:
        """Stop the sweeper and close the pool."""
        await self.store.stop_ttl_sweeper(timeout=5)
        await self.pool.close()
