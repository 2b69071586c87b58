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
from langgraph_sdk.runtime import _ExecutionRuntime

from shared.agent.factories import server_runtime
from shared.agent.graphs import (
    ASSISTANT_NAMESPACE,
    GraphConfigError,
    GraphNotFound,
    GraphRegistry,
    GraphSpec,
    assistant_id_for,
)
from shared.authz.users import AuthUser
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


def test_p1_factories_without_and_with_config_are_called_on_every_use(tmp_path: Path) -> None:
    """P1: a factory is called on every use of its graph, as the official server calls it
    (a zero-argument one too); its module is imported once."""
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
    assert registry.get("plain") is not first
    registry.get("per_run", {"configurable": {"who": "a"}})
    registry.get("per_run", {"configurable": {"who": "b"}})
    (module,) = [
        m
        for m in list(sys.modules.values())
        if getattr(m, "__file__", None) == str(tmp_path / "factories.py")
    ]
    assert module.calls == [None, None, "a", "b"]


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
        ("async def graph():\n    return None\n", "graph", "is a NoneType, not a compiled"),
        ("def graph(a, b, c):\n    pass\n", "graph", "must take 0, 1 or 2 parameters"),
        ("def graph(a, b):\n    pass\n", "graph", "can only take a ServerRuntime"),
    ],
)
def test_bad_graph_objects(tmp_path: Path, body: str, attr: str, message: str) -> None:
    name = unique("bad")
    write_module(tmp_path / f"{name}.py", body)
    registry = GraphRegistry.from_config(write_config(tmp_path, {"bad": f"{name}.py:{attr}"}))
    with pytest.raises(GraphConfigError, match=message):
        registry.get("bad")


# --- factories, in every form the official server accepts ------------------------------------
FACTORY_HEAD = (
    GRAPH_MODULE
    + """
from contextlib import asynccontextmanager, contextmanager
from typing import Annotated

from langchain_core.runnables import RunnableConfig
from langgraph_sdk.runtime import ServerRuntime

seen = []


def saw(config=None, runtime=None):
    if config is not None:
        seen.append(("config", config["configurable"].get("who")))
    if runtime is not None:
        seen.append(("runtime", runtime.access_context))
    return builder
"""
)
CONFIG_SEEN = ("config", "x")
RUNTIME_SEEN = ("runtime", "assistants.read")
FACTORY_FORMS = {
    "no argument": ("def graph():\n    return saw()\n", []),
    "config": ("def graph(config):\n    return saw(config)\n", [CONFIG_SEEN]),
    "runtime": (
        "def graph(runtime: ServerRuntime):\n    return saw(runtime=runtime)\n",
        [RUNTIME_SEEN],
    ),
    "async, config and runtime": (
        "async def graph(config, runtime: ServerRuntime):\n    return saw(config, runtime)\n",
        [CONFIG_SEEN, RUNTIME_SEEN],
    ),
    "runtime first": (
        "async def graph(runtime: ServerRuntime, config: RunnableConfig):\n"
        "    return saw(config, runtime)\n",
        [CONFIG_SEEN, RUNTIME_SEEN],
    ),
    "keyword-only": (
        "def graph(*, cfg, rt: ServerRuntime):\n    return saw(cfg, rt)\n",
        [CONFIG_SEEN, RUNTIME_SEEN],
    ),
    "positional-only": (
        "def graph(rt: ServerRuntime, cfg, /):\n    return saw(cfg, rt)\n",
        [CONFIG_SEEN, RUNTIME_SEEN],
    ),
    "runtime by name": (
        "def graph(config, runtime):\n    return saw(config, runtime)\n",
        [CONFIG_SEEN, RUNTIME_SEEN],
    ),
    "parametrised runtime": (
        "def graph(runtime: ServerRuntime[dict]):\n    return saw(runtime=runtime)\n",
        [RUNTIME_SEEN],
    ),
    "annotated runtime": (
        "def graph(runtime: Annotated[ServerRuntime, 'x']):\n    return saw(runtime=runtime)\n",
        [RUNTIME_SEEN],
    ),
    "string annotation": (
        "def graph(config, runtime: 'ServerRuntime[dict]'):\n    return saw(config, runtime)\n",
        [CONFIG_SEEN, RUNTIME_SEEN],
    ),
    "variadic ignored": (
        "def graph(config, **rest):\n    return saw(config)\n",
        [CONFIG_SEEN],
    ),
    "sync context manager": (
        "@contextmanager\ndef graph(config):\n    yield saw(config).compile()\n",
        [CONFIG_SEEN],
    ),
    "async context manager": (
        "@asynccontextmanager\nasync def graph(config, runtime: ServerRuntime):\n"
        "    yield saw(config, runtime)\n",
        [CONFIG_SEEN, RUNTIME_SEEN],
    ),
    "returns an awaitable": (
        "def graph(config):\n    async def make():\n        return saw(config)\n"
        "    return make()\n",
        [CONFIG_SEEN],
    ),
}


def module_of(path: Path) -> Any:
    """The imported module of a graph file."""
    (module,) = [m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str(path)]
    return module


@pytest.mark.parametrize("form", list(FACTORY_FORMS))
def test_p1_every_factory_form_gets_what_it_takes(tmp_path: Path, form: str) -> None:
    """P1: sync and async factories of nothing, a config, the server runtime or both (by
    annotation or name, either order, keyword or positional), and sync and async context
    managers, are called with what they take and give their graph."""
    body, expected = FACTORY_FORMS[form]
    path = write_module(tmp_path / f"{unique('form')}.py", FACTORY_HEAD + body)
    registry = GraphRegistry.from_config(write_config(tmp_path, {"g": f"{path.name}:graph"}))
    assert registry.is_factory("g")
    graph = registry.get("g", {"configurable": {"who": "x"}})
    assert isinstance(graph, Pregel)
    assert graph.invoke({"messages": [HumanMessage("hi")]})["messages"][-1].content == "echo"
    assert module_of(path).seen == expected


RECORDING_FACTORY = (
    GRAPH_MODULE
    + """
from langchain_core.runnables.config import var_child_runnable_config
from langgraph_sdk.runtime import ServerRuntime

seen = []


def graph(config, runtime: ServerRuntime):
    ert = runtime.execution_runtime
    seen.append({
        "access": runtime.access_context,
        "context": ert.context if ert is not None else "none",
        "user": runtime.user.identity if runtime.user is not None else None,
        "store": runtime.store,
        "for_execution": config["configurable"]["__is_for_execution__"],
        "current": var_child_runnable_config.get() is config,
    })
    return builder
"""
)


def test_p1_the_factory_runtime_names_the_access_and_a_run_gets_its_context(
    tmp_path: Path,
) -> None:
    """P1: a schema read calls the factory with the read runtime of `assistants.read`, a
    state read with `threads.read`, a run with the execution runtime carrying its user,
    store and a copy of its context; the config is the current one while it runs."""
    path = write_module(tmp_path / f"{unique('rec')}.py", RECORDING_FACTORY)
    registry = GraphRegistry.from_config(write_config(tmp_path, {"g": f"{path.name}:graph"}))
    registry.get("g")
    registry.reader("threads.read").get("g")
    context = {"model": "m"}
    store = object()
    user = AuthUser({"identity": "alice", "permissions": ["admin"]})
    runtime = server_runtime("threads.create_run", store=store, user=user, context=context)

    async def run() -> None:
        async with registry.open("g", {"configurable": {}}, runtime) as graph:
            assert isinstance(graph, Pregel)

    asyncio.run(run())
    read, state, execution = module_of(path).seen
    base = {"user": None, "store": None, "for_execution": False, "current": True}
    assert read == {**base, "access": "assistants.read", "context": "none"}
    assert state == {**base, "access": "threads.read", "context": "none"}
    assert execution == {
        "access": "threads.create_run",
        "context": {"model": "m"},
        "user": "alice",
        "store": store,
        "for_execution": True,
        "current": True,
    }
    assert isinstance(runtime, _ExecutionRuntime)
    assert runtime.context is not context  # the runtime holds a copy, as the server's does


CONTEXT_MANAGERS = (
    GRAPH_MODULE
    + """
from contextlib import asynccontextmanager, contextmanager

events = []


@contextmanager
def sync_cm(config):
    events.append("enter")
    try:
        yield builder.compile()
    finally:
        events.append("exit")


@asynccontextmanager
async def async_cm(config):
    events.append("enter")
    try:
        yield builder
    finally:
        events.append("exit")
"""
)


@pytest.mark.parametrize("attr", ["sync_cm", "async_cm"])
def test_p1_context_manager_factories_are_entered_per_use_and_exited_afterwards(
    tmp_path: Path, attr: str
) -> None:
    """P1: a context manager factory is entered for each use (a run's whole `async with`;
    a read, also from inside a running loop) and exited when the use ends."""
    path = write_module(tmp_path / f"{unique('cm')}.py", CONTEXT_MANAGERS)
    registry = GraphRegistry.from_config(write_config(tmp_path, {"g": f"{path.name}:{attr}"}))
    events = module_of_after(registry, path).events
    runtime = server_runtime("threads.create_run", store=None, context={})

    async def run() -> None:
        async with registry.open("g", None, runtime) as graph:
            assert events[-1] == "enter"
            out = await graph.ainvoke({"messages": [HumanMessage("hi")]})
            assert out["messages"][-1].content == "echo"
        assert events[-1] == "exit"
        registry.get("g")  # a sync read from inside a running loop

    asyncio.run(run())
    assert events == ["enter", "exit"] * 3


def module_of_after(registry: GraphRegistry, path: Path) -> Any:
    """The module of `path` once the registry has imported it (one schema read)."""
    registry.get("g")
    return module_of(path)


def test_g4_a_graph_that_cannot_be_loaded_is_an_error_of_that_graph_alone(tmp_path: Path) -> None:
    """G4 / P1: an import that fails, a variable that is no graph, a factory of a shape
    the server cannot call and a factory that raises are each an error naming the graph
    and its spec, the same on every use (the module imported once); the other graphs
    load and run."""
    counter = tmp_path / "imports.txt"
    broken = write_module(
        tmp_path / f"{unique('broken')}.py",
        f"from pathlib import Path\np = Path({str(counter)!r})\n"
        "p.write_text((p.read_text() if p.exists() else '') + 'x')\nraise RuntimeError('boom')\n",
    )
    write_module(tmp_path / "echo.py", GRAPH_MODULE + "graph = builder.compile()\n")
    shapes = write_module(
        tmp_path / f"{unique('shapes')}.py",
        "def three(a, b, c):\n    pass\n\n\ndef raises(config):\n    raise ValueError('nope')\n",
    )
    registry = GraphRegistry.from_config(
        write_config(
            tmp_path,
            {
                "good": "echo.py:graph",
                "broken": f"{broken.name}:graph",
                "three": f"{shapes.name}:three",
                "raises": f"{shapes.name}:raises",
            },
        )
    )
    errors = {g: registry.check(g) for g in registry.ids()}
    assert errors["good"] is None
    assert "RuntimeError('boom')" in str(errors["broken"]) and broken.name in str(errors["broken"])
    assert "must take 0, 1 or 2 parameters" in str(errors["three"])
    assert "ValueError('nope')" in str(errors["raises"]) and "'raises'" in str(errors["raises"])
    for _ in range(2):
        with pytest.raises(GraphConfigError) as caught:
            registry.get("broken")
        assert caught.value is errors["broken"]
    assert counter.read_text() == "x"
    graph = registry.get("good")
    assert graph.invoke({"messages": [HumanMessage("hi")]})["messages"][-1].content == "echo"


FACTORY_GRAPH = PROJECT_ROOT / "tests" / "graphs" / "factory.py"


def factory_registry(tmp_path: Path) -> GraphRegistry:
    return GraphRegistry.from_config(write_config(tmp_path, {"factory": f"{FACTORY_GRAPH}:graph"}))


async def run_factory(
    registry: GraphRegistry, context: dict[str, Any], user: AuthUser | None = None
) -> tuple[list[str], dict[str, Any]]:
    """One run of the factory graph as a worker makes it: its nodes and its last answer."""
    runtime = server_runtime("threads.create_run", store=None, user=user, context=context)
    async with registry.open("factory", {"configurable": {}}, runtime) as graph:
        saved = graph.copy(update={"checkpointer": InMemorySaver()})
        config = RunnableConfig(configurable={"thread_id": str(uuid.uuid4())})
        human = {"messages": [HumanMessage("Say hello.")]}
        out = await saved.ainvoke(human, config, context=context)
        return sorted(graph.nodes), out["messages"][-1]


@pytest.mark.parametrize(
    ("context", "model", "tools", "says"),
    [
        ({}, "gpt-4o-mini", ["search_web"], "Hello!"),
        ({"model": "openai/gpt-4o"}, "gpt-4o", ["search_web"], "Hello!"),
        ({"enable_search": False}, "gpt-4o-mini", [], "Hello!"),
        (
            {"system_prompt": "Always respond in French."},
            "gpt-4o-mini",
            ["search_web"],
            "Bonjour !",
        ),
    ],
    ids=["default context", "model override", "search disabled", "custom system prompt"],
)
def test_p1_an_async_context_manager_factory_of_config_and_runtime_runs(
    tmp_path: Path, context: dict[str, Any], model: str, tools: list[str], says: str
) -> None:
    """P1: the factory form `@asynccontextmanager graph(config, runtime: ServerRuntime[Ctx])`
    loads and runs: the run's context shapes the graph (search off: no tools node) and
    reaches the node through `Runtime[Ctx]` (model, system prompt), defaults included."""
    registry = factory_registry(tmp_path)
    assert registry.check("factory") is None
    nodes, answer = asyncio.run(run_factory(registry, context))
    assert ("tools" in nodes) == bool(tools)
    assert answer.content == says
    assert answer.response_metadata["model_name"] == model
    assert answer.response_metadata["tools"] == tools


def test_p1_the_factory_runtime_carries_the_runs_user(tmp_path: Path) -> None:
    """P1: `runtime.user` is the run's user: an admin's graph gets the admin tool."""
    admin = AuthUser({"identity": "root", "permissions": ["admin"]})
    _, answer = asyncio.run(run_factory(factory_registry(tmp_path), {}, admin))
    assert answer.response_metadata["tools"] == ["search_web", "delete_user"]


def test_p1_the_factory_graph_streams_updates(tmp_path: Path) -> None:
    """P1: a factory's graph streams like any other."""
    registry = factory_registry(tmp_path)

    async def stream() -> list[Any]:
        runtime = server_runtime("threads.create_run", store=None, context={})
        async with registry.open("factory", None, runtime) as graph:
            human = {"messages": [HumanMessage("hi")]}
            return [c async for c in graph.astream(human, stream_mode="updates", context={})]

    chunks = asyncio.run(stream())
    assert chunks and "call_model" in chunks[0]
