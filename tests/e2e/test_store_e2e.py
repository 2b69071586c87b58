"""The store API through the official langgraph-sdk against real processes: items, search,
namespaces, refusals, isolation between users (A4), and a graph run's writes visible through
the API to its user only.

The cluster serves `store_writer` (tests/e2e/store_graph.py) from a config file of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import psycopg
import pytest
from langgraph_sdk.client import LangGraphClient

from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, BOB, ClusterFactory
from tests.e2e.conftest import run_sdk as run

pytestmark = pytest.mark.e2e

GRAPH_FILE = Path(__file__).with_name("store_graph.py")


def store_config(folder: Path, store: dict[str, Any] | None = None) -> Path:
    """A config serving the store graph (and `store` as its store section)."""
    config: dict[str, Any] = {"graphs": {"store_writer": f"{GRAPH_FILE}:graph"}}
    if store is not None:
        config["store"] = store
    path = folder / "langgraph.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def store_cluster(
    private_cluster: ClusterFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """One web process and one runs worker serving the store graph."""
    config = store_config(tmp_path_factory.mktemp("store-config"))
    with private_cluster("store", {"THREADRUN_CONFIG": str(config)}) as c:
        c.side_by_side(c.start_web, c.start_worker)
        yield c


def status_of(exc: pytest.ExceptionInfo[httpx.HTTPStatusError]) -> tuple[int, Any]:
    """The status and `field` of a refused SDK call."""
    res = exc.value.response
    return res.status_code, res.json().get("field")


def test_put_get_update_delete_round_trip(store_cluster: Cluster) -> None:
    """An item comes back as the SDK types it; a put replaces it; a delete removes it."""

    async def scenario(c: LangGraphClient) -> None:
        ns = ["rt", "docs"]
        assert await c.store.get_item(ns, key="nope") is None
        await c.store.put_item(ns, key="a", value={"title": "one", "n": 1})
        item = await c.store.get_item(ns, key="a")
        assert item is not None
        assert item["namespace"] == ns and item["key"] == "a"
        assert item["value"] == {"title": "one", "n": 1}
        assert item["created_at"] and item["updated_at"]
        await c.store.put_item(ns, key="a", value={"title": "two"})
        again = await c.store.get_item(ns, key="a")
        assert again is not None and again["value"] == {"title": "two"}
        assert again["created_at"] == item["created_at"]
        await c.store.delete_item(ns, key="a")
        assert await c.store.get_item(ns, key="a") is None
        await c.store.delete_item(ns, key="a")  # deleting nothing is fine

    run(scenario, store_cluster.url)


def test_expired_items_are_gone_at_once(store_cluster: Cluster) -> None:
    """An item put with a `ttl` (minutes) is hidden from get, search and listings once it
    expires, before any sweep; one without stays. (TTLs are whole minutes in PostgresStore:
    the item's expiry is moved into the past instead of waiting a minute.)"""
    with httpx.Client(base_url=store_cluster.url, headers={"x-api-key": ALICE}) as http:
        for key, ttl in (("brief", {"ttl": 1}), ("kept", {})):
            body = {"namespace": ["ttl"], "key": key, "value": {"v": 1}, **ttl}
            assert http.put("/store/items", json=body).status_code == 204
        assert http.get("/store/items", params={"namespace": "ttl", "key": "brief"}).json()
    with psycopg.connect(store_cluster.settings.database_url.get_secret_value()) as conn:
        moved = conn.execute(
            "UPDATE store SET expires_at = now() - interval '1 second'"
            " WHERE key = 'brief' AND prefix LIKE '%ttl'"
        ).rowcount
    assert moved == 1

    async def scenario(c: LangGraphClient) -> None:
        assert await c.store.get_item(["ttl"], key="brief") is None
        assert [x["key"] for x in (await c.store.search_items(["ttl"]))["items"]] == ["kept"]

    run(scenario, store_cluster.url)


def test_search_by_prefix_filter_limit_offset(store_cluster: Cluster) -> None:
    """Search covers the namespace and those below it only; filters compare values; pages
    do not overlap."""

    async def scenario(c: LangGraphClient) -> None:
        for i in range(6):
            ns = ["sr", "even" if i % 2 == 0 else "odd"]
            await c.store.put_item(ns, key=f"k{i}", value={"i": i, "kind": ns[1]})
        await c.store.put_item(["srx"], key="outside", value={"i": 99})
        found = (await c.store.search_items(["sr"], limit=100))["items"]
        assert sorted(x["key"] for x in found) == [f"k{i}" for i in range(6)]
        assert all(x["namespace"][0] == "sr" for x in found)
        odd = (await c.store.search_items(["sr", "odd"], limit=100))["items"]
        assert sorted(x["key"] for x in odd) == ["k1", "k3", "k5"]
        even = (await c.store.search_items(["sr"], filter={"kind": "even"}, limit=100))["items"]
        assert sorted(x["key"] for x in even) == ["k0", "k2", "k4"]
        big = (await c.store.search_items(["sr"], filter={"i": {"$gte": 4}}, limit=100))["items"]
        assert sorted(x["key"] for x in big) == ["k4", "k5"]
        pages = [
            (await c.store.search_items(["sr"], limit=2, offset=off))["items"] for off in (0, 2, 4)
        ]
        keys = [x["key"] for page in pages for x in page]
        assert [len(p) for p in pages] == [2, 2, 2] and sorted(keys) == [f"k{i}" for i in range(6)]
        everything = (await c.store.search_items([], limit=100))["items"]
        assert {"outside", "k0"} <= {x["key"] for x in everything}

    run(scenario, store_cluster.url)


def test_list_namespaces_prefix_suffix_depth_and_pages(store_cluster: Cluster) -> None:
    """Namespaces come back as the caller named them (never with a user prefix)."""

    async def scenario(c: LangGraphClient) -> None:
        for ns in (["ln", "a", "x"], ["ln", "a", "y"], ["ln", "b", "x"], ["ln", "c"]):
            await c.store.put_item(ns, key="k", value={"v": 1})
        got = (await c.store.list_namespaces(prefix=["ln"]))["namespaces"]
        assert sorted(got) == [["ln", "a", "x"], ["ln", "a", "y"], ["ln", "b", "x"], ["ln", "c"]]
        by_suffix = (await c.store.list_namespaces(prefix=["ln"], suffix=["x"]))["namespaces"]
        assert sorted(by_suffix) == [["ln", "a", "x"], ["ln", "b", "x"]]
        shallow = (await c.store.list_namespaces(prefix=["ln"], max_depth=2))["namespaces"]
        assert sorted(shallow) == [["ln", "a"], ["ln", "b"], ["ln", "c"]]
        first = (await c.store.list_namespaces(prefix=["ln"], limit=2))["namespaces"]
        rest = (await c.store.list_namespaces(prefix=["ln"], limit=10, offset=2))["namespaces"]
        assert len(first) == 2 and sorted(first + rest) == sorted(got)
        # A suffix as long as the whole namespace cannot reach into the hidden user label.
        deep = (await c.store.list_namespaces(suffix=["*", "ln", "c"]))["namespaces"]
        assert deep == []
        everything = (await c.store.list_namespaces(limit=1000))["namespaces"]
        assert ["ln", "c"] in everything
        assert not any(label.startswith("threadrun:") for ns in everything for label in ns)

    run(scenario, store_cluster.url)


def test_a4_two_users_are_isolated(store_cluster: Cluster) -> None:
    """A4: bob cannot see, find, list or delete alice's items, even under the same namespace
    and key; each sees their own."""
    ns = ["shared-name", "notes"]

    async def alice_writes(c: LangGraphClient) -> None:
        await c.store.put_item(ns, key="k", value={"owner": "alice"})
        await c.store.put_item(ns, key="only-alice", value={"owner": "alice"})

    async def bob_tries(c: LangGraphClient) -> None:
        assert await c.store.get_item(ns, key="only-alice") is None
        await c.store.delete_item(ns, key="only-alice")
        await c.store.delete_item(ns, key="k")
        assert (await c.store.search_items(["shared-name"], limit=100))["items"] == []
        assert (await c.store.list_namespaces(prefix=["shared-name"]))["namespaces"] == []
        everything = (await c.store.search_items([], limit=1000))["items"]
        assert all(x["value"].get("owner") != "alice" for x in everything)
        await c.store.put_item(ns, key="k", value={"owner": "bob"})
        mine = await c.store.get_item(ns, key="k")
        assert mine is not None and mine["value"] == {"owner": "bob"}

    async def alice_checks(c: LangGraphClient) -> None:
        k = await c.store.get_item(ns, key="k")
        assert k is not None and k["value"] == {"owner": "alice"}
        assert await c.store.get_item(ns, key="only-alice") is not None
        found = (await c.store.search_items(["shared-name"], limit=100))["items"]
        assert sorted(x["key"] for x in found) == ["k", "only-alice"]
        assert all(x["value"] == {"owner": "alice"} for x in found)

    url = store_cluster.url
    run(alice_writes, url)
    run(bob_tries, url, BOB)
    run(alice_checks, url)


def test_a3_bad_namespaces_and_fields_are_422(store_cluster: Cluster) -> None:
    """A3: a namespace the SDK or LangGraph would refuse, an unknown filter operator and a
    `query` without an embeddings index are 422s naming the field, never 500s."""

    async def scenario(c: LangGraphClient) -> None:
        refused = [
            (c.store.put_item([], key="k", value={"v": 1}), "namespace"),
            (c.store.put_item(["a", ""], key="k", value={"v": 1}), "namespace"),
            (c.store.put_item(["langgraph"], key="k", value={"v": 1}), "namespace"),
            (c.store.put_item(["a"], key="", value={"v": 1}), "key"),
            (c.store.put_item(["a"], key="k", value={"v": 1}, index=["v"]), "index"),
            (c.store.delete_item([], key="k"), "namespace"),
            (c.store.search_items(["a", ""]), "namespace_prefix"),
            (c.store.search_items(["a.b"]), "namespace_prefix"),
            (c.store.search_items(["a"], filter={"v": {"$regex": "x"}}), "filter"),
            (c.store.search_items(["a"], query="semantic please"), "query"),
            (c.store.list_namespaces(prefix=[""]), "prefix"),
            (c.store.list_namespaces(suffix=["a.b"]), "suffix"),
            (c.store.get_item([""], key="k"), "namespace"),
        ]
        for call, field in refused:
            with pytest.raises(httpx.HTTPStatusError) as info:
                await call
            assert status_of(info) == (422, field)

    run(scenario, store_cluster.url)
    with httpx.Client(base_url=store_cluster.url, headers={"x-api-key": ALICE}) as http:
        for params in ({"namespace": "a..b", "key": "k"}, {"key": "k"}, {"namespace": "a"}):
            res = http.get("/store/items", params=params)
            assert res.status_code == 422, (params, res.text)
        res = http.request("DELETE", "/store/items", json={"namespace": ["a.b"], "key": "k"})
        assert res.status_code == 422 and res.json()["field"] == "namespace"
        res = http.put("/store/items", json={"namespace": ["a"], "key": "k", "value": [1]})
        assert res.status_code == 422 and res.json()["field"] == "value"
        paths = httpx.get(f"{store_cluster.url}/openapi.json").json()["paths"]
        assert {"get", "put", "delete"} <= set(paths["/store/items"])
        assert "post" in paths["/store/items/search"] and "post" in paths["/store/namespaces"]


def test_a4_a_graph_run_writes_to_its_users_store(store_cluster: Cluster) -> None:
    """What a run writes through its store (async and sync nodes) is what its user then reads
    over HTTP; what the user put over HTTP is what the graph finds; another user's run, with
    the same namespaces, neither sees nor overwrites it."""

    async def alice(c: LangGraphClient) -> None:
        await c.store.put_item(["memories", "api"], key="note", value={"text": "from the api"})
        tid = (await c.threads.create())["thread_id"]
        out = cast(
            dict[str, Any], await c.runs.wait(tid, "store_writer", input={"note": "alice's note"})
        )
        assert out["seen"] == [
            "memories/api:note:from the api",
            "memories/sync:note:alice's note",
            "memories:note:alice's note",
        ]

    async def bob(c: LangGraphClient) -> None:
        tid = (await c.threads.create())["thread_id"]
        out = cast(
            dict[str, Any], await c.runs.wait(tid, "store_writer", input={"note": "bob's note"})
        )
        assert out["seen"] == ["memories/sync:note:bob's note", "memories:note:bob's note"]

    async def read_back(c: LangGraphClient, text: str) -> None:
        item = await c.store.get_item(["memories"], key="note")
        assert item is not None and item["value"] == {"text": text}
        synced = await c.store.get_item(["memories", "sync"], key="note")
        assert synced is not None and synced["value"] == {"text": text}

    url = store_cluster.url
    run(alice, url)
    run(bob, url, BOB)
    run(lambda c: read_back(c, "alice's note"), url)
    run(lambda c: read_back(c, "bob's note"), url, BOB)
