"""The client distribution (clients/python, import name `threadrun`) stands alone.

Users install it next to their own code, where top-level packages named `app`, `shared` or
`workers` are theirs: the client imports nothing of the server and declares only what it
imports, the server depends on it (never the reverse) and refuses to be built as a wheel,
and the server's own subcommands reach `threadrun` through an entry-point group.
tests/integration/test_client_install.py installs the client into an empty virtualenv.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from setuptools import build_meta

import threadrun.cli
from shared.tools.cli_keys import add_keys
from shared.tools.cli_migrate import add_migrate, cmd_migrate
from tests.unit.sources import parse
from threadrun.cli import PLUGIN_GROUP, build_parser, installed_subcommands

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"
PACKAGE = CLIENT / "threadrun"
CLIENT_DEPENDENCIES = {"httpx", "orjson", "websockets"}
"""Distribution names of the client's dependencies, which are also their import names."""
SERVER_PACKAGES = ("app", "shared", "workers")


def pyproject(path: Path) -> dict[str, Any]:
    """A pyproject.toml as a dict."""
    with path.open("rb") as f:
        return tomllib.load(f)


def requirement_name(requirement: str) -> str:
    """The normalised distribution name of a PEP 508 requirement string."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level module) of every absolute import in a module."""
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def test_client_imports_only_the_stdlib_its_dependencies_and_itself() -> None:
    """Nothing under clients/python/threadrun imports app, shared, workers or anything else
    the distribution does not declare."""
    allowed = set(sys.stdlib_module_names) | CLIENT_DEPENDENCIES | {"threadrun"}
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name in imported_modules(path)
        if name not in allowed
    ]
    assert found == []


def test_the_import_check_catches_a_server_import(tmp_path: Path) -> None:
    """The check itself works: `from shared.x import y` and `import app` are found."""
    probe = tmp_path / "probe.py"
    probe.write_text("import json\nimport app.main\nfrom shared.client import parse_sse\n")
    assert [name for _, name in imported_modules(probe)] == ["json", "app", "shared"]


def test_client_distribution_declares_only_what_it_imports() -> None:
    """`threadrun`: one package, the `threadrun` script, httpx/orjson/websockets."""
    project = pyproject(CLIENT / "pyproject.toml")
    assert project["project"]["name"] == "threadrun"
    deps = {requirement_name(d) for d in project["project"]["dependencies"]}
    assert deps == CLIENT_DEPENDENCIES
    assert project["project"]["scripts"] == {"threadrun": "threadrun.cli:main"}
    assert project["tool"]["setuptools"]["packages"] == ["threadrun"]


def test_server_depends_on_the_client_and_registers_its_subcommands() -> None:
    """`threadrun-server` requires this exact client, has no script of its own (one
    `threadrun` command) and adds `keys` and `migrate` through the entry-point group."""
    client = pyproject(CLIENT / "pyproject.toml")["project"]
    server = pyproject(ROOT / "pyproject.toml")["project"]
    assert server["name"] == "threadrun-server"
    assert f"threadrun=={client['version']}" in server["dependencies"]
    assert "scripts" not in server
    assert server["entry-points"][PLUGIN_GROUP] == {
        "keys": "shared.tools.cli_keys:add_keys",
        "migrate": "shared.tools.cli_migrate:add_migrate",
    }


def _backend() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_backend", ROOT / "deploy" / "build_backend.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_server_build_backend_refuses_wheels_and_sdists() -> None:
    """The server is installed editable only: every wheel and sdist hook exits with a pointer
    to the client; the editable hooks are setuptools'."""
    build_system = pyproject(ROOT / "pyproject.toml")["build-system"]
    assert build_system["build-backend"] == "build_backend"
    assert build_system["backend-path"] == ["deploy"]
    backend = _backend()
    for hook in (
        "get_requires_for_build_wheel",
        "prepare_metadata_for_build_wheel",
        "build_wheel",
        "get_requires_for_build_sdist",
        "build_sdist",
    ):
        with pytest.raises(SystemExit, match=r"install clients/python instead"):
            getattr(backend, hook)("unused")
    assert backend.build_editable is build_meta.build_editable
    assert (
        backend.prepare_metadata_for_build_editable
        is build_meta.prepare_metadata_for_build_editable
    )


def test_installed_server_adds_keys_and_migrate_to_threadrun() -> None:
    """In the server's environment `threadrun keys` and `threadrun migrate` exist, loaded
    from the server's entry points (the client package never names them)."""
    assert {ep.name for ep in entry_points(group=PLUGIN_GROUP)} == {"keys", "migrate"}
    assert installed_subcommands() == [add_keys, add_migrate]
    assert build_parser().parse_args(["migrate"]).func is cmd_migrate


def _add_extra(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser("extra").set_defaults(func=lambda _args: 0)


def test_a_subcommand_that_fails_to_load_is_skipped_with_a_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken plugin costs its own subcommand only: the others still parse."""
    eps = [
        EntryPoint("broken", "no_such_module_anywhere:add", PLUGIN_GROUP),
        EntryPoint("extra", f"{__name__}:_add_extra", PLUGIN_GROUP),
    ]
    monkeypatch.setattr(threadrun.cli, "entry_points", lambda group: eps)
    parser = build_parser()
    err = capsys.readouterr().err
    assert "threadrun: skipping the 'broken' command (ModuleNotFoundError" in err
    assert parser.parse_args(["extra"]).func(None) == 0
    assert parser.parse_args(["chat", "-m", "hi"]).message == "hi"
