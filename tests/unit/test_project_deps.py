"""`dependencies` of langgraph.json (shared/tools/project_deps.py): what `plan`
finds missing from the venv, the stamp that makes the next start plan nothing, and the
supervisor's hook. Nothing here runs a real pip (tests/integration/test_project_deps_install.py
does, in a throwaway venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.project import Project, ProjectConfig, load_project
from shared.settings import PROJECT_ROOT, Settings
from shared.tools import project_deps as deps


def make_project(folder: Path, dependencies: list[str]) -> Project:
    """A langgraph.json in `folder` with these dependencies."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "langgraph.json"
    raw = {"graphs": {"g": "./g.py:graph"}, "dependencies": dependencies}
    path.write_text(json.dumps(raw))
    return Project(path.resolve(), ProjectConfig.model_validate(raw))


def pyproject(folder: Path, name: str, dependencies: list[str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["[project]", f'name = "{name}"', 'version = "0.1"']
    if dependencies is not None:
        lines.append("dependencies = " + json.dumps(dependencies))
    (folder / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture
def fake_pip(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """`_pip` that succeeds without running pip; the argument lists it was given."""
    calls: list[list[str]] = []

    def run(python: str, args: list[str]) -> tuple[int, str]:
        calls.append(list(args))
        return 0, "Successfully installed"

    monkeypatch.setattr(deps, "_pip", run)
    return calls


def test_a_satisfied_package_plans_nothing(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", ["pydantic", "pydantic>=2", "packaging"])
    assert deps.plan(project, data_dir=tmp_path / "data") == []


def test_an_unsatisfied_version_plans_an_install(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", ["pydantic<1"])
    [step] = deps.plan(project, data_dir=tmp_path / "data")
    assert step.entry == "pydantic<1" and step.kind == "package"
    assert step.pip_args == ("pydantic<1",)
    assert "pydantic 2." in step.reason and "<1 is needed" in step.reason


def test_an_unknown_package_plans_an_install(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", ["threadrun-no-such-package-31"])
    [step] = deps.plan(project, data_dir=tmp_path / "data")
    assert step.pip_args == ("threadrun-no-such-package-31",)
    assert step.reason == "threadrun-no-such-package-31 is not installed"


def test_a_marker_that_does_not_apply_is_satisfied(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", ['threadrun-no-such-package-31; python_version < "3"'])
    assert deps.plan(project, data_dir=tmp_path / "data") == []


def test_a_url_requirement_is_satisfied_by_its_name(tmp_path: Path) -> None:
    url = "git+https://example.invalid/org/repo.git@main"
    project = make_project(
        tmp_path / "p", [f"pydantic @ {url}", f"{url}#egg=packaging", f"nope-31 @ {url}"]
    )
    [step] = deps.plan(project, data_dir=tmp_path / "data")
    assert step.entry == f"nope-31 @ {url}"


def test_a_bare_url_is_installed_once(tmp_path: Path, fake_pip: list[list[str]]) -> None:
    """No name to look for: the stamp records it, and the next plan is empty."""
    url = "git+https://example.invalid/org/repo.git@main"
    project = make_project(tmp_path / "p", [url])
    steps = deps.plan(project, data_dir=tmp_path / "data")
    assert [s.pip_args for s in steps] == [(url,)]
    deps.install(steps, lambda _: None, data_dir=tmp_path / "data")
    assert deps.plan(project, data_dir=tmp_path / "data") == []


def test_the_repo_itself_is_always_satisfied(tmp_path: Path) -> None:
    """The repo's own langgraph.json says `"."`: that is threadrun, never installed here."""
    project = load_project(PROJECT_ROOT / "langgraph.json")
    assert project.config.dependencies == ["."]
    assert deps.plan(project, data_dir=tmp_path / "data") == []
    absolute = make_project(tmp_path / "p", [str(PROJECT_ROOT)])
    assert deps.plan(absolute, data_dir=tmp_path / "data") == []


def test_a_local_project_not_installed_plans_an_editable_install(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", ["./lib"])
    lib = pyproject(tmp_path / "p" / "lib", "threadrun-fixture-31")
    [step] = deps.plan(project, data_dir=tmp_path / "data")
    assert step.kind == "project" and step.entry == "./lib"
    assert step.pip_args == ("-e", str(lib.resolve()))
    assert step.reason == "threadrun-fixture-31 is not installed"


def test_a_missing_folder_is_an_error_naming_it(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", ["./nowhere"])
    with pytest.raises(deps.DependencyError) as exc:
        deps.plan(project, data_dir=tmp_path / "data")
    message = str(exc.value)
    assert "'./nowhere'" in message and str(project.path) in message
    assert str((tmp_path / "p" / "nowhere").resolve()) in message and "does not exist" in message


def test_a_spec_that_is_neither_is_an_error(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", ["not a requirement!"])
    with pytest.raises(deps.DependencyError, match="'not a requirement!' of .*langgraph.json"):
        deps.plan(project, data_dir=tmp_path / "data")


def test_the_stamp_makes_the_next_plan_empty_until_the_pyproject_changes(
    tmp_path: Path, fake_pip: list[list[str]]
) -> None:
    """A project whose name is installed (here `packaging`, so that no real install is
    needed) is installed once from its folder; then nothing, until its pyproject changes."""
    data = tmp_path / "data"
    project = make_project(tmp_path / "p", ["./lib"])
    lib = pyproject(tmp_path / "p" / "lib", "packaging")
    [step] = deps.plan(project, data_dir=data)
    assert step.reason == "not installed from this folder yet"

    said: list[str] = []
    deps.install([step], said.append, data_dir=data)
    assert fake_pip == [["-e", str(lib.resolve())]]
    assert said == [
        f"installing dependency './lib' from {project.path} (not installed from this folder yet)"
    ]
    stamp = json.loads((data / "dependencies.json").read_text())
    assert list(stamp) == [str(project.path)]
    assert deps.plan(project, data_dir=data) == []

    pyproject(lib, "packaging", dependencies=["pydantic>=2"])
    [again] = deps.plan(project, data_dir=data)
    assert again.reason == "its files changed"
    (lib / "requirements.txt").write_text("pydantic\n")
    assert deps.plan(project, data_dir=data) != []


def test_a_local_project_dependency_unsatisfied_plans_an_install(
    tmp_path: Path, fake_pip: list[list[str]]
) -> None:
    data = tmp_path / "data"
    project = make_project(tmp_path / "p", ["./lib"])
    pyproject(tmp_path / "p" / "lib", "packaging", dependencies=["pydantic<1"])
    deps.install(deps.plan(project, data_dir=data), lambda _: None, data_dir=data)
    [step] = deps.plan(project, data_dir=data)  # the stamp matches, the dependency does not
    assert "pydantic" in step.reason and "needed by packaging" in step.reason


def test_a_requirements_folder_is_checked_line_by_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    project = make_project(tmp_path / "p", ["./reqs"])
    folder = tmp_path / "p" / "reqs"
    folder.mkdir()
    (folder / "requirements.txt").write_text("# comment\npydantic>=2  # inline\n\npackaging\n")
    assert deps.plan(project, data_dir=data) == []
    (folder / "requirements.txt").write_text("pydantic>=2\nthreadrun-no-such-package-31\n")
    [step] = deps.plan(project, data_dir=data)
    assert step.kind == "requirements"
    assert step.pip_args == ("-r", str((folder / "requirements.txt").resolve()))


def test_a_folder_of_plain_modules_needs_nothing(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", ["./src"])
    (tmp_path / "p" / "src").mkdir()
    (tmp_path / "p" / "src" / "graph.py").write_text("graph = None\n")
    assert deps.plan(project, data_dir=tmp_path / "data") == []


def test_a_failed_install_is_one_line_naming_the_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = (
        "Collecting foo\n"
        "ERROR: Could not find a version that satisfies the requirement foo (from versions: none)\n"
        "ERROR: No matching distribution found for foo\n"
    )
    monkeypatch.setattr(deps, "_pip", lambda python, args: (1, output))
    project = make_project(tmp_path / "p", ["threadrun-no-such-package-31"])
    steps = deps.plan(project, data_dir=tmp_path / "data")
    with pytest.raises(deps.DependencyError) as exc:
        deps.install(steps, lambda _: None, data_dir=tmp_path / "data")
    assert str(exc.value) == (
        f"dependency 'threadrun-no-such-package-31' from {project.path} could not be "
        "installed: No matching distribution found for foo"
    )
    assert not (tmp_path / "data" / "dependencies.json").exists()


def test_ensure_says_nothing_when_nothing_is_missing(tmp_path: Path) -> None:
    said: list[str] = []
    assert deps.ensure(Settings(data_dir=tmp_path), said.append) is True
    assert said == []


def test_ensure_with_installs_off_lists_what_is_missing(
    tmp_path: Path, fake_pip: list[list[str]]
) -> None:
    project = make_project(tmp_path / "p", ["pydantic<1", "threadrun-no-such-package-31"])
    settings = Settings(config=project.path, data_dir=tmp_path / "data", install_dependencies=False)
    said: list[str] = []
    assert deps.ensure(settings, said.append) is False
    assert fake_pip == []
    assert len(said) == 2 and all(s.startswith("error: dependency '") for s in said)
    assert "THREADRUN_INSTALL_DEPENDENCIES=0" in said[1]


def test_make_run_stops_before_starting_anything_when_an_install_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The supervisor prints the one error line and exits 1 before any service or child."""
    from shared.tools import supervisor

    def never(*_: object) -> None:
        raise AssertionError("services were resolved")

    project = make_project(tmp_path / "p", ["threadrun-no-such-package-31"])
    (tmp_path / "p" / "g.py").write_text("graph = None\n")
    monkeypatch.setattr(supervisor, "resolve_services", never)
    monkeypatch.setattr(deps, "_pip", lambda python, args: (1, "ERROR: no such package\n"))
    monkeypatch.setenv("THREADRUN_CONFIG", str(project.path))
    monkeypatch.setenv("THREADRUN_DATA_DIR", str(tmp_path / "data"))
    assert supervisor.main([]) == 1
    out = capsys.readouterr().out
    assert "installing dependency 'threadrun-no-such-package-31'" in out
    assert (
        f"error: dependency 'threadrun-no-such-package-31' from {project.path} could not be "
        "installed: no such package"
    ) in out
