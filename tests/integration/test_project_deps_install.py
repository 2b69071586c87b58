"""A real `pip install -e` of a local `dependencies` entry (shared/tools/project_deps.py),
into a throwaway venv so that this environment's venv is never modified.

The venv is made with `--system-site-packages --without-pip`: the base interpreter's pip
(and packages) are seen through it, and installs go into the venv's own site-packages. The
build backend comes from the index through build isolation (pip's cache), unless setuptools
and wheel are already importable there (then `--no-build-isolation`, offline).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shared.project import Project, ProjectConfig
from shared.tools import project_deps as deps

TIMEOUT_S = 120


def test_a_local_project_is_installed_into_the_venv_and_then_left_alone(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
        timeout=TIMEOUT_S,
    )
    python = str(venv / "bin" / "python")

    lib = tmp_path / "project" / "lib"
    (lib / "trdeps_fixture").mkdir(parents=True)
    (lib / "trdeps_fixture" / "__init__.py").write_text("ANSWER = 42\n")
    (lib / "pyproject.toml").write_text(
        "[build-system]\n"
        'requires = ["setuptools>=64"]\n'
        'build-backend = "setuptools.build_meta"\n\n'
        "[project]\n"
        'name = "trdeps-fixture"\n'
        'version = "0.1.0"\n\n'
        "[tool.setuptools]\n"
        'packages = ["trdeps_fixture"]\n'
    )
    path = tmp_path / "project" / "langgraph.json"
    raw = {"graphs": {"g": "./g.py:graph"}, "dependencies": ["./lib", "packaging"]}
    path.write_text(json.dumps(raw))
    project = Project(path.resolve(), ProjectConfig.model_validate(raw))
    data = tmp_path / "data"

    [step] = deps.plan(project, python=python, data_dir=data)
    assert step.pip_args == ("-e", str(lib.resolve()))
    assert step.reason == "trdeps-fixture is not installed"
    # the real venv does not have it either, and is not touched
    assert deps.plan(project, data_dir=data) == [step]

    offline = subprocess.run([python, "-c", "import setuptools, wheel"], check=False).returncode
    said: list[str] = []
    deps.install(
        [step],
        said.append,
        python=python,
        data_dir=data,
        pip_args=["--no-build-isolation"] if offline == 0 else [],
    )
    assert said == [
        f"installing dependency './lib' from {project.path} (trdeps-fixture is not installed)"
    ]
    done = subprocess.run(
        [python, "-c", "import trdeps_fixture; print(trdeps_fixture.ANSWER)"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    assert done.stdout.strip() == "42"
    assert deps.plan(project, python=python, data_dir=data) == []
    assert [s.entry for s in deps.plan(project, data_dir=data)] == ["./lib"]


def test_a_failed_real_install_is_pips_last_error_line(tmp_path: Path) -> None:
    """pip's own failure (offline: `--no-index`) becomes the one line naming the entry."""
    path = tmp_path / "langgraph.json"
    raw = {"graphs": {"g": "./g.py:graph"}, "dependencies": ["threadrun-no-such-package-31"]}
    path.write_text(json.dumps(raw))
    project = Project(path.resolve(), ProjectConfig.model_validate(raw))
    steps = deps.plan(project, data_dir=tmp_path / "data")
    with pytest.raises(deps.DependencyError) as exc:
        deps.install(steps, lambda _: None, data_dir=tmp_path / "data", pip_args=["--no-index"])
    assert str(exc.value) == (
        f"dependency 'threadrun-no-such-package-31' from {project.path} could not be "
        "installed: No matching distribution found for threadrun-no-such-package-31"
    )
