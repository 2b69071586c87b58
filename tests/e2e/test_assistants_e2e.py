"""A1: assistants through the official langgraph-sdk against real processes: CRUD, versions,
the latest version, a version's config reaching the graph, ownership, system assistants,
and the graph's drawing, schemas and subgraphs."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import ConflictError, NotFoundError, PermissionDeniedError

from shared.agent.graphs import assistant_id_for
from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, BOB, human
from tests.e2e.conftest import run_sdk as run

pytestmark = pytest.mark.e2e

SYSTEM_ID = assistant_id_for("lead_agent")


async def reply_tokens(c: LangGraphClient, assistant_id: str, **kw: Any) -> int:
    """How many tokens the built-in model's reply has, for a run on `assistant_id`."""
    tid = (await c.threads.create())["thread_id"]
    values = await c.runs.wait(tid, assistant_id, input=human("hello"), **kw)
    reply = values["messages"][-1]
    assert reply["type"] == "ai", values
    return len(reply["content"].split())


def test_crud_versions_and_latest_through_the_sdk(cluster: Cluster) -> None:
    """create (if_exists), get, update (a new version), get_versions, set_latest, search
    (graph, name, metadata, sort, select, pagination), count, delete."""

    async def scenario(c: LangGraphClient) -> None:
        a = await c.assistants.create(
            "lead_agent",
            config={"configurable": {"tokens": 3}},
            metadata={"suite": "crud"},
            name="crud writer",
            description="first",
        )
        aid = a["assistant_id"]
        assert (a["version"], a["graph_id"], a["name"], a["description"]) == (
            1,
            "lead_agent",
            "crud writer",
            "first",
        )
        assert a["config"] == {"configurable": {"tokens": 3}} and a["context"] == {"tokens": 3}
        assert await c.assistants.get(aid) == a
        with pytest.raises(ConflictError):
            await c.assistants.create("lead_agent", assistant_id=aid)
        same = await c.assistants.create("lead_agent", assistant_id=aid, if_exists="do_nothing")
        assert same == a
        b = await c.assistants.update(aid, context={"tokens": 5}, metadata={"rev": 2})
        assert b["version"] == 2 and b["metadata"] == {"suite": "crud", "rev": 2}
        assert b["config"] == {"configurable": {"tokens": 5}} and b["name"] == "crud writer"
        versions = await c.assistants.get_versions(aid)
        assert [v["version"] for v in versions] == [2, 1]
        assert set(versions[0]) == {
            "assistant_id", "graph_id", "config", "context", "created_at", "metadata",
            "version", "name", "description",
        }  # fmt: skip
        back = await c.assistants.set_latest(aid, 1)
        assert back["version"] == 1 and back["config"] == a["config"]
        assert (await c.assistants.get(aid))["metadata"] == {"suite": "crud"}
        assert (await c.assistants.update(aid, name="renamed"))["version"] == 3
        with pytest.raises(NotFoundError):
            await c.assistants.set_latest(aid, 42)

        more = [
            await c.assistants.create("lead_agent", name=f"crud {n}", metadata={"suite": "crud"})
            for n in ("b", "a")
        ]
        assert await c.assistants.count(metadata={"suite": "crud"}) == 3
        found = await c.assistants.search(
            metadata={"suite": "crud"}, sort_by="name", sort_order="asc"
        )
        assert [x["name"] for x in found] == ["crud a", "crud b", "renamed"]
        assert [
            x["name"] for x in await c.assistants.search(name="CRUD ", graph_id="lead_agent")
        ] == [
            "crud a",
            "crud b",
        ]
        page = await c.assistants.search(
            metadata={"suite": "crud"},
            limit=2,
            select=["assistant_id", "name"],
            response_format="object",
        )
        assert page["next"] == "2" and all(
            set(x) == {"assistant_id", "name"} for x in page["assistants"]
        )
        last = await c.assistants.search(
            metadata={"suite": "crud"}, limit=2, offset=2, response_format="object"
        )
        assert last["next"] is None and len(last["assistants"]) == 1
        for x in [aid, *(m["assistant_id"] for m in more)]:
            await c.assistants.delete(x)
        with pytest.raises(NotFoundError):
            await c.assistants.get(aid)
        assert await c.assistants.count(metadata={"suite": "crud"}) == 0

    run(scenario, cluster.url)


def test_a_version_config_reaches_the_graph_and_the_run_wins(cluster: Cluster) -> None:
    """A run on an assistant uses its current version's config (`tokens`); the run's own
    config wins over it; another version takes effect once it is the latest."""

    async def scenario(c: LangGraphClient) -> None:
        a = await c.assistants.create("lead_agent", config={"configurable": {"tokens": 3}})
        aid = a["assistant_id"]
        assert await reply_tokens(c, aid) == 3
        assert await reply_tokens(c, aid, config={"configurable": {"tokens": 6}}) == 6
        await c.assistants.update(aid, config={"configurable": {"tokens": 4}})
        assert await reply_tokens(c, aid) == 4
        await c.assistants.set_latest(aid, 1)
        tid = (await c.threads.create())["thread_id"]
        r = await c.runs.create(tid, aid, input=human("hi"), config={"tags": ["mine"]})
        await c.runs.join(tid, r["run_id"])
        got = await c.runs.get(tid, r["run_id"])
        assert got["assistant_id"] == aid and got["status"] == "success"
        assert got["kwargs"]["config"] == {"configurable": {"tokens": 3}, "tags": ["mine"]}
        assert got["kwargs"]["context"] == {"tokens": 3}
        thread = await c.threads.get(tid)
        assert thread["metadata"]["assistant_id"] == aid
        assert thread["metadata"]["graph_id"] == "lead_agent"
        state = await c.threads.get_state(tid)
        assert len(state["values"]["messages"][-1]["content"].split()) == 3

    run(scenario, cluster.url)


def test_system_assistant_is_stable_shared_and_read_only(cluster: Cluster) -> None:
    """The graph's system assistant has the uuid5 id on every web process (a second one
    started on the same database adds no row), both users read it, nobody changes it."""

    async def read(c: LangGraphClient) -> tuple[dict[str, Any], dict[str, Any], int]:
        by_name = await c.assistants.get("lead_agent")
        by_id = await c.assistants.get(SYSTEM_ID)
        n = await c.assistants.count(metadata={"created_by": "system"})
        return by_name, by_id, n

    second = cluster.start_web()
    try:
        views = [run(read, url, key) for url in (cluster.url, second) for key in (ALICE, BOB)]
    finally:
        cluster.stop([p for p in cluster.procs if p.url == second])
        cluster.urls.remove(second)
    for by_name, by_id, n in views:
        assert by_name == by_id == views[0][0] and n == 1
        assert by_id["assistant_id"] == SYSTEM_ID and by_id["metadata"] == {"created_by": "system"}

    async def write(c: LangGraphClient) -> None:
        with pytest.raises(PermissionDeniedError):
            await c.assistants.update("lead_agent", name="mine now")
        with pytest.raises(PermissionDeniedError):
            await c.assistants.delete(SYSTEM_ID)
        with pytest.raises(PermissionDeniedError):
            await c.assistants.set_latest(SYSTEM_ID, 1)
        assert [v["version"] for v in await c.assistants.get_versions(SYSTEM_ID)] == [1]

    run(write, cluster.url, BOB)


def test_another_users_assistant_is_a_404(cluster: Cluster) -> None:
    """Bob cannot see, update, delete, version, draw or run on Alice's assistant; it is not
    in his search or count; its id makes an assistant of his own, exactly as a fresh id does
    (A4: assistant ids are per owner, no 409 that tells Alice's exists)."""

    async def alice(c: LangGraphClient) -> str:
        a = await c.assistants.create("lead_agent", metadata={"who": "alice-only"})
        return str(a["assistant_id"])

    aid = run(alice, cluster.url)

    async def bob(c: LangGraphClient) -> None:
        for call in (
            c.assistants.get(aid),
            c.assistants.update(aid, name="bob's"),
            c.assistants.delete(aid),
            c.assistants.get_versions(aid),
            c.assistants.set_latest(aid, 1),
            c.assistants.get_graph(aid),
            c.assistants.get_schemas(aid),
            c.assistants.get_subgraphs(aid),
        ):
            with pytest.raises(NotFoundError):
                await call
        assert await c.assistants.search(metadata={"who": "alice-only"}) == []
        assert await c.assistants.count(metadata={"who": "alice-only"}) == 0
        tid = (await c.threads.create())["thread_id"]
        with pytest.raises(NotFoundError):
            await c.runs.create(tid, aid, input=human("x"))
        mine = await c.assistants.create("lead_agent", assistant_id=aid, if_exists="do_nothing")
        assert mine["assistant_id"] == aid and mine["metadata"] == {}
        assert (await c.assistants.get(aid))["metadata"] == {}
        await c.assistants.delete(aid)

    run(bob, cluster.url, BOB)

    async def still_there(c: LangGraphClient) -> dict[str, Any]:
        return await c.assistants.get(aid)

    assert run(still_there, cluster.url)["version"] == 1


def test_graph_schemas_and_subgraphs_shapes(cluster: Cluster) -> None:
    """get_graph (xray), get_schemas and get_subgraphs answer the official shapes."""

    async def scenario(c: LangGraphClient) -> None:
        drawn = await c.assistants.get_graph("lead_agent")
        assert set(drawn) == {"nodes", "edges"}
        ids = {n["id"] for n in drawn["nodes"]}
        assert {"__start__", "model", "tools", "__end__"} <= ids
        assert all("id" not in n["data"] for n in drawn["nodes"] if isinstance(n.get("data"), dict))
        assert all({"source", "target"} <= set(e) for e in drawn["edges"])
        assert (await c.assistants.get_graph(SYSTEM_ID, xray=True))["nodes"]
        assert (await c.assistants.get_graph(SYSTEM_ID, xray=2))["nodes"]
        schemas = await c.assistants.get_schemas("lead_agent")
        assert set(schemas) == {
            "graph_id", "input_schema", "output_schema", "state_schema", "config_schema",
            "context_schema",
        }  # fmt: skip
        assert schemas["graph_id"] == "lead_agent"
        assert "messages" in schemas["state_schema"]["properties"]
        assert "messages" in schemas["input_schema"]["properties"]
        assert schemas["context_schema"] is None and schemas["config_schema"] == {}
        assert await c.assistants.get_subgraphs("lead_agent") == {}
        assert await c.assistants.get_subgraphs("lead_agent", namespace="tools", recurse=True) == {}

    run(scenario, cluster.url)
    with httpx.Client(base_url=cluster.url, headers={"x-api-key": ALICE}, timeout=10) as h:
        assert h.get(f"/assistants/{SYSTEM_ID}/graph", params={"xray": "0"}).status_code == 422
        # an unknown query or body field is ignored, as the official server ignores it (A3)
        assert h.get(f"/assistants/{SYSTEM_ID}/graph", params={"xrya": "1"}).status_code == 200
        assert h.post("/assistants", json={"graph_id": "nope"}).status_code == 404
        created = h.post("/assistants", json={"graph_id": "lead_agent", "nme": "x"})
        assert created.status_code == 200 and created.json()["name"] != "x"
        both = {"graph_id": "lead_agent", "config": {"configurable": {"a": 1}}, "context": {"b": 1}}
        assert h.post("/assistants", json=both).status_code == 400
        doc = h.get("/openapi.json").json()
        for path in (
            "/assistants",
            "/assistants/{assistant_id}",
            "/assistants/{assistant_id}/versions",
            "/assistants/{assistant_id}/latest",
            "/assistants/{assistant_id}/graph",
            "/assistants/{assistant_id}/schemas",
            "/assistants/{assistant_id}/subgraphs",
            "/assistants/{assistant_id}/subgraphs/{namespace}",
        ):
            assert path in doc["paths"], path
        assert set(doc["paths"]["/assistants/{assistant_id}"]) == {"get", "patch", "delete"}


def test_delete_threads_with_the_assistant(cluster: Cluster) -> None:
    """`delete_threads=True` also deletes the caller's threads that ran on the assistant."""

    async def scenario(c: LangGraphClient) -> None:
        aid = (await c.assistants.create("lead_agent"))["assistant_id"]
        used = (await c.threads.create())["thread_id"]
        await c.runs.wait(used, aid, input=human("x"))
        other = (await c.threads.create())["thread_id"]
        await c.assistants.delete(aid, delete_threads=True)
        with pytest.raises(NotFoundError):
            await c.threads.get(used)
        assert (await c.threads.get(other))["thread_id"] == other

    run(scenario, cluster.url)
