"""Generative UI at the web's start (shared/genui/build.py): what `ui` adds to a process
start, beside reading and validating the project file (which every process does anyway),
measured interleaved in the same run.

Run with `.venv/bin/python -m bench.genui [--n 20]`. It needs npm once (esbuild goes into
`.threadrun/genui`, as for the tests) and builds the fixture project of
tests/fixtures/genui_project/ into temporary folders, removed at the end. No services.

Rows (p50/p99 µs per start, and the ratio to parse_project beside it):
- a project without `ui` (the catalog is empty: no lock, no folder);
- an unchanged restart (the cached build found, every input's sha256 checked);
- the first start with a new source (one esbuild run per entry; esbuild already installed);
- `UiBundle.tags` (the body of one POST /ui/{graph}).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from bench.chaos import table
from bench.store import Row, timed
from shared.genui import build as genui_build
from shared.genui import build_catalog, esbuild
from shared.project import parse_project
from shared.settings import PROJECT_ROOT, Settings

FIXTURE = PROJECT_ROOT / "tests" / "fixtures" / "genui_project"
TOOLS = PROJECT_ROOT / ".threadrun" / "genui"


def _settings(folder: Path, version: str) -> Settings:
    root = folder / "genui"
    root.mkdir(parents=True)
    (root / f"esbuild-{version}").symlink_to(TOOLS / f"esbuild-{version}")
    return Settings(genui_dir=root)


def run(n: int) -> list[Row]:
    """Time every row, ours and the baseline interleaved."""
    version = Settings().genui_esbuild_version
    with genui_build._locked(TOOLS):
        esbuild.install(TOOLS, version, 300)
    work = Path(tempfile.mkdtemp(prefix="bench-genui-"))
    try:
        project_dir = work / "project"
        shutil.copytree(FIXTURE, project_dir)
        graph = PROJECT_ROOT / "tests" / "graphs" / "genui_graph.py"
        config = json.loads((project_dir / "langgraph.json").read_text())
        config["graphs"] = {"genui": f"{graph}:graph"}
        (project_dir / "langgraph.json").write_text(json.dumps(config))
        plain_dir = work / "plain"
        plain_dir.mkdir()
        (plain_dir / "langgraph.json").write_text(json.dumps({"graphs": config["graphs"]}))
        path, plain = project_dir / "langgraph.json", plain_dir / "langgraph.json"
        cached = _settings(work / "cached", version)
        build_catalog(parse_project(path), cached)
        rows = {name: Row(name, [], []) for name in ("no ui", "unchanged restart", "cold build")}
        rows["tags"] = Row("UiBundle.tags (POST /ui body)", [], [])
        source = project_dir / "ui" / "weather.tsx"
        text = source.read_text()
        bundle = build_catalog(parse_project(path), cached).get("genui")
        assert bundle is not None
        for i in range(n):
            rows["no ui"].baseline.append(timed(lambda: parse_project(plain)))
            rows["no ui"].ours.append(timed(lambda: build_catalog(parse_project(plain), cached)))
            rows["unchanged restart"].baseline.append(timed(lambda: parse_project(path)))
            rows["unchanged restart"].ours.append(
                timed(lambda: build_catalog(parse_project(path), cached))
            )
            source.write_text(f"{text}\n// edit {i}\n")  # a new content: rebuilt
            rows["cold build"].baseline.append(timed(lambda: parse_project(path)))
            rows["cold build"].ours.append(
                timed(lambda: build_catalog(parse_project(path), cached))
            )
            rows["tags"].baseline.append(timed(lambda: parse_project(plain)))
            rows["tags"].ours.append(timed(lambda: bundle.tags("weather")))
        source.write_text(text)
        for name in ("no ui", "unchanged restart", "cold build"):
            rows[name].name = f"start: {name} (build_catalog + parse)"
        return list(rows.values())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="starts per row")
    args = parser.parse_args()
    rows = run(args.n)
    head = ["operation", "p50 µs", "p99 µs", "parse_project p50 µs", "ours/baseline"]
    print(f"genui: {args.n} starts per row\n" + table(head, [r.cells() for r in rows]))


if __name__ == "__main__":
    main()
