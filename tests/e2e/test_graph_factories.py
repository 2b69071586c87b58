"""Graph factories, a run's default context and graphs that fail to load, end to end through
the official langgraph-sdk against real processes (P1, G4).

One private cluster serves a langgraph.json of five graphs: `factory` (an async context
manager factory of config and server runtime, tests/graphs/factory.py), `context` (a
compiled graph with a dataclass `context_schema` with defaults, tests/graphs/context_graph.py),
`echo` (a plain graph), `broken` (its module raises on import) and `broken_factory` (a
factory that raises). The worker starts and serves the good graphs; the bad graphs' runs end
`error` at once with the load error, and the ops API shows each graph's load state.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient

from shared.settings import PROJECT_ROOT
from shared.tools.testing import Cluster
from tests.e2e.conftest import API_KEYS, ClusterFactory, human
from tests.e2e.conftest import run_sdk as run

pytestmark = pytest.mark.e2e

GRAPHS = PROJECT_ROOT / "tests" / "graphs"
OPS = "key-ops"
ECHO = """
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, MessagesState, StateGraph


def echo(state: MessagesState) -> dict:
    return {"messages": [AIMessage(content="echo")]}


builder = StateGraph(MessagesState)
builder.add_node("echo", echo)
builder.add_edge(START, "echo")
builder.add_edge("echo", END)
graph = builder.compile()
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The langgraph.json of the five graphs."""
    folder = tmp_path_factory.mktemp("factory-project")
    (folder / "echo_graph.py").write_text(textwrap.dedent(ECHO))
    (folder / "broken_graph.py").write_text("raise RuntimeError('this module is broken')\n")
    (folder / "broken_factory.py").write_text(
        "def graph(config):\n    raise ValueError('the factory cannot build')\n"
    )
    graphs = {
        "factory": f"{GRAPHS / 'factory.py'}:graph",
        "context": f"{GRAPHS / 'context_graph.py'}:graph",
        "echo": "./echo_graph.py:graph",
        "broken": "./broken_graph.py:graph",
        "broken_factory": "./broken_factory.py:graph",
    }
    path = folder / "langgraph.json"
    path.write_text(json.dumps({"graphs": graphs}))
    return path


@pytest.fixture(scope="module")
def factories(private_cluster: ClusterFactory, project: Path) -> Iterator[Cluster]:
    env = {"THREADRUN_CONFIG": str(project), "THREADRUN_API_KEYS": f"{API_KEYS},{OPS}:ops:ops"}
    with private_cluster("factories", env) as c:
        yield c.start()


async def run_to_end(
    c: LangGraphClient, graph_id: str, context: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run on a new thread, joined: (the run as read afterwards, the thread's values)."""
    thread = await c.threads.create()
    tid = thread["thread_id"]
    created = await c.runs.create(tid, graph_id, input=human("Say hello."), context=context)
    values = await c.runs.join(tid, created["run_id"])
    return await c.runs.get(tid, created["run_id"]), values


def last_answer(values: dict[str, Any]) -> dict[str, Any]:
    messages = values["messages"]
    assert messages, values
    answer: dict[str, Any] = messages[-1]
    return answer


@pytest.mark.parametrize(
    ("context", "model", "tools", "says"),
    [
        (None, "gpt-4o-mini", ["search_web"], "Hello!"),
        ({"model": "openai/gpt-4o"}, "gpt-4o", ["search_web"], "Hello!"),
        ({"enable_search": False}, "gpt-4o-mini", [], "Hello!"),
        ({"system_prompt": "Always respond in French."}, "gpt-4o-mini", ["search_web"], "Bonjour"),
    ],
    ids=["default context", "model override", "search disabled", "custom system prompt"],
)
def test_p1_an_async_context_manager_factory_runs_per_run_context(
    factories: Cluster, context: dict[str, Any] | None, model: str, tools: list[str], says: str
) -> None:
    """P1: the factory `@asynccontextmanager graph(config, runtime: ServerRuntime[Ctx])` runs
    through the SDK: the run's context shapes the graph the factory builds and reaches the
    node (model, system prompt), its defaults when the run sends none."""

    async def go(c: LangGraphClient) -> None:
        assistant = await c.assistants.create(graph_id="factory", if_exists="do_nothing")
        run_row, values = await run_to_end(c, assistant["assistant_id"], context)
        assert run_row["status"] == "success", run_row
        answer = last_answer(values)
        assert says in answer["content"]
        assert answer["response_metadata"]["model_name"] == model
        assert answer["response_metadata"]["tools"] == tools

    run(go, factories.url)


def test_p1_a_factory_graph_streams_and_is_listed(factories: Cluster) -> None:
    """P1: a factory's graph streams `updates`, and its assistant is found by search; its
    schemas are read through the factory (`assistants.read`)."""

    async def go(c: LangGraphClient) -> None:
        thread = await c.threads.create()
        chunks = [
            chunk
            async for chunk in c.runs.stream(
                thread["thread_id"], "factory", input=human("hi"), stream_mode="updates"
            )
        ]
        assert [ch.event for ch in chunks if ch.event == "updates"], chunks
        found = await c.assistants.search(graph_id="factory", limit=100)
        assert {a["graph_id"] for a in found} == {"factory"}
        schemas = await c.assistants.get_schemas(found[0]["assistant_id"])
        assert "enable_search" in json.dumps(schemas["context_schema"])

    run(go, factories.url)


def test_p1_a_run_without_context_gets_the_context_schema_defaults(factories: Cluster) -> None:
    """P1: a run that sends no `context` gets `{}` as the official server passes it, so a
    dataclass `context_schema`'s defaults apply (`runtime.context.model` in the node); one
    that sends some gets it merged over them."""

    async def go(c: LangGraphClient) -> None:
        out = await c.runs.wait(None, "context", input=human("hi"))
        assert last_answer(out)["content"] == "hi from builtin/default"
        out = await c.runs.wait(None, "context", input=human("hi"), context={"greeting": "yo"})
        assert last_answer(out)["content"] == "yo from builtin/default"

    run(go, factories.url)


def test_g4_a_graph_that_fails_to_load_fails_its_runs_alone(factories: Cluster) -> None:
    """G4: the worker serves the good graphs beside two that fail to load; each bad graph's
    runs end `error` at once with the load error as the run's error, its `error` event
    says it, the worker said it once at start-up naming graph and spec, and the ops API
    shows each graph's load state."""

    async def go(c: LangGraphClient) -> None:
        run_row, values = await run_to_end(c, "echo")
        assert run_row["status"] == "success" and last_answer(values)["content"] == "echo"
        for graph_id, cause in [
            ("broken", "RuntimeError('this module is broken')"),
            ("broken_factory", "ValueError('the factory cannot build')"),
        ]:
            thread = await c.threads.create()
            tid = thread["thread_id"]
            chunks = [ch async for ch in c.runs.stream(tid, graph_id, input=human("hi"))]
            errors = [ch.data for ch in chunks if ch.event == "error"]
            assert errors and cause in errors[0]["message"], chunks
            (row,) = await c.runs.list(tid)
            assert row["status"] == "error", row
            state = await c.threads.get(tid)
            assert state["status"] == "error"

    run(go, factories.url)

    worker = next(p for p in factories.procs if p.role == "worker")
    log = worker.output()
    for graph_id, spec in [
        ("broken", "broken_graph.py:graph"),
        ("broken_factory", "broken_factory.py:graph"),
    ]:
        said = [
            line
            for line in log.splitlines()
            if f"graph {graph_id!r} (" in line and "cannot be loaded" in line
        ]
        assert len(said) == 1 and spec in said[0], log[-3000:]

    with httpx.Client(base_url=factories.url, headers={"x-api-key": OPS}, timeout=30) as ops:
        health = ops.get("/ops/api/health").json()
        overview = ops.get("/ops/api/overview").json()
    for doc in (health, overview):
        graphs = {g["graph_id"]: g for g in doc["graphs"]}
        assert set(graphs) == {"factory", "context", "echo", "broken", "broken_factory"}
        assert {g for g, v in graphs.items() if v["state"] == "error"} == {
            "broken",
            "broken_factory",
        }
        assert "this module is broken" in graphs["broken"]["error"]
        assert graphs["broken"]["spec"].endswith("broken_graph.py:graph")
        assert graphs["echo"]["error"] is None
    tile = next(t for t in health["tiles"] if t["key"] == "graphs")
    assert tile["state"] == "bad" and "broken" in tile["reason"]
