"""One `MemoryManager` per process and configuration, built on first use.

The lead agent graph is built at import, before any connection may be opened, so its
middlewares ask for the manager lazily; the web app, the memory worker and the runs
worker each get one pool and one Redis client for memory.
"""

from __future__ import annotations

import importlib
import threading

import redis

from shared import redis_clients
from shared.db import make_pool
from shared.memory.base import FailurePolicy, MemoryBackend
from shared.memory.manager import MemoryManager
from shared.memory.postgres import PostgresMemoryBackend
from shared.memory.queue import MemoryQueue
from shared.settings import Settings

_managers: dict[tuple[str, str, str, str], MemoryManager] = {}
_lock = threading.Lock()


def make_backend(settings: Settings) -> MemoryBackend:
    """The backend `settings.memory_backend` names (M1)."""
    spec = settings.memory_backend
    if spec == "postgres":
        pool = make_pool(settings, name="memory", max_size=settings.memory_db_pool_max)
        return PostgresMemoryBackend(
            pool, owns_pool=True, failure_policy=FailurePolicy(read=settings.memory_read_policy)
        )
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(
            f"memory_backend must be 'postgres' or 'package.module:factory', got {spec!r}"
        )
    factory = getattr(importlib.import_module(module), attr)
    backend: MemoryBackend = factory(settings)
    return backend


def make_queue(settings: Settings, client: redis.Redis) -> MemoryQueue:
    """The memory queue with the settings' debounce, backlog and lease numbers."""
    return MemoryQueue(
        client,
        settings.redis_prefix,
        debounce_s=settings.memory_debounce_s,
        max_wait_s=settings.memory_max_wait_s,
        backlog_limit=settings.memory_backlog_limit,
        claim_ttl_s=settings.memory_claim_ttl_s,
        max_attempts=settings.memory_max_attempts,
    )


def build_manager(settings: Settings) -> MemoryManager:
    """A new manager with its own pool and Redis client."""
    # No command retries: a retried admission (RPUSH) whose reply was lost would admit the
    # update twice (shared/redis_clients.py).
    client = redis_clients.sync_client(
        settings, retry_commands=False, socket_timeout=10, socket_connect_timeout=5
    )
    return MemoryManager(
        make_backend(settings),
        make_queue(settings, client),
        max_facts=settings.memory_max_facts,
        max_messages=settings.memory_max_messages,
        known_facts=settings.memory_known_facts,
    )


def memory_manager(settings: Settings) -> MemoryManager:
    """The process's manager for this database, Redis and prefix (thread-safe)."""
    key = (settings.dsn, settings.redis_url, settings.redis_prefix, settings.memory_backend)
    with _lock:
        manager = _managers.get(key)
        if manager is None:
            manager = build_manager(settings)
            _managers[key] = manager
        return manager


def close_managers() -> None:
    """Close every manager of the process (shutdown, tests)."""
    with _lock:
        for manager in _managers.values():
            manager.backend.close()
            manager.queue.redis.close()
        _managers.clear()
