"""`pip install ./clients/python` into an empty virtualenv: what a user gets next to their code.

`import threadrun` and the `threadrun` command work; `app`, `shared` and `workers` are not
importable and no server-only dependency (Flask, Celery, psycopg, redis, LangGraph, …) is
installed; `pip install` of the repository root (the server) is refused. The venv has no pip
of its own: this environment's pip installs into it (`pip --python`), which keeps the test
at about 15 s; the packages come from the index (PyPI, through pip's cache).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_client_package import (
    CLIENT,
    ROOT,
    SERVER_PACKAGES,
    pyproject,
    requirement_name,
)

TIMEOUT_S = 300


def _env() -> dict[str, str]:
    """The environment minus anything that would put this checkout on the venv's path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def pip(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """This environment's pip acting on `venv`."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args]
        + ["--disable-pip-version-check", "-q"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=cwd,
        env=_env(),
        check=False,
    )


def run(venv: Path, program: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A program of `venv` (python, threadrun) run from `cwd`."""
    return subprocess.run(
        [str(venv / "bin" / program), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=_env(),
        check=False,
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty directory outside the checkout, the cwd of everything here."""
    return tmp_path_factory.mktemp("client-install")


@pytest.fixture(scope="module")
def venv(workdir: Path) -> Path:
    """An empty venv with the client installed from a copy of clients/python (so the build
    leaves nothing in the checkout)."""
    source = workdir / "client-source"
    shutil.copytree(
        CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    path = workdir / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120
    )
    done = pip(path, "install", str(source), cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    return path


def test_client_imports_and_the_server_packages_do_not(venv: Path, workdir: Path) -> None:
    """`import threadrun` gives the installed client; `import app|shared|workers` fails."""
    probe = (
        "import importlib, json, threadrun\n"
        "from threadrun import ThreadrunClient\n"
        "missing = []\n"
        f"for name in {list(SERVER_PACKAGES)!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError:\n"
        "        missing.append(name)\n"
        "print(json.dumps({'file': threadrun.__file__, 'missing': missing}))\n"
    )
    done = run(venv, "python", "-c", probe, cwd=workdir)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert Path(found["file"]).is_relative_to(venv)
    assert found["missing"] == list(SERVER_PACKAGES)


def test_no_server_only_dependency_is_installed(venv: Path, workdir: Path) -> None:
    """Of the server's dependencies only those the client shares are present."""
    names = "[d.metadata['Name'] for d in importlib.metadata.distributions()]"
    done = run(
        venv,
        "python",
        "-c",
        f"import json, importlib.metadata; print(json.dumps({names}))",
        cwd=workdir,
    )
    assert done.returncode == 0, done.stderr
    installed = {requirement_name(name) for name in json.loads(done.stdout)}
    server = {
        requirement_name(d) for d in pyproject(ROOT / "pyproject.toml")["project"]["dependencies"]
    }
    client = {
        requirement_name(d) for d in pyproject(CLIENT / "pyproject.toml")["project"]["dependencies"]
    }
    server_only = server - client - {"threadrun"}
    assert {"flask", "celery", "psycopg", "redis", "langgraph"} <= server_only
    assert installed & (server_only | {"threadrun-server"}) == set()
    assert "threadrun" in installed


def test_threadrun_command_runs_without_the_server(venv: Path, workdir: Path) -> None:
    """`threadrun --help` lists the client's subcommands; `keys`/`migrate` need the server."""
    done = run(venv, "threadrun", "--help", cwd=workdir)
    assert done.returncode == 0, done.stderr
    for name in ("chat", "status", "runs", "workers", "queues"):
        assert f"\n    {name} " in done.stdout, done.stdout
    assert "keys" not in done.stdout and "migrate" not in done.stdout
    assert done.stderr == ""
    refused = run(venv, "python", "-m", "threadrun", "keys", "list", cwd=workdir)
    assert refused.returncode == 2 and "invalid choice: 'keys'" in refused.stderr


def test_installing_the_server_from_the_checkout_is_refused(venv: Path, workdir: Path) -> None:
    """`pip install <checkout>` (the server) stops at its first build hook, pointing at the
    client, and installs nothing."""
    done = pip(venv, "install", "--no-deps", str(ROOT), cwd=workdir)
    assert done.returncode != 0
    assert "install clients/python instead" in done.stdout + done.stderr
    probe = run(venv, "python", "-c", "import shared", cwd=workdir)
    assert "ModuleNotFoundError" in probe.stderr
