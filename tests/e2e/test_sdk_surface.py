"""every call of the official Python `langgraph-sdk` answers against real processes.

One scenario per SDK resource drives each of its public methods once, with an assertion on
what comes back, and `test_every_sdk_method_is_driven` keeps the list honest: a method the
SDK has and no scenario calls fails the suite (so a new SDK release shows what it added).

The one call left out is `threads.stream`, the SDK's experimental "v3 thread-centric
streaming session" (a command protocol of its own, not the Agent Server API the other calls
speak); it is listed in `NOT_DRIVEN` with that reason.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk._sync.assistants import SyncAssistantsClient
from langgraph_sdk._sync.cron import SyncCronClient
from langgraph_sdk._sync.runs import SyncRunsClient
from langgraph_sdk._sync.store import SyncStoreClient
from langgraph_sdk._sync.threads import SyncThreadsClient
from langgraph_sdk.client import SyncLangGraphClient

from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ALICE, human

pytestmark = pytest.mark.e2e

KNOBS = {"configurable": {"tokens": 3}}
RESOURCES: dict[str, type] = {
    "assistants": SyncAssistantsClient,
    "threads": SyncThreadsClient,
    "runs": SyncRunsClient,
    "crons": SyncCronClient,
    "store": SyncStoreClient,
}
NOT_DRIVEN = {"threads.stream": "the SDK's experimental v3 command protocol, not this API"}


def called(name: str, result: Any) -> Any:
    """Mark the SDK call `name` as driven here (`test_every_sdk_method_is_driven` reads these
    marks from this file's text) and hand its result back."""
    return result


@pytest.fixture(scope="module")
def graphs(graphs_cluster: Cluster) -> Cluster:
    """The session's web process and runs worker serving the test graphs (conftest)."""
    return graphs_cluster


@pytest.fixture
def sdk(graphs: Cluster) -> Iterator[SyncLangGraphClient]:
    client = get_sync_client(url=graphs.url, api_key=ALICE)
    yield client
    client.http.client.close()


def test_assistants_surface(sdk: SyncLangGraphClient) -> None:
    """all eleven assistants calls."""
    a = sdk.assistants
    made = called("assistants.create", a.create("lead_agent", config=KNOBS, name="surface"))
    aid = made["assistant_id"]
    assert called("assistants.get", a.get(aid))["name"] == "surface"
    patched = called("assistants.update", a.update(aid, metadata={"v": 2}))
    assert patched["version"] == 2
    versions = called("assistants.get_versions", a.get_versions(aid))
    assert [v["version"] for v in versions] == [2, 1]
    assert called("assistants.set_latest", a.set_latest(aid, 1))["version"] == 1
    found = called("assistants.search", a.search(graph_id="lead_agent", limit=100))
    assert aid in {x["assistant_id"] for x in found}
    assert called("assistants.count", a.count(graph_id="lead_agent")) >= 2
    graph = called("assistants.get_graph", a.get_graph(aid))
    assert graph["nodes"]
    schemas = called("assistants.get_schemas", a.get_schemas(aid))
    assert schemas["graph_id"] == "lead_agent"
    assert isinstance(called("assistants.get_subgraphs", a.get_subgraphs(aid)), dict)
    called("assistants.delete", a.delete(aid))
    assert aid not in {x["assistant_id"] for x in a.search(limit=100)}


def test_threads_surface(sdk: SyncLangGraphClient) -> None:
    """all thread calls but the v3 session, `join_stream` following a run."""
    t = sdk.threads
    tid = called("threads.create", t.create(metadata={"k": "surface"}))["thread_id"]
    assert called("threads.get", t.get(tid))["metadata"]["k"] == "surface"
    assert called("threads.update", t.update(tid, metadata={"k2": 1}))["metadata"]["k2"] == 1
    sdk.runs.wait(tid, "lead_agent", input=human("hello surface"), config=KNOBS)
    state = called("threads.get_state", t.get_state(tid))
    assert state["values"]["messages"][0]["content"] == "hello surface"
    history = called("threads.get_history", t.get_history(tid, limit=5))
    assert history and history[0]["checkpoint"]["checkpoint_id"]
    called("threads.update_state", t.update_state(tid, {"messages": []}))
    found = called("threads.search", t.search(metadata={"k": "surface"}))
    assert [x["thread_id"] for x in found] == [tid]
    assert called("threads.count", t.count(metadata={"k": "surface"})) == 1
    copy = called("threads.copy", t.copy(tid))
    assert copy["thread_id"] != tid
    sdk.runs.create(tid, "lead_agent", input=human("followed"), config=KNOBS)
    events = []
    for part in called("threads.join_stream", t.join_stream(tid)):
        events.append(part.event)
        if part.event == "metadata" and part.data.get("status") == "run_done":
            break  # a thread stream follows until the client leaves; one run is enough here
    assert "values" in events
    pruned = called("threads.prune", t.prune([copy["thread_id"]]))
    assert pruned["pruned_count"] == 1
    called("threads.delete", t.delete(tid))
    assert t.count(metadata={"k": "surface"}) == 0


def test_runs_surface(sdk: SyncLangGraphClient) -> None:
    """every runs call, with and without a thread."""
    r = sdk.runs
    tid = sdk.threads.create()["thread_id"]
    run = called("runs.create", r.create(tid, "lead_agent", input=human("a"), config=KNOBS))
    joined = called("runs.join", r.join(tid, run["run_id"]))
    assert joined["messages"][-1]["type"] == "ai"
    assert called("runs.get", r.get(tid, run["run_id"]))["status"] == "success"
    parts = list(called("runs.stream", r.stream(tid, "lead_agent", input=human("b"))))
    assert parts[-1].event in {"values", "end"}
    last = r.list(tid, limit=1)[0]
    rejoined = list(called("runs.join_stream", r.join_stream(tid, last["run_id"])))
    assert rejoined
    assert len(called("runs.list", r.list(tid))) == 2
    out = called("runs.wait", r.wait(None, "lead_agent", input=human("stateless")))
    assert out["messages"][0]["content"] == "stateless"
    batch = called(
        "runs.create_batch",
        r.create_batch([{"assistant_id": "lead_agent", "input": human("x"), "config": KNOBS}]),
    )
    assert len(batch) == 1
    slow = r.create(
        tid, "lead_agent", input=human("slow"), config={"configurable": {"tokens": 400}}
    )
    called("runs.cancel", r.cancel(tid, slow["run_id"], wait=True))
    assert r.get(tid, slow["run_id"])["status"] == "interrupted"
    again = r.create(
        tid, "lead_agent", input=human("slow"), config={"configurable": {"tokens": 400}}
    )
    called("runs.cancel_many", r.cancel_many(thread_id=tid, run_ids=[again["run_id"]]))
    wait_for(lambda: r.get(tid, again["run_id"])["status"] == "interrupted", timeout=30)
    called("runs.delete", r.delete(tid, again["run_id"]))
    assert again["run_id"] not in {x["run_id"] for x in r.list(tid)}


def test_crons_surface(sdk: SyncLangGraphClient) -> None:
    """all six cron calls (firing itself is proven in test_crons_e2e)."""
    c = sdk.crons
    tid = sdk.threads.create()["thread_id"]
    on_thread = called(
        "crons.create_for_thread",
        c.create_for_thread(tid, "lead_agent", schedule="0 3 * * *", input=human("nightly")),
    )
    stateless = called("crons.create", c.create("lead_agent", schedule="*/5 * * * *"))
    ids = {on_thread["cron_id"], stateless["cron_id"]}
    assert ids <= {x["cron_id"] for x in called("crons.search", c.search(limit=100))}
    assert called("crons.count", c.count(thread_id=tid)) == 1
    updated = called("crons.update", c.update(stateless["cron_id"], enabled=False))
    assert updated["enabled"] is False
    for cron_id in ids:
        called("crons.delete", c.delete(cron_id))
    assert not ids & {x["cron_id"] for x in c.search(limit=100)}


def test_store_surface(sdk: SyncLangGraphClient) -> None:
    """all five store calls."""
    s = sdk.store
    called("store.put_item", s.put_item(["surface", "notes"], "n1", {"text": "hi"}))
    assert called("store.get_item", s.get_item(["surface", "notes"], "n1"))["value"]["text"] == "hi"
    hits = called("store.search_items", s.search_items(["surface"]))["items"]
    assert [h["key"] for h in hits] == ["n1"]
    spaces = called("store.list_namespaces", s.list_namespaces(prefix=["surface"]))
    assert spaces["namespaces"] == [["surface", "notes"]]
    called("store.delete_item", s.delete_item(["surface", "notes"], "n1"))
    assert s.search_items(["surface"])["items"] == []


def test_every_sdk_method_is_driven() -> None:
    """no public method of the SDK's five resources is missing from the scenarios
    above (each marks its calls with `called("<resource>.<method>", …)`)."""
    driven = set(re.findall(r'called\(\s*"([a-z_]+\.[a-z_]+)"', Path(__file__).read_text()))
    public = {
        f"{name}.{m}"
        for name, cls in RESOURCES.items()
        for m, _ in inspect.getmembers(cls, inspect.isfunction)
        if not m.startswith("_")
    }
    assert public - driven - set(NOT_DRIVEN) == set()
    assert driven <= public
    assert len(public) >= 45
