"""Load the graphs a langgraph.json-compatible config file registers.

The file maps graph ids to specs: `{"graphs": {"agent": "./path/to/file.py:graph"}}`.
A spec is `<file>.py:<variable>` (relative to the config file's folder) or
`<module.sub>:<variable>` (an importable module, imported with the config file's
folder on sys.path). The variable may be a compiled graph, a `StateGraph` (compiled
here), or a factory in any form the official server accepts (shared/agent/factories.py):
called on every use, as the server calls it, and what it returns opened for that use
(awaited, or entered as a context manager and exited afterwards).

Graphs are compiled without a checkpointer; the runtime attaches its own per run with
`graph.copy(update={"checkpointer": saver})`.

A graph that cannot be loaded (its import fails, its variable is missing or no graph, its
factory has a shape the server cannot call) is an error of that graph alone: the error is
kept and raised on every use of that graph, the other graphs are served.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    AsyncExitStack,
    ExitStack,
    asynccontextmanager,
    contextmanager,
)
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar, cast
from uuid import UUID, uuid5

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config, var_child_runnable_config
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel

from shared.agent.factories import (
    AccessContext,
    AnyRuntime,
    FactoryCall,
    FactoryShapeError,
    classify,
    server_runtime,
)
from shared.errors import AssistantNotFound, ConfigError
from shared.project import ProjectConfigError, load_project

# The namespace the LangGraph Agent Server derives its per-graph assistant ids from, so
# a graph's default assistant has the same id here as on the official server.
ASSISTANT_NAMESPACE = UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_NOT_WORD = re.compile(r"\W")
# Guards sys.path and sys.modules edits; graph modules import one at a time.
_import_lock = threading.Lock()

Graph = Pregel[Any, Any, Any, Any]
T = TypeVar("T")


class GraphConfigError(ConfigError):
    """The graphs config file, a graph spec or the object it names is unusable."""


class GraphNotFound(AssistantNotFound, KeyError):
    """No graph (or assistant) with this id is registered (still a KeyError for lookups)."""

    def __init__(self, graph_id: str) -> None:
        super().__init__(graph_id)
        self.graph_id = graph_id

    def __str__(self) -> str:
        return f"no graph or assistant {self.graph_id!r} is registered"


def assistant_id_for(graph_id: str) -> str:
    """The deterministic id of a graph's default assistant."""
    return str(uuid5(ASSISTANT_NAMESPACE, graph_id))


@dataclass(frozen=True)
class GraphSpec:
    """Where a graph lives: a file (or, for a module spec, the folder put on sys.path)."""

    graph_id: str
    path: Path
    attr: str
    module: str | None = None

    @classmethod
    def parse(cls, graph_id: str, spec: str, base: Path) -> GraphSpec:
        """Parse `file.py:var` (relative to `base`) or `module.sub:var`."""
        where, sep, attr = spec.rpartition(":")
        if not sep or not where or not _IDENTIFIER.fullmatch(attr):
            raise GraphConfigError(
                f"graph {graph_id!r}: spec {spec!r} is not 'path/to/file.py:variable' "
                "or 'package.module:variable'"
            )
        if where.endswith(".py") or "/" in where or "\\" in where:
            path = (base / where).resolve()
            if not path.is_file():
                raise GraphConfigError(f"graph {graph_id!r}: file {path} does not exist")
            return cls(graph_id, path, attr)
        if not _MODULE.fullmatch(where):
            raise GraphConfigError(f"graph {graph_id!r}: {where!r} is not a module name")
        return cls(graph_id, base.resolve(), attr, module=where)

    @property
    def source(self) -> str:
        """The spec as written back: `path:attr` or `module:attr`."""
        return f"{self.module or self.path}:{self.attr}"


@contextmanager
def _on_sys_path(folder: Path) -> Iterator[None]:
    entry = str(folder)
    added = entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if added and entry in sys.path:
            sys.path.remove(entry)


def _import(spec: GraphSpec) -> ModuleType:
    if spec.module is not None:
        with _on_sys_path(spec.path):
            return importlib.import_module(spec.module)
    digest = hashlib.sha1(str(spec.path).encode(), usedforsecurity=False).hexdigest()[:12]
    name = f"_threadrun_graph_{_NOT_WORD.sub('_', spec.path.stem)}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, spec.path)
    if module_spec is None or module_spec.loader is None:
        raise GraphConfigError(f"graph {spec.graph_id!r}: cannot load {spec.path}")
    module = importlib.util.module_from_spec(module_spec)
    # Registered before running: dataclasses, pydantic and pickling look classes up there.
    sys.modules[name] = module
    try:
        with _on_sys_path(spec.path.parent):
            module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


@dataclass(frozen=True, slots=True)
class Factory:
    """A graph variable that is a factory, and how the server calls it."""

    fn: Callable[..., object]
    call: FactoryCall


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end from sync code: on a fresh loop, in a helper thread when this
    thread already runs a loop (a worker's state read on its runtime loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="graph-factory") as pool:
        return pool.submit(asyncio.run, coro).result()


def _is_async_cm(value: object) -> bool:
    return hasattr(value, "__aenter__") and hasattr(value, "__aexit__")


def _is_sync_cm(value: object) -> bool:
    return hasattr(value, "__enter__") and hasattr(value, "__exit__")


@asynccontextmanager
async def _opened(graph_id: str, made: object, what: str) -> AsyncIterator[Graph]:
    """What a factory returned, opened for one use: an async or sync context manager
    entered (and exited when the use ends), an awaitable awaited, a graph as it is."""
    async with AsyncExitStack() as stack:
        try:
            if _is_async_cm(made):
                value = await stack.enter_async_context(
                    cast(AbstractAsyncContextManager[Any], made)
                )
            elif _is_sync_cm(made):
                value = stack.enter_context(cast(AbstractContextManager[Any], made))
            elif inspect.isawaitable(made):
                value = await made
            else:
                value = made
        except Exception as exc:
            raise GraphConfigError(f"graph {graph_id!r}: {what} failed: {exc!r}") from exc
        yield _as_graph(graph_id, value)


@contextmanager
def _opened_sync(graph_id: str, made: object, what: str) -> Iterator[Graph]:
    """`_opened` from sync code. What only a loop can open (a coroutine, an async context
    manager) is entered and exited at once on a loop of its own: the graph read after
    that is used for its structure (schemas, drawings, state), not to run."""
    if _is_async_cm(made) or inspect.isawaitable(made):

        async def enter_and_leave() -> Graph:
            async with _opened(graph_id, made, what) as graph:
                return graph

        yield _run_sync(enter_and_leave())
        return
    with ExitStack() as stack:
        try:
            if _is_sync_cm(made):
                value = stack.enter_context(cast(AbstractContextManager[Any], made))
            else:
                value = made
        except Exception as exc:
            raise GraphConfigError(f"graph {graph_id!r}: {what} failed: {exc!r}") from exc
        yield _as_graph(graph_id, value)


def _user_of(config: RunnableConfig) -> Any:
    """The run's user as a run's config carries it (the executor puts an AuthUser there)."""
    user = (config.get("configurable") or {}).get("langgraph_auth_user")
    return user if hasattr(user, "identity") else None


def _as_graph(graph_id: str, value: object) -> Graph:
    if isinstance(value, Pregel):
        return value
    if isinstance(value, StateGraph):
        return value.compile()
    raise GraphConfigError(
        f"graph {graph_id!r} is a {type(value).__name__}, not a compiled graph or StateGraph"
    )


class GraphRegistry:
    """The graphs of one config file, imported lazily, once, and cached (thread-safe)."""

    def __init__(self, specs: dict[str, GraphSpec]) -> None:
        self._specs = dict(specs)
        self._loaded: dict[str, Graph | Factory] = {}
        self._errors: dict[str, GraphConfigError] = {}
        self._assistants = {assistant_id_for(g): g for g in self._specs}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, path: Path) -> GraphRegistry:
        """Read the `graphs` of a langgraph.json-compatible file (shared/project.py)."""
        try:
            project = load_project(path)
        except ProjectConfigError as exc:
            raise GraphConfigError(str(exc)) from exc
        specs = {
            graph_id: GraphSpec.parse(graph_id, spec, project.base)
            for graph_id, spec in project.graph_specs().items()
        }
        return cls(specs)

    def ids(self) -> list[str]:
        """Graph ids, in config order."""
        return list(self._specs)

    def spec(self, graph_id: str) -> GraphSpec:
        """Where `graph_id` comes from."""
        try:
            return self._specs[graph_id]
        except KeyError:
            raise GraphNotFound(graph_id) from None

    def resolve(self, assistant_id_or_graph_id: str) -> str:
        """The graph id named directly or by its default assistant's id."""
        if assistant_id_or_graph_id in self._specs:
            return assistant_id_or_graph_id
        try:
            key = str(UUID(assistant_id_or_graph_id))
        except (ValueError, TypeError, AttributeError):
            raise GraphNotFound(assistant_id_or_graph_id) from None
        try:
            return self._assistants[key]
        except KeyError:
            raise GraphNotFound(assistant_id_or_graph_id) from None

    def get(
        self,
        graph_id: str,
        config: RunnableConfig | None = None,
        *,
        access: AccessContext = "assistants.read",
        runtime: AnyRuntime | None = None,
    ) -> Graph:
        """The compiled graph (no checkpointer), for a use outside a run.

        A graph value is compiled once and cached. A factory is called on every `get`, as
        the official server calls it on every use: with `config`, and `runtime` (by
        default the read runtime of `access`, with the config's user and no store); what
        it returns is opened and closed again before the graph is handed back. Raises
        GraphConfigError (the same one on every use) for a graph that cannot be loaded.
        """
        loaded = self._load(self.spec(graph_id))
        if not isinstance(loaded, Factory):
            return loaded
        made, what = self._call(graph_id, loaded, config, access, runtime)
        with _opened_sync(graph_id, made, what) as graph:
            return graph

    @asynccontextmanager
    async def open(
        self, graph_id: str, config: RunnableConfig | None, runtime: AnyRuntime
    ) -> AsyncIterator[Graph]:
        """The graph for one use inside the event loop (a run: `runtime` is the execution
        runtime, with the run's context): a factory is called and what it returns is
        entered, and exited when the `async with` ends. Raises GraphConfigError on entry
        for a graph that cannot be loaded or whose factory fails."""
        loaded = self._load(self.spec(graph_id))
        if not isinstance(loaded, Factory):
            yield loaded
            return
        made, what = self._call(graph_id, loaded, config, runtime.access_context, runtime)
        async with _opened(graph_id, made, what) as graph:
            yield graph

    def reader(self, access: AccessContext) -> GraphReader:
        """These graphs for uses of one access context (`threads.read`: state reads)."""
        return GraphReader(self, access)

    def is_factory(self, graph_id: str) -> bool:
        """Whether `graph_id` is built per use (raises GraphConfigError like `get`)."""
        return isinstance(self._load(self.spec(graph_id)), Factory)

    def check(self, graph_id: str) -> GraphConfigError | None:
        """Why `graph_id` cannot be served, or None: its import and, for a factory, one
        call as a schema read makes it (for a worker's start-up report)."""
        try:
            self.get(graph_id)
        except GraphConfigError as exc:
            return exc
        return None

    def _load(self, spec: GraphSpec) -> Graph | Factory:
        with self._lock:
            loaded = self._loaded.get(spec.graph_id)
            if loaded is not None:
                return loaded
            failed = self._errors.get(spec.graph_id)
            if failed is not None:
                raise failed
            try:
                loaded = _classified(spec, _variable(spec))
            except GraphConfigError as exc:
                self._errors[spec.graph_id] = exc
                raise
            self._loaded[spec.graph_id] = loaded
            return loaded

    def _call(
        self,
        graph_id: str,
        factory: Factory,
        config: RunnableConfig | None,
        access: AccessContext,
        runtime: AnyRuntime | None,
    ) -> tuple[object, str]:
        """Call the factory as the server does (with `ensure_config`'s defaults filled in,
        `__is_for_execution__` in its configurable, and its config as the current one
        while it runs); returns what it returned and how errors name it."""
        spec = self._specs[graph_id]
        what = f"factory {spec.source}"
        full = ensure_config(config)
        full["configurable"] = {
            **(full.get("configurable") or {}),
            "__is_for_execution__": access == "threads.create_run",
        }
        if runtime is None:
            runtime = server_runtime(access, store=None, user=_user_of(full))
        token = var_child_runnable_config.set(full)
        try:
            return factory.call(factory.fn, full, runtime), what
        except Exception as exc:
            raise GraphConfigError(f"graph {graph_id!r}: {what} failed: {exc!r}") from exc
        finally:
            var_child_runnable_config.reset(token)


def _classified(spec: GraphSpec, value: object) -> Graph | Factory:
    """A graph variable as the registry keeps it: a compiled graph, or a factory."""
    if isinstance(value, (Pregel, StateGraph)) or not callable(value):
        return _as_graph(spec.graph_id, value)
    try:
        return Factory(value, classify(value))
    except FactoryShapeError as exc:
        raise GraphConfigError(f"graph {spec.graph_id!r}: {spec.source}: {exc}") from exc


def _variable(spec: GraphSpec) -> object:
    try:
        with _import_lock:
            module = _import(spec)
    except GraphConfigError:
        raise
    except Exception as exc:
        raise GraphConfigError(
            f"graph {spec.graph_id!r}: importing {spec.source} failed: {exc!r}"
        ) from exc
    try:
        return getattr(module, spec.attr)
    except AttributeError:
        raise GraphConfigError(
            f"graph {spec.graph_id!r}: {spec.module or spec.path} has no variable {spec.attr!r}"
        ) from None


def load_variable(name: str, spec: str, base: Path) -> object:
    """The variable a `file.py:var` or `module:var` spec names, loaded like a graph's
    (for config entries beside the graphs, such as the store's embeddings)."""
    return _variable(GraphSpec.parse(name, spec, base))


@dataclass(frozen=True, slots=True)
class GraphReader:
    """The registry's graphs as one kind of use gets them (`threads.read` for the state
    layer): its factories see that access context."""

    registry: GraphRegistry
    access: AccessContext

    def get(self, graph_id: str, config: RunnableConfig | None = None) -> Graph:
        """The graph, as `GraphRegistry.get` with this access context."""
        return self.registry.get(graph_id, config, access=self.access)
