"""The dev loop's watcher (THREADRUN_RELOAD=true, ``make dev``): have the served graphs' files
changed?

A polling loop over mtimes, not a watcher library: neither watchfiles nor watchdog is a
dependency, the set is small (the graph modules named in langgraph.json, their package
directories, the project file), and the supervisor already wakes every 100 ms; one pass over a
few hundred files is a few milliseconds of stat calls.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path

from shared.project import Project


def watched_roots(project: Project, config: Path) -> list[Path]:
    """The project file and, per graph, its file's directory (``file.py:var``) or its
    module's package directory (``pkg.mod:var``)."""
    roots = [config.resolve()]
    for spec in project.graph_specs().values():
        target = spec.rsplit(":", 1)[0]
        if target.endswith(".py") or "/" in target:
            roots.append((project.base / target).resolve().parent)
            continue
        found = importlib.util.find_spec(target.split(".")[0])
        if found is None or not found.origin:
            continue
        origin = Path(found.origin).resolve()
        # a package: its directory; a lone module: just its file (not all of site-packages)
        roots.append(origin.parent if found.submodule_search_locations else origin)
    return roots


def snapshot(roots: Iterable[Path]) -> dict[Path, float]:
    """Path -> mtime of every ``.py`` / ``.json`` file under the roots (a root may be a file)."""
    seen: dict[Path, float] = {}
    for root in roots:
        files = [root] if root.is_file() else [*root.rglob("*.py"), *root.rglob("*.json")]
        for path in files:
            try:
                seen[path] = path.stat().st_mtime
            except OSError:
                continue  # removed between the listing and the stat
    return seen


class ReloadWatch:
    """``changed()`` is True once per change of the watched files (added, edited, removed)."""

    def __init__(self, roots: Iterable[Path]) -> None:
        self.roots = list(roots)
        self.last = snapshot(self.roots)

    def changed(self) -> bool:
        """Compare with the last snapshot and keep the new one."""
        now = snapshot(self.roots)
        if now == self.last:
            return False
        self.last = now
        return True
