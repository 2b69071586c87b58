"""Loading graphs from a langgraph.json-compatible config."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.pregel import Pregel

from shared.agent.graphs import (
    ASSISTANT_NAMESPACE,
    GraphConfigError,
    GraphNotFound,
    GraphRegistry,
    GraphSpec,
    assistant_id_for,
)
from shared.settings import PROJECT_ROOT

BENCH_CONFIG = PROJECT_ROOT.parent / "shared" / "bench" / "langgraph.json"

GRAPH_MODULE = """
from langgraph.graph import END, START, MessagesState, StateGraph


def echo(state: MessagesState) -> dict:
    return {"messages": [("ai", "echo")]}


builder = StateGraph(MessagesState)
builder.add_node("echo", echo)
builder.add_edge(START, "echo")
builder.add_edge("echo", END)
"""


def write_config(folder: Path, graphs: object) -> Path:
    path = folder / "langgraph.json"
    path.write_text(json.dumps({"graphs": graphs}))
    return path


def write_module(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    return path


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.mark.skipif(not BENCH_CONFIG.is_file(), reason=f"{BENCH_CONFIG} is outside this repo")
def test_loads_the_bench_graph() -> None:
    registry = GraphRegistry.from_config(BENCH_CONFIG)
    assert registry.ids() == ["bench"]
    graph = registry.get("bench")
    assert isinstance(graph, Pregel)
    assert registry.get("bench") is graph
    assert registry.resolve(assistant_id_for("bench")) == "bench"

    config = RunnableConfig(configurable={"tokens": 3, "tool_step": 0})
    out = asyncio.run(graph.ainvoke({"messages": [HumanMessage("go")]}, config))
    assert out["messages"][-1].content == "t0000 t0001 t0002 "


def test_loads_the_project_config_with_lead_agent() -> None:
    registry = GraphRegistry.from_config(PROJECT_ROOT / "langgraph.json")
    assert registry.ids() == ["lead_agent"]
    spec = registry.spec("lead_agent")
    assert spec.path == PROJECT_ROOT / "shared" / "agent" / "lead_agent.py"
    assert spec.attr == "graph"
    graph = registry.get("lead_agent")
    assert graph.name == "lead_agent"
    assert graph.checkpointer is None
    saved = graph.copy(update={"checkpointer": InMemorySaver()})
    assert isinstance(saved.checkpointer, InMemorySaver)
    assert graph.checkpointer is None


def test_assistant_ids_are_deterministic_and_resolve() -> None:
    expected = str(uuid.uuid5(ASSISTANT_NAMESPACE, "agent"))
    assert assistant_id_for("agent") == expected
    assert assistant_id_for("agent") != assistant_id_for("other")

    registry = GraphRegistry({"agent": GraphSpec("agent", Path("x.py"), "graph")})
    assert registry.resolve("agent") == "agent"
    assert registry.resolve(expected) == "agent"
    assert registry.resolve(expected.upper()) == "agent"
    for unknown in ("nope", str(uuid.uuid4())):
        with pytest.raises(GraphNotFound) as caught:
            registry.resolve(unknown)
        assert isinstance(caught.value, KeyError)
        assert caught.value.graph_id == unknown
        assert unknown in str(caught.value)


def test_compiles_a_state_graph_and_runs_it(tmp_path: Path) -> None:
    write_module(tmp_path / "agents" / "echo.py", GRAPH_MODULE)
    registry = GraphRegistry.from_config(
        write_config(tmp_path, {"echo": "./agents/echo.py:builder"})
    )
    graph = registry.get("echo")
    assert isinstance(graph, Pregel)
    assert graph.invoke({"messages": [HumanMessage("hi")]})["messages"][-1].content == "echo"


def test_file_imports_its_siblings(tmp_path: Path) -> None:
    helper = unique("helper")
    write_module(tmp_path / "g" / f"{helper}.py", GRAPH_MODULE)
    write_module(
        tmp_path / "g" / "main.py", f"from {helper} import builder\ngraph = builder.compile()\n"
    )
    registry = GraphRegistry.from_config(write_config(tmp_path, {"g": "g/main.py:graph"}))
    assert isinstance(registry.get("g"), Pregel)


def test_module_spec_is_imported_from_the_config_folder(tmp_path: Path) -> None:
    package = unique("pkg")
    write_module(tmp_path / package / "__init__.py", "")
    write_module(tmp_path / package / "agent.py", GRAPH_MODULE + "graph = builder.compile()\n")
    registry = GraphRegistry.from_config(write_config(tmp_path, {"m": f"{package}.agent:graph"}))
    spec = registry.spec("m")
    assert spec.module == f"{package}.agent"
    assert isinstance(registry.get("m"), Pregel)


def test_factories_without_and_with_config(tmp_path: Path) -> None:
    write_module(
        tmp_path / "factories.py",
        GRAPH_MODULE
        + """
calls = []


def plain():
    calls.append(None)
    return builder


def per_run(config):
    calls.append(config["configurable"].get("who"))
    return builder.compile()
""",
    )
    config = write_config(
        tmp_path, {"plain": "factories.py:plain", "per_run": "./factories.py:per_run"}
    )
    registry = GraphRegistry.from_config(config)

    first = registry.get("plain")
    assert registry.get("plain") is first
    registry.get("per_run", {"configurable": {"who": "a"}})
    registry.get("per_run", {"configurable": {"who": "b"}})
    (module,) = [
        m
        for m in list(sys.modules.values())
        if getattr(m, "__file__", None) == str(tmp_path / "factories.py")
    ]
    assert module.calls == [None, "a", "b"]


def test_concurrent_gets_import_once(tmp_path: Path) -> None:
    counter = tmp_path / "imports.txt"
    write_module(
        tmp_path / "slow.py",
        GRAPH_MODULE
        + f"""
import time
from pathlib import Path

counter = Path({str(counter)!r})
counter.write_text((counter.read_text() if counter.exists() else "") + "x")
time.sleep(0.05)
graph = builder.compile()
""",
    )
    registry = GraphRegistry.from_config(write_config(tmp_path, {"slow": "slow.py:graph"}))
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(registry.get("slow"))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.read_text() == "x"
    assert len(results) == 8
    assert all(r is results[0] for r in results)


def test_unknown_graph_id(tmp_path: Path) -> None:
    write_module(tmp_path / "echo.py", GRAPH_MODULE)
    registry = GraphRegistry.from_config(write_config(tmp_path, {"echo": "echo.py:builder"}))
    with pytest.raises(GraphNotFound):
        registry.get("missing")
    with pytest.raises(KeyError):
        registry.get("missing")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("{not json", "not valid JSON"),
        ("[]", 'no "graphs"'),
        ('{"dependencies": ["."]}', 'no "graphs"'),
        ('{"graphs": {}}', 'no "graphs"'),
        ('{"graphs": ["a.py:g"]}', 'no "graphs"'),
        ('{"graphs": {"a": 3}}', "graphs.a"),
        ('{"graphs": {"a": "a.py:g"}, "htp": {}}', "unknown key 'htp'"),
        ('{"graphs": {"a": "echo.py"}}', "is not 'path/to/file.py:variable'"),
        ('{"graphs": {"a": "echo.py:"}}', "is not 'path/to/file.py:variable'"),
        ('{"graphs": {"a": ":graph"}}', "is not 'path/to/file.py:variable'"),
        ('{"graphs": {"a": "echo.py:not-a-name"}}', "is not 'path/to/file.py:variable'"),
        ('{"graphs": {"a": "./missing.py:graph"}}', "does not exist"),
        ('{"graphs": {"a": "not a module:graph"}}', "is not a module name"),
    ],
)
def test_bad_configs(tmp_path: Path, content: str | None, message: str) -> None:
    write_module(tmp_path / "echo.py", GRAPH_MODULE)
    path = tmp_path / "langgraph.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(GraphConfigError, match=message):
        GraphRegistry.from_config(path)


@pytest.mark.parametrize(
    ("body", "attr", "message"),
    [
        (GRAPH_MODULE, "missing", "has no variable 'missing'"),
        ("raise RuntimeError('boom')\n", "graph", "importing .* failed: RuntimeError\\('boom'\\)"),
        ("graph = 42\n", "graph", "is a int, not a compiled graph"),
        ("def graph():\n    raise ValueError('nope')\n", "graph", "factory .* failed"),
        ("async def graph():\n    return None\n", "graph", "is async"),
    ],
)
def test_bad_graph_objects(tmp_path: Path, body: str, attr: str, message: str) -> None:
    name = unique("bad")
    write_module(tmp_path / f"{name}.py", body)
    registry = GraphRegistry.from_config(write_config(tmp_path, {"bad": f"{name}.py:{attr}"}))
    with pytest.raises(GraphConfigError, match=message):
        registry.get("bad")
