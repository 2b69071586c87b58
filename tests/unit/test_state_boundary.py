"""S5: `CheckpointStateAccessor` is the only path to checkpointed state, both ways.

Outside `shared/state/`, no module imports LangGraph's checkpoint savers or calls a graph's
or a saver's state methods; the worker runtime only builds its savers (and binds graphs to
them for execution), and `migrate` only runs the saver's `setup()`. Inside it, no module
imports the agent layer (`shared.agent`): the accessor is given its graphs (a
`GraphSource`), so the state layer stays below the agent. New code that crosses either
way fails here, which is how the rule is kept.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.sources import parse

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("app", "workers", "shared")
STATE_PACKAGE = ROOT / "shared" / "state"

STATE_CALLS = {
    "get_state",
    "aget_state",
    "update_state",
    "aupdate_state",
    "bulk_update_state",
    "abulk_update_state",
    "get_state_history",
    "aget_state_history",
    "get_tuple",
    "aget_tuple",
    "put_writes",
    "aput_writes",
    "delete_thread",
    "adelete_thread",
}
"""Graph and saver methods that read or write checkpoints."""

ALLOWED_IMPORTS = {
    ("shared/db/migrate.py", "langgraph.checkpoint.postgres"),  # PostgresSaver.setup()
    ("workers/runtime.py", "shared.state.savers"),  # builds the process's savers
    ("workers/executor.py", "shared.state.savers"),  # the fence's configurable keys
}
ALLOWED_CALLS = {
    # RunManager.delete_thread deletes thread rows, not checkpoints.
    ("app/api/threads.py", "delete_thread"),
    ("app/api/assistants.py", "delete_thread"),  # `delete_threads`: as DELETE /threads/{id}
    ("shared/runs/manager.py", "delete_thread"),
    ("shared/retention/removal.py", "delete_thread"),  # RunManager's, with its purge
}


def _modules() -> list[Path]:
    out = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if STATE_PACKAGE not in path.parents:
                out.append(path)
    return out


def _violations(path: Path, rel: str | None = None) -> list[str]:
    rel = rel or path.relative_to(ROOT).as_posix()
    tree = parse(path, rel)
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            if (
                name.startswith("langgraph.checkpoint") or name.startswith("shared.state.savers")
            ) and not any(rel == p and name.startswith(m) for p, m in ALLOWED_IMPORTS):
                found.append(f"{rel}:{node.lineno} imports {name}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in STATE_CALLS
            and (rel, node.func.attr) not in ALLOWED_CALLS
        ):
            found.append(f"{rel}:{node.lineno} calls .{node.func.attr}()")
        if isinstance(node, ast.Attribute) and node.attr == "checkpointer":
            found.append(f"{rel}:{node.lineno} reads .checkpointer")
    return found


def test_s5_accessor_is_the_only_path_to_checkpoints() -> None:
    """S5: no module outside shared/state/ touches a saver or a graph's state methods."""
    violations = [v for path in _modules() for v in _violations(path)]
    assert violations == [], "use CheckpointStateAccessor instead:\n" + "\n".join(violations)


def test_s5_the_boundary_check_catches_a_direct_saver_call(tmp_path: Path) -> None:
    """The check itself works: a module that calls aget_tuple and imports a saver is caught."""
    bad = tmp_path / "probe.py"
    bad.write_text(
        "from langgraph.checkpoint.postgres import PostgresSaver\n"
        "async def f(graph):\n"
        "    return await graph.checkpointer.aget_tuple({})\n"
    )
    found = _violations(bad, "workers/probe.py")
    assert len(found) == 3, found


def _imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import in `tree`, relative ones resolved against `package`;
    `from a import b` yields both `a` and `a.b` (b may be a module)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


def _agent_imports(path: Path, rel: str) -> list[str]:
    """Imports of `shared.agent` (or anything under it) in one module of the state package."""
    package = rel.removesuffix(".py").replace("/", ".").rpartition(".")[0]
    tree = parse(path, rel)
    hits: dict[int, str] = {}
    for line, name in _imported_modules(tree, package):
        if name == "shared.agent" or name.startswith("shared.agent."):
            hits.setdefault(line, name)
    return [f"{rel}:{line} imports {name}" for line, name in sorted(hits.items())]


def test_s5_the_state_layer_does_not_import_the_agent_layer() -> None:
    """S5: nothing under shared/state/ imports shared.agent (graphs come in as arguments)."""
    violations = [
        v
        for path in sorted(STATE_PACKAGE.rglob("*.py"))
        for v in _agent_imports(path, path.relative_to(ROOT).as_posix())
    ]
    assert violations == [], "pass the graph in (a GraphSource) instead:\n" + "\n".join(violations)


def test_s5_the_agent_import_check_catches_every_spelling(tmp_path: Path) -> None:
    """The check itself works: absolute, `from shared import agent` and relative imports."""
    bad = tmp_path / "probe.py"
    bad.write_text(
        "import shared.agent.graphs\n"
        "from shared import agent\n"
        "from shared.agent.graphs import GraphRegistry\n"
        "from ..agent import model\n"
        "from . import modes\n"
        "from shared.agentic import x\n"
    )
    found = _agent_imports(bad, "shared/state/probe.py")
    assert [f.split(":")[1].split()[0] for f in found] == ["1", "2", "3", "4"], found
