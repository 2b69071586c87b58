"""esbuild, from the npm registry: installed once per version under the genui dir, and run.

The official server bundles `ui` with `@langchain/langgraph-ui`, a Node.js wrapper around
esbuild's JS API. threadrun calls esbuild's own binary with the same options instead, so the
install is one package (esbuild and its platform binary, ~10 MB, ~2 s) and no Node.js process
stays up: the web only needs `npm` at its first start with a `ui` (and `node`, if the
platform binary is missing and npm's launcher script stands in for it).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from shared.project import ProjectConfigError

log = logging.getLogger(__name__)

INSTALLED = "installed.json"
"""Written last in an install's folder: a folder without it is a broken install, redone."""


@dataclass(frozen=True)
class Esbuild:
    """An installed esbuild binary of a known version."""

    binary: Path
    version: str


def _binary(folder: Path) -> Path | None:
    """The platform binary (one `@esbuild/<os>-<arch>` package), else npm's launcher."""
    for native in sorted((folder / "node_modules" / "@esbuild").glob("*/bin/esbuild")):
        return native
    launcher = folder / "node_modules" / ".bin" / "esbuild"
    return launcher if launcher.exists() else None


def installed(root: Path, version: str) -> Esbuild | None:
    """The esbuild `version` under `root`, if a complete install is there."""
    folder = root / f"esbuild-{version}"
    binary = _binary(folder)
    if binary is None or not (folder / INSTALLED).is_file():
        return None
    return Esbuild(binary, version)


def install(root: Path, version: str, timeout_s: float) -> Esbuild:
    """esbuild `version` under `root`, installed with `npm` unless it already is there.
    The caller holds the genui lock: two processes never install at once."""
    found = installed(root, version)
    if found is not None:
        return found
    npm = shutil.which("npm")
    if npm is None:
        raise ProjectConfigError(
            "generative UI (langgraph.json `ui`) needs Node.js and npm on the PATH to install"
            f" esbuild {version} (https://nodejs.org/)"
        )
    folder = root / f"esbuild-{version}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cmd = [npm, "install", "--prefix", str(folder), "--no-save", "--no-audit", "--no-fund"]
    cmd += ["--no-package-lock", "--ignore-scripts", "--loglevel=error", f"esbuild@{version}"]
    log.info("genui: installing esbuild %s with npm into %s", version, folder)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ProjectConfigError(
            f"generative UI: `npm install esbuild@{version}` took more than {timeout_s:g} s"
            " (THREADRUN_GENUI_BUILD_TIMEOUT_S)"
        ) from None
    binary = _binary(folder)
    if done.returncode != 0 or binary is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ProjectConfigError(
            f"generative UI: `npm install esbuild@{version}` failed: {tail[0][:300]}"
        )
    (folder / INSTALLED).write_text(json.dumps({"version": version}), encoding="utf-8")
    return Esbuild(binary, version)


_ERROR = re.compile(r"\[ERROR\]\s*(?P<text>.+)")
_WHERE = re.compile(r"^\s+(?P<where>\S.*:\d+:\d+):\s*$")


def first_error(output: str) -> str:
    """esbuild's first error as one line, with its `file:line:col` when it gives one, and
    how many more there are."""
    lines = output.splitlines()
    errors = [i for i, line in enumerate(lines) if _ERROR.search(line)]
    if not errors:
        last = [line.strip() for line in lines if line.strip()]
        return last[-1][:300] if last else "esbuild failed with no output"
    first = errors[0]
    match = _ERROR.search(lines[first])
    assert match is not None
    text = match.group("text").strip()
    for line in lines[first + 1 : first + 4]:
        where = _WHERE.match(line)
        if where:
            text = f"{where.group('where')}: {text}"
            break
    more = len(errors) - 1
    return text[:400] + (f" (and {more} more error{'s' if more > 1 else ''})" if more else "")


def run(
    tool: Esbuild, args: list[str], *, cwd: Path, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """esbuild with `args` in `cwd` (colour off, errors only on stderr)."""
    cmd = [str(tool.binary), *args, "--log-level=error", "--color=false"]
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env
    )
