"""npm packages for the suite's Node.js checks: installed once per pinned list under the
repo's data dir (`.threadrun/<name>`), under a file lock, and kept between runs.

The folder's `installed.json` names the packages of the last complete install; a folder
whose list differs (a version bump) is installed again. The lock makes two pytest
processes that start at once wait for one install instead of racing in one folder. A
missing `node` or `npm` fails the test with its name: the check never skips silently.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / ".threadrun"
INSTALL_TIMEOUT_S = 300


def node() -> str:
    """The `node` binary on the PATH (an assertion naming it if there is none)."""
    found = shutil.which("node")
    assert found, "this check needs Node.js: `node` is not on the PATH (https://nodejs.org/)"
    return found


def installed(name: str, packages: list[str]) -> Path:
    """`.threadrun/<name>` with exactly `packages` (npm specs, pinned) installed in it."""
    folder = DATA / name
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "installed.json"
    with open(folder / ".lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if marker.is_file() and json.loads(marker.read_text()) == packages:
                return folder
            npm = shutil.which("npm")
            assert npm, "this check needs npm on the PATH to install " + " ".join(packages)
            marker.unlink(missing_ok=True)
            cmd = [npm, "install", "--prefix", str(folder), "--no-save", "--no-audit", "--no-fund"]
            cmd += ["--no-package-lock", "--ignore-scripts", "--loglevel=error", *packages]
            done = subprocess.run(cmd, timeout=INSTALL_TIMEOUT_S, capture_output=True, text=True)
            assert done.returncode == 0, (
                f"`npm install {' '.join(packages)}`: {done.stderr[-2000:]}"
            )
            marker.write_text(json.dumps(packages))
            return folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
