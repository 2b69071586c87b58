"""S5: `CheckpointStateAccessor` is the only path to checkpointed state.

Outside `shared/state/`, no module imports LangGraph's checkpoint savers or calls a graph's
or a saver's state methods; the worker runtime only builds its savers (and binds graphs to
them for execution), and `migrate` only runs the saver's `setup()`. New code that reaches
for a saver directly fails here, which is how the rule is kept.
"""

from __future__ import annotations

import ast
from pathlib import Path

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
    ("shared/runs/manager.py", "delete_thread"),
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
    tree = ast.parse(path.read_text(), filename=rel)
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
