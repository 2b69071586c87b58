"""Tooling for tests and benchmarks that drive threadrun from outside (like
`celery.contrib.testing`): private sandboxes, clusters of real processes, SSE reading, and
polling. tests/ and bench/ both use it; nothing at runtime imports it.
"""

from shared.tools.devservices import free_port
from shared.tools.testing.cluster import (
    UNLIMITED_USERS,
    Cluster,
    Proc,
    cluster_env,
    settings_env,
    worker_argv,
)
from shared.tools.testing.polling import WaitTimeout, wait_for
from shared.tools.testing.sandbox import (
    Sandbox,
    create_database,
    delete_prefix,
    drop_database,
    server_dsn,
)
from shared.tools.testing.sse import START, SseEvent, iter_sse, open_stream, read_stream

__all__ = [
    "START",
    "UNLIMITED_USERS",
    "Cluster",
    "Proc",
    "Sandbox",
    "SseEvent",
    "WaitTimeout",
    "cluster_env",
    "create_database",
    "delete_prefix",
    "drop_database",
    "free_port",
    "iter_sse",
    "open_stream",
    "read_stream",
    "server_dsn",
    "settings_env",
    "wait_for",
    "worker_argv",
]
