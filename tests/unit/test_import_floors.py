"""The floors of the code: every import arrow runs down or sideways, never back up.

Rooms (top first): `app/` (the web) and `workers/` (the Celery processes) stand on `shared/`
and never import each other; `shared/` never imports either. Inside `shared/`, three floors:

- **tools**: process tooling (`shared/tools/`: `devservices`, `supervisor`, `testing/`, the
  `cli_*` plugins);
- **domain**: the packages of the product (runs, bridge, state, journal, agent, ...);
- **core**: what every floor speaks (vocabulary, settings, errors, serde, logs, metrics,
  Redis clients and keys, Lua, db).

Inside `app/`, its own floors: `responses`/`ids` -> `errors` -> `http` -> `limits` ->
`admission` / `public_ids` -> the views (`api/`, `streaming/`).

Every import counts, function-level ones included (a circle held open by an import inside
a function is still a circle). A new module must be given its floor here, which is the
point: where a thing lives is decided once, in review, not found out later.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.unit.sources import parse

ROOT = Path(__file__).resolve().parents[2]

SHARED_FLOORS: dict[str, int] = {
    # core (0)
    "__init__": 0,
    "vocab": 0,
    "errors": 0,
    "serde": 0,
    "redaction": 0,
    "settings": 0,
    "logs": 0,
    "metrics": 0,
    "gc_tuning": 0,
    "process_nice": 0,
    "redis_clients": 0,
    "redis_keys": 0,
    "lua": 0,
    "db": 0,
    "workspaces": 0,
    "model_errors": 0,
    "project": 0,
    # domain (1)
    "auth": 1,
    "authz": 1,
    "bridge": 1,
    "state": 1,
    "journal": 1,
    "store": 1,
    "memory": 1,
    "agent": 1,
    "runs": 1,
    "assistants": 1,
    "crons": 1,
    "webhooks": 1,
    "ops": 1,
    "retention": 1,
    "genui": 1,
    # process tooling (2)
    "tools": 2,
}
"""`shared/<unit>` -> its floor: 0 core, 1 domain, 2 process tooling."""

SHARED_EXCEPTIONS = {
    # The migration entry point sets up every schema, the store's included (the store's
    # tables are LangGraph's PostgresStore's, created by its own `setup()`).
    ("shared/db/migrate.py", "store"),
}

APP_FLOORS: dict[str, int] = {
    "app.responses": 0,
    "app.ids": 0,
    "app.auth": 0,
    "app.services": 0,
    "app.access_log": 0,  # gunicorn's logger class: the master imports it, keep it light
    "app.gevent_worker": 0,  # gunicorn's worker class: the master imports it too
    "app.authz": 1,  # the project's auth handlers, one call per action (shared/authz/)
    "app.cors": 1,
    "app.errors": 1,
    "app.http": 2,
    "app.schemas": 2,
    "app.limits": 3,
    "app.public_ids": 3,
    "app.admission": 4,
    "app.streaming.frames": 4,
    "app.streaming.sse": 5,
    "app.project_http": 5,  # langgraph.json's `http`: custom app (its sockets too), prefix, ...
    "app.streaming.ws_frames": 5,
    "app.streaming.ws_socket": 0,
    "app.streaming.upgrade": 4,  # every WebSocket's authentication and connection slot
    "app.api": 6,
    "app.protocols": 7,  # thread streaming protocol, MCP, A2A: front ends beside the REST API
    "app.streaming.ws": 7,
    "app": 8,  # the factory wires everything
    "app.gunicorn_conf": 8,
}
"""`app/` modules (or packages) -> floor; a module imports only from floors below its own
(or, inside `app/api/`, from its siblings)."""


def _imports(path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every absolute import in `path`, `from x import y`
    giving `x.y` so that `from shared import lua` names the unit it reaches."""
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                yield f"{node.module}.{alias.name}", node.lineno


def _shared_unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "shared":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _py(top: str) -> list[Path]:
    return sorted((ROOT / top).rglob("*.py"))


def shared_violations() -> list[str]:
    """Arrows of `shared/` that run up a floor, or out to `app/` / `workers/`."""
    out = []
    for path in _py("shared"):
        rel = _rel(path)
        here = _shared_unit(rel.removesuffix(".py").replace("/", "."))
        assert here is not None
        if here not in SHARED_FLOORS:
            out.append(f"{rel}: shared/{here} has no floor in SHARED_FLOORS")
            continue
        for module, line in _imports(path):
            if module.split(".")[0] in ("app", "workers"):
                out.append(f"{rel}:{line} imports {module} (shared/ never imports a room)")
            unit = _shared_unit(module)
            if unit is None or unit == here or (rel, unit) in SHARED_EXCEPTIONS:
                continue
            if unit not in SHARED_FLOORS:
                out.append(f"{rel}:{line}: shared/{unit} has no floor in SHARED_FLOORS")
            elif SHARED_FLOORS[unit] > SHARED_FLOORS[here]:
                out.append(f"{rel}:{line} imports {module}: floor {SHARED_FLOORS[here]} -> up")
    return out


def _app_floor(module: str) -> tuple[str, int] | None:
    """The most specific entry of APP_FLOORS that `module` is or lies in."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in APP_FLOORS:
            return name, APP_FLOORS[name]
    return None


def app_violations() -> list[str]:
    """Arrows of `app/` that run up (or sideways between floors that are not siblings)."""
    out = []
    for path in _py("app"):
        rel = _rel(path)
        module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        here = _app_floor(module)
        if here is None:
            out.append(f"{rel}: no floor in APP_FLOORS")
            continue
        for target, line in _imports(path):
            if target.split(".")[0] == "workers":
                out.append(f"{rel}:{line} imports {target} (the web never imports workers)")
            there = _app_floor(target)
            if there is None or there[0] == here[0] or there[0] == "app":
                continue  # not app/, its own package (api siblings), or `from app import x`
            if there[1] >= here[1]:
                out.append(f"{rel}:{line} imports {target}: floor {here[1]} -> {there[1]}")
    return out


def test_shared_imports_run_down_its_floors() -> None:
    """core <- domain <- tools: no module of `shared/` imports a floor above its own,
    nor `app/` or `workers/`."""
    assert shared_violations() == []


def test_app_imports_run_down_its_floors() -> None:
    """`app/`'s own floors hold: the error map, the request helpers and the limits no
    longer import each other in a circle, and nothing of the web imports the workers."""
    assert app_violations() == []


def test_workers_never_import_the_web() -> None:
    """The worker room stands on `shared/` only."""
    found = [
        f"{_rel(path)}:{line} imports {module}"
        for path in _py("workers")
        for module, line in _imports(path)
        if module.split(".")[0] == "app"
    ]
    assert found == []


def test_the_floor_tables_name_only_what_exists() -> None:
    """A floor entry for a module that is gone would hide the next one of that name."""
    units = {p.name.removesuffix(".py") for p in (ROOT / "shared").iterdir()}
    assert set(SHARED_FLOORS) - units - {"__init__"} == set()
    for name in APP_FLOORS:
        path = ROOT / Path(*name.split("."))
        assert path.with_suffix(".py").exists() or path.is_dir(), name


def shared_circles() -> set[frozenset[str]]:
    """The strongly connected groups of two or more `shared/` units (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {u: set() for u in SHARED_FLOORS}
    for path in _py("shared"):
        here = _shared_unit(_rel(path).removesuffix(".py").replace("/", "."))
        for module, _ in _imports(path):
            unit = _shared_unit(module)
            if unit and here and unit != here and (_rel(path), unit) not in SHARED_EXCEPTIONS:
                graph.setdefault(here, set()).add(unit)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                top = stack.pop()
                group.add(top)
                if top == node:
                    break
            if len(group) > 1:
                out.add(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_shared_units_import_each_other_in_no_circle() -> None:
    """No two `shared/` units (a module, or a package as a whole) import each other, even
    through others: the domain packages stand in an order (runs over assistants, webhooks,
    journal; the agent over memory and the journal)."""
    assert shared_circles() == set()
