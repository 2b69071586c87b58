"""Load the graphs a langgraph.json-compatible config file registers.

The file maps graph ids to specs: `{"graphs": {"agent": "./path/to/file.py:graph"}}`.
A spec is `<file>.py:<variable>` (relative to the config file's folder) or
`<module.sub>:<variable>` (an importable module, imported with the config file's
folder on sys.path). The variable may be a compiled graph, a `StateGraph` (compiled
here), or a factory taking no argument or a `RunnableConfig` that returns either.

Graphs are compiled without a checkpointer; the runtime attaches its own per run with
`graph.copy(update={"checkpointer": saver})`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from uuid import UUID, uuid5

from langchain_core.runnables import RunnableConfig
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel

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
GraphFactory = Callable[[RunnableConfig], object]


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


def _accepts_config(factory: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
    )


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
        self._loaded: dict[str, Graph | GraphFactory] = {}
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

    def get(self, graph_id: str, config: RunnableConfig | None = None) -> Graph:
        """The compiled graph (no checkpointer); `config` goes to factories that take one.

        A graph value, or a no-argument factory's result, is built once and cached. A
        factory that takes a RunnableConfig is called on every `get`, as the LangGraph
        server calls it per run; its module is still imported only once.
        """
        loaded = self._loaded.get(graph_id)
        if loaded is None:
            loaded = self._load(self.spec(graph_id))
        if isinstance(loaded, Pregel):
            return loaded
        return self._build(self._specs[graph_id], loaded, config or RunnableConfig())

    def _load(self, spec: GraphSpec) -> Graph | GraphFactory:
        with self._lock:
            loaded = self._loaded.get(spec.graph_id)
            if loaded is not None:
                return loaded
            value = _variable(spec)
            if isinstance(value, (Pregel, StateGraph)) or not callable(value):
                loaded = _as_graph(spec.graph_id, value)
            elif _accepts_config(value):
                loaded = value
            else:
                loaded = self._build(spec, value, None)
            self._loaded[spec.graph_id] = loaded
            return loaded

    @staticmethod
    def _build(
        spec: GraphSpec, factory: Callable[..., object], config: RunnableConfig | None
    ) -> Graph:
        try:
            value = factory() if config is None else factory(config)
        except Exception as exc:
            raise GraphConfigError(
                f"graph {spec.graph_id!r}: factory {spec.source} failed: {exc!r}"
            ) from exc
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()
            raise GraphConfigError(
                f"graph {spec.graph_id!r}: factory {spec.source} is async; "
                "only synchronous factories are supported"
            )
        return _as_graph(spec.graph_id, value)


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
