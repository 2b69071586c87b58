"""Semantic search (`query`) through the official SDK, with an embeddings index configured.

The index needs pgvector, which the machine's PostgreSQL may lack: this cluster runs on an
embedded PostgreSQL from the `pgserver` wheel (a dev dependency, which ships pgvector), with
the deterministic `embed` of tests/e2e/store_graph.py configured as `store.index.embed`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from langgraph_sdk.client import LangGraphClient
from pydantic import SecretStr

from shared.settings import Settings
from shared.tools import devservices as ds
from shared.tools.testing import Cluster, Sandbox
from tests.e2e.conftest import ALICE, BOB, e2e_cluster
from tests.e2e.store_graph import DIMS
from tests.e2e.test_store_e2e import GRAPH_FILE, run, store_config

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def semantic_cluster(
    settings: Settings, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Web and worker on an embedded PostgreSQL with pgvector and a store index."""
    # Outside pytest's 0700 tmp tree: postgres may run as another user (see devservices).
    data = Path(tempfile.mkdtemp(prefix="threadrun-semantic-"))
    server = ds.EmbeddedPostgres(data)
    server.start()
    try:
        index = {"dims": DIMS, "embed": f"{GRAPH_FILE}:embed", "fields": ["text"]}
        config = store_config(tmp_path_factory.mktemp("semantic-config"), {"index": index})
        base = settings.model_copy(
            update={
                "database_url": SecretStr(ds.with_database(server.url, "postgres")),
                "redis_url": redis_url,
                "config": config,
            }
        )
        with Sandbox(base, "t") as s:
            env = {"THREADRUN_CONFIG": str(config)}
            with e2e_cluster(s, tmp_path_factory.mktemp("semantic-logs"), env) as c:
                c.start_web()
                c.start_worker()
                yield c
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


def test_query_ranks_by_meaning_within_the_callers_items(semantic_cluster: Cluster) -> None:
    """`query` orders the caller's items by similarity (with a score), combines with prefix
    and filter, skips items put with `index=False`, and never shows another user's items."""

    async def alice(c: LangGraphClient) -> None:
        docs = {"pets": "cat dog", "transit": "car bus train", "colours": "red blue fish"}
        for key, text in docs.items():
            await c.store.put_item(["docs"], key=key, value={"text": text, "kind": key})
        await c.store.put_item(["docs"], key="hidden", value={"text": "bus bus"}, index=False)
        found = (await c.store.search_items(["docs"], query="train bus", limit=3))["items"]
        assert [x["key"] for x in found][0] == "transit"
        assert "hidden" not in [x["key"] for x in found]
        scores = [float(x["score"] or 0) for x in found]
        assert all(isinstance(x["score"], float) for x in found)
        assert scores == sorted(scores, reverse=True)
        pets = await c.store.search_items(["docs"], query="dog", filter={"kind": "pets"})
        assert [x["key"] for x in pets["items"]] == ["pets"]
        plain = (await c.store.search_items(["docs"], limit=10))["items"]
        assert {x["key"] for x in plain} == {*docs, "hidden"}

    async def bob(c: LangGraphClient) -> None:
        await c.store.put_item(["docs"], key="bobs", value={"text": "train"})
        found = (await c.store.search_items(["docs"], query="train bus", limit=10))["items"]
        assert [x["key"] for x in found] == ["bobs"]

    url = semantic_cluster.url
    run(alice, url)
    run(bob, url, BOB)


def test_a_graph_runs_writes_are_indexed(semantic_cluster: Cluster) -> None:
    """The workers' store embeds what a run writes: its note is found by meaning."""

    async def scenario(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        await c.runs.wait(tid, "store_writer", input={"note": "fish fish"})
        found = (await c.store.search_items(["memories"], query="fish", limit=1))["items"]
        assert found and found[0]["value"] == {"text": "fish fish"}

    run(scenario, semantic_cluster.url, ALICE)
