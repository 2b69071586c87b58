"""Real processes: gunicorn web servers and Celery workers on private databases and prefixes
(shared.tools.testing.Cluster), with the suite's API keys and test-sized web processes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from shared.settings import Settings
from shared.tools.testing import Cluster, cluster_env
from tests.conftest import private_settings

API_KEYS = "key-alice:alice,key-bob:bob"
FAST_LEASES = {
    "THREADRUN_LEASE_TTL_S": "3",
    "THREADRUN_LEASE_RENEW_S": "1",
    "THREADRUN_CANCEL_POLL_S": "0.25",
    "THREADRUN_REAPER_INTERVAL_S": "0.5",
    "THREADRUN_DISPATCH_STALE_S": "1",
    "THREADRUN_OPS_PRESENCE_S": "0.5",
}
"""Short leases and a fast reaper, for clusters whose tests kill or freeze owners (whose
presence records go stale in 1.5 s, before their leases)."""
ALICE, BOB = "key-alice", "key-bob"
TEST_WEB = {
    "THREADRUN_WEB_THREADS": "32",
    # The suite's processes share one PostgreSQL (max_connections 100 by default): a test
    # web process needs few connections, and gevent fills a pool in a burst.
    "THREADRUN_DB_POOL_MAX": "6",
}
"""What a test web process gets besides the cluster's environment."""


def e2e_cluster(settings: Settings, logs: Path, env: Mapping[str, str] | None = None) -> Cluster:
    """A cluster on `settings` with the suite's API keys (A4) and test-sized web processes;
    `env` on top. Nothing runs until it is started; leaving its `with` stops everything."""
    full = cluster_env(settings, {"THREADRUN_API_KEYS": API_KEYS, **(env or {})})
    return Cluster(settings, full, logs, web_env=dict(TEST_WEB))


ClusterFactory = Callable[..., AbstractContextManager[Cluster]]
"""`with private_cluster(name, env) as c:` (see the fixture)."""


@pytest.fixture(scope="session")
def private_cluster(
    settings: Settings,
    redis_url: str,
    template_database: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> ClusterFactory:
    """Makes `e2e_cluster`s on a database and prefix of their own (a reaper would take over
    the runs of another cluster on its database), logs in a temporary `<name>-logs`; leaving
    the `with` stops the processes and removes the database and keys."""

    @contextmanager
    def make(name: str, env: Mapping[str, str] | None = None) -> Iterator[Cluster]:
        logs = tmp_path_factory.mktemp(f"{name}-logs")
        with (
            private_settings(settings, redis_url, template_database) as s,
            e2e_cluster(s, logs, env) as c,
        ):
            yield c

    return make


GRAPHS = Path(__file__).resolve().parents[1] / "graphs" / "langgraph.json"
"""The test graphs (the lead agent and the approval graph) as THREADRUN_CONFIG."""


@pytest.fixture(scope="session")
def graphs_cluster(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """A web process and a runs worker serving the test graphs (GRAPHS), on a database and
    prefix of their own, shared by the modules that drive them: each works on threads,
    assistants, crons and store items of its own, found by their ids or metadata."""
    with private_cluster("graphs", {"THREADRUN_CONFIG": str(GRAPHS)}) as c:
        yield c.start()


@pytest.fixture(scope="session")
def cluster(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One web process and one runs worker (session-wide)."""
    with e2e_cluster(settings, tmp_path_factory.mktemp("e2e-logs")) as c:
        c.side_by_side(c.start_web, c.start_worker)
        yield c


def run_sdk(fn: Callable[[LangGraphClient], Awaitable[Any]], url: str, key: str = ALICE) -> Any:
    """Run an async scenario with a fresh official SDK client (closed afterwards)."""

    async def go() -> Any:
        client = get_client(url=url, api_key=key)
        try:
            return await fn(client)
        finally:
            await client.http.client.aclose()

    return asyncio.run(go())


def human(text: str) -> dict[str, Any]:
    """A run input with one user message."""
    return {"messages": [{"role": "user", "content": text}]}
