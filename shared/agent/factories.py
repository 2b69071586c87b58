"""Graph factories as the LangGraph Agent Server calls them.

A graph variable that is callable (and not a graph itself) is a factory. The server
classifies it once, by its parameters (langgraph_api 0.16.7, `_factory_utils.py`), and
calls it on every use of the graph, never once for all: for each run (access context
`threads.create_run`, the runtime carrying the run's `context`), for each schema, drawing
or subgraph read (`assistants.read`), for state reads (`threads.read`) and updates
(`threads.update`). It takes nothing, a RunnableConfig, the server runtime, or both (by
keyword, in either order); sync or async, it returns the graph, an awaitable of it, or a
sync or async context manager yielding it, entered for the use and exited afterwards
(shared/agent/graphs.py opens what it returns).

The runtime is told apart from the config by its annotation (`ServerRuntime`,
`ServerRuntime[Ctx]`, the SDK's concrete runtime classes, `Annotated[...]` of them), as on
the official server; here an unannotated parameter named `runtime` is the runtime too (the
official server would pass it the config, which no factory written for it expects).
"""

from __future__ import annotations

import copy
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, get_args, get_origin

from langchain_core.runnables import RunnableConfig
from langgraph_sdk.runtime import (
    AccessContext,
    ServerRuntime,
    _ExecutionRuntime,
    _ReadRuntime,
)

from shared.errors import ConfigError

if TYPE_CHECKING:
    from langgraph.store.base import BaseStore
    from langgraph_sdk.auth.types import BaseUser

__all__ = [
    "AccessContext",
    "AnyRuntime",
    "FactoryCall",
    "FactoryShapeError",
    "ServerRuntime",
    "classify",
    "server_runtime",
]

AnyRuntime = ServerRuntime[Any]
"""The server runtime of any context schema."""

RUN_ACCESS: AccessContext = "threads.create_run"
"""The access context of a run: the only one whose runtime carries the run's `context`."""

_RUNTIME_CLASSES = (_ExecutionRuntime, _ReadRuntime)
# String annotations resolve against the factory's module plus these names, so a module
# may import ServerRuntime under TYPE_CHECKING only (as the official server allows).
_LOCALNS: dict[str, Any] = {
    "ServerRuntime": ServerRuntime,
    "RunnableConfig": RunnableConfig,
    "Config": RunnableConfig,
}
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


class FactoryShapeError(ConfigError, ValueError):
    """A factory's parameters are not a shape the server can call."""


@dataclass(frozen=True, slots=True)
class FactoryCall:
    """How to call one factory: which parameter takes the config and which the runtime
    (None: not taken), and whether each goes by position (a positional-only parameter)."""

    config: str | None = None
    runtime: str | None = None
    positional: tuple[str, ...] = ()

    def __call__(
        self, factory: Callable[..., object], config: RunnableConfig, runtime: AnyRuntime
    ) -> object:
        """Call `factory` with what it takes."""
        values: dict[str, object] = {}
        if self.config is not None:
            values[self.config] = config
        if self.runtime is not None:
            values[self.runtime] = runtime
        args = [values.pop(name) for name in self.positional]
        return factory(*args, **values)


def _is_runtime_annotation(annotation: Any) -> bool:
    if annotation is inspect.Parameter.empty:
        return False
    if annotation is ServerRuntime:
        return True
    if isinstance(annotation, type):
        return issubclass(annotation, _RUNTIME_CLASSES)
    origin = get_origin(annotation)
    if origin is None:
        return False
    if origin is ServerRuntime:
        return True
    args = get_args(annotation)  # Annotated[ServerRuntime, ...]: its first argument
    return bool(args) and _is_runtime_annotation(args[0])


def _hints(factory: Callable[..., object]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(factory, localns=_LOCALNS)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: read it as written
        return {}


def classify(factory: Callable[..., object]) -> FactoryCall:
    """How the server calls `factory` (0, 1 or 2 parameters besides `*args`/`**kwargs`):
    one parameter takes the runtime when annotated so, else the config; of two, one must
    be the runtime and the other takes the config. Raises FactoryShapeError otherwise."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError) as exc:
        raise FactoryShapeError(f"cannot read the parameters of {factory!r}: {exc}") from exc
    params = [p for p in signature.parameters.values() if p.kind not in _VARIADIC]
    hints = _hints(factory)

    def is_runtime(p: inspect.Parameter) -> bool:
        annotation = hints.get(p.name, p.annotation)
        if annotation is inspect.Parameter.empty:
            return p.name == "runtime"
        return _is_runtime_annotation(annotation)

    positional = tuple(p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY)
    if not params:
        return FactoryCall()
    if len(params) == 1:
        (only,) = params
        if is_runtime(only):
            return FactoryCall(runtime=only.name, positional=positional)
        return FactoryCall(config=only.name, positional=positional)
    if len(params) == 2:
        runtimes = [p for p in params if is_runtime(p)]
        if len(runtimes) != 1:
            raise FactoryShapeError(
                f"graph factory {factory!r} can only take a ServerRuntime and/or a "
                f"RunnableConfig, got {[str(p) for p in params]}"
            )
        (rt,) = runtimes
        (cfg,) = [p for p in params if p is not rt]
        return FactoryCall(config=cfg.name, runtime=rt.name, positional=positional)
    raise FactoryShapeError(
        f"graph factory {factory!r} must take 0, 1 or 2 parameters, "
        f"got {len(params)}: {[p.name for p in params]}"
    )


def server_runtime(
    access_context: AccessContext,
    *,
    store: BaseStore | None,
    user: BaseUser | None = None,
    context: Any = None,
) -> AnyRuntime:
    """The runtime a factory gets: the SDK's execution runtime (with a shallow copy of
    the run's `context`) for a run, its read runtime for every other access.

    The SDK's own classes (langgraph_sdk.runtime), so `runtime.execution_runtime`,
    `ensure_user()` and isinstance checks behave as on the official server. `store` is
    None where no store is at hand (a read outside a run, or a run without a user: the
    unscoped store is never a graph's).
    """
    the_store = typing.cast("BaseStore", store)
    if access_context == RUN_ACCESS:
        return _ExecutionRuntime(
            access_context=access_context,
            user=user,
            store=the_store,
            context=copy.copy(context) if context is not None else None,
        )
    return _ReadRuntime(access_context=access_context, user=user, store=the_store)
