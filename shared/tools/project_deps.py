"""The `dependencies` of a `langgraph.json`, installed into the running venv by `make run`.

The official LangGraph CLI bakes each entry into its image (`langgraph build`); here the
supervisor makes the venv it runs from hold them before any child starts. An entry is:

- `"."` or a relative path (starting with `.`, relative to the file; an absolute path is
  taken too): a folder with a `pyproject.toml` or `setup.py` (a project, installed with
  `pip install -e <folder>`), or a folder with only a `requirements.txt` (`pip install -r`),
  or a folder of plain modules (nothing to install: graphs load from their files);
- anything else: a pip requirement (`langchain-openai`, `pkg>=1.2`,
  `name @ git+https://...`, `git+https://...#egg=name`, a bare `git+https://...`).

`plan(project)` says what is missing from an interpreter's environment (`sys.executable`
by default), without installing anything:

- a requirement: its distribution is absent or its version outside the specifier (an
  extra's requirements are checked too; a marker that does not apply here: satisfied);
  a URL requirement: satisfied once a distribution of its name is installed, and a bare URL
  (no name to look for) once the stamp records it installed;
- a local project: its `[project].name` is not installed, its static
  `[project].dependencies` are not satisfied, or its `pyproject.toml` / `setup.py` /
  `setup.cfg` / `requirements.txt` differ from the last install the stamp records (no
  record: installed once, so that a project `pip`-installed by hand is re-installed from
  this folder a single time);
- a `requirements.txt`-only folder: one of its requirements is unsatisfied (a line pip
  options such as `-r`, `-e`, `--index-url` make uncheckable: the stamp decides).

threadrun's own repository (`shared.settings.PROJECT_ROOT`, the repo's `"."`) is always
satisfied: it is the runtime itself, installed by `make install`.

`install(steps, say)` runs `<python> -m pip install` once per step and records each success
in `<data_dir>/dependencies.json` (keyed by the project file's path, then the interpreter),
so the next start plans nothing unless something changed. `ensure(settings, say)` is the
supervisor's hook; with `THREADRUN_INSTALL_DEPENDENCIES=0` it only reports what is missing.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from shared.errors import ConfigError
from shared.project import Project, load_project
from shared.settings import PROJECT_ROOT, Settings

STAMP_NAME = "dependencies.json"
MANIFESTS = ("pyproject.toml", "setup.py", "setup.cfg", "requirements.txt")
"""The files of a local folder whose change means a re-install."""

PIP_TIMEOUT_S = 900.0


class DependencyError(ConfigError):
    """A dependency of the project file cannot be found, read or installed."""


@dataclass(frozen=True)
class Step:
    """One `pip install` a project's dependencies need."""

    source: Path
    """The project file (langgraph.json) the entry comes from."""
    entry: str
    """The entry as the file writes it."""
    kind: Literal["package", "project", "requirements"]
    reason: str
    """Why it is needed ("not installed", "pkg 2.1 does not satisfy <2", ...)."""
    pip_args: tuple[str, ...]
    """What follows `pip install`."""
    digest: str | None = None
    """A local folder's manifests' hash, recorded once installed."""


Installed = Mapping[str, tuple[str, list[str]]]
"""Canonical distribution name -> (version, its Requires-Dist)."""

_LIST_DISTRIBUTIONS = """
import importlib.metadata as m, json
seen = {}
for d in m.distributions():
    name = d.metadata["Name"]
    if name and name not in seen:
        seen[name] = [d.version, list(d.requires or [])]
print(json.dumps(seen))
"""


def _same_python(python: str) -> bool:
    return os.path.abspath(python) == os.path.abspath(sys.executable)


def installed_distributions(python: str = sys.executable) -> dict[str, tuple[str, list[str]]]:
    """What `python`'s environment holds (in this process when it is our own interpreter)."""
    raw: dict[str, Any]
    if _same_python(python):
        import importlib.metadata as metadata

        importlib.invalidate_caches()
        raw = {}
        for dist in metadata.distributions():
            name = dist.metadata["Name"]
            if name and name not in raw:
                raw[name] = [dist.version, list(dist.requires or [])]
    else:
        done = subprocess.run(
            [python, "-c", _LIST_DISTRIBUTIONS],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            tail = _last_error_line(done.stderr or done.stdout)
            raise DependencyError(f"cannot list the packages of {python}: {tail}")
        raw = json.loads(done.stdout)
    out: dict[str, tuple[str, list[str]]] = {}
    for name, (version, requires) in raw.items():
        out.setdefault(canonicalize_name(name), (version, requires))
    return out


# --- checking requirements ---------------------------------------------------------


def _version_ok(req: Requirement, version: str) -> bool:
    if not req.specifier:
        return True
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def unsatisfied(req: Requirement, installed: Installed, seen: frozenset[str] = frozenset()) -> str:
    """Why `req` is not satisfied in `installed` ("" when it is)."""
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        return ""  # not for this platform / Python
    name = canonicalize_name(req.name)
    have = installed.get(name)
    if have is None:
        return f"{req.name} is not installed"
    version, requires = have
    if req.url is None and not _version_ok(req, version):
        return f"{req.name} {version} is installed, {req.specifier} is needed"
    key = name + "[" + ",".join(sorted(req.extras)) + "]"
    if not req.extras or key in seen:
        return ""
    for line in requires:  # what the extras add
        try:
            sub = Requirement(line)
        except InvalidRequirement:
            continue
        if sub.marker is None or not _extra_only(sub.marker, req.extras):
            continue
        sub.marker = None
        if why := unsatisfied(sub, installed, seen | {key}):
            return f"{why} (needed by {req})"
    return ""


def _extra_only(marker: Marker, extras: Iterable[str]) -> bool:
    """True if `marker` holds for one of `extras` and not without an extra."""
    if marker.evaluate({"extra": ""}):
        return False
    return any(marker.evaluate({"extra": canonicalize_name(e)}) for e in extras)


def _url_name(spec: str) -> str | None:
    """The distribution a bare URL spec names (`#egg=name`), if any."""
    fragment = urlsplit(spec).fragment
    for part in fragment.split("&"):
        key, _, value = part.partition("=")
        if key == "egg" and value:
            return value
    return None


def _requirement_lines(text: str) -> tuple[list[str], bool]:
    """The requirement lines of a requirements.txt and whether any line is a pip option
    (or unreadable), which makes the file uncheckable."""
    reqs, opaque = [], False
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-") or line.endswith("\\"):
            opaque = True
            continue
        reqs.append(line)
    return reqs, opaque


# --- the stamp ---------------------------------------------------------------------


def _stamp_path(data_dir: Path | None) -> Path:
    return (Settings().data_dir if data_dir is None else data_dir) / STAMP_NAME


def _read_stamp(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _recorded(stamp: Mapping[str, Any], source: Path, python: str) -> dict[str, Any]:
    by_python = stamp.get(str(source))
    if not isinstance(by_python, dict):
        return {}
    entries = by_python.get(os.path.abspath(python))
    return entries if isinstance(entries, dict) else {}


def _record(path: Path, step: Step, python: str) -> None:
    """Add one installed step to the stamp (written whole, atomically)."""
    stamp = _read_stamp(path)
    by_python = stamp.setdefault(str(step.source), {})
    entries = by_python.setdefault(os.path.abspath(python), {})
    entries[step.entry] = {"kind": step.kind, "digest": step.digest}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".dependencies.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(stamp, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def digest(folder: Path) -> str:
    """A hash of the folder's manifests (which of them exist, and their bytes)."""
    h = hashlib.sha256()
    for name in MANIFESTS:
        file = folder / name
        if file.is_file():
            h.update(name.encode() + b"\0" + file.read_bytes() + b"\0")
    return h.hexdigest()


# --- the plan ----------------------------------------------------------------------


def is_local(entry: str) -> bool:
    """An entry naming a folder (the official CLI: it starts with `.`), or an absolute path."""
    return entry.startswith(".") or os.path.isabs(entry)


class _Planner:
    def __init__(self, project: Project, python: str, data_dir: Path | None) -> None:
        self.project = project
        self.python = python
        self.recorded = _recorded(_read_stamp(_stamp_path(data_dir)), project.path, python)
        self._installed: Installed | None = None

    @property
    def installed(self) -> Installed:
        if self._installed is None:
            self._installed = installed_distributions(self.python)
        return self._installed

    def fail(self, entry: str, why: str) -> DependencyError:
        return DependencyError(f"dependency {entry!r} of {self.project.path}: {why}")

    def step(self, entry: str, kind: Any, reason: str, *args: str, **kw: Any) -> Step:
        return Step(self.project.path, entry, kind, reason, tuple(args), **kw)

    def package(self, entry: str) -> Step | None:
        try:
            req = Requirement(entry)
        except InvalidRequirement:
            if "://" not in entry:
                raise self.fail(entry, "not a pip requirement nor a local path") from None
            name = _url_name(entry)
            if name is None:  # nothing to look for: the stamp says whether it was installed
                if entry in self.recorded:
                    return None
                return self.step(entry, "package", "never installed from this URL", entry)
            if canonicalize_name(name) in self.installed:
                return None
            return self.step(entry, "package", f"{name} is not installed", entry)
        why = unsatisfied(req, self.installed)
        return self.step(entry, "package", why, entry) if why else None

    def local(self, entry: str) -> Step | None:
        folder = (self.project.base / entry).resolve()
        if folder == PROJECT_ROOT.resolve():
            return None  # threadrun itself (make install)
        if not folder.exists():
            raise self.fail(entry, f"the folder {folder} does not exist")
        if not folder.is_dir():
            raise self.fail(entry, f"{folder} is not a folder")
        current = digest(folder)
        last = self.recorded.get(entry)
        changed = not isinstance(last, dict) or last.get("digest") != current
        if (folder / "pyproject.toml").is_file() or (folder / "setup.py").is_file():
            why = self.project_reason(entry, folder)
            if not why and changed:
                why = "not installed from this folder yet" if last is None else "its files changed"
            if why:
                return self.step(entry, "project", why, "-e", str(folder), digest=current)
            return None
        requirements = folder / "requirements.txt"
        if not requirements.is_file():
            return None  # plain modules: graphs load from their files
        try:
            lines, opaque = _requirement_lines(requirements.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise self.fail(entry, f"{requirements} cannot be read: {exc}") from exc
        why = ""
        for line in lines:
            try:
                why = unsatisfied(Requirement(line), self.installed)
            except InvalidRequirement:
                opaque = True
                continue
            if why:
                break
        if not why and opaque and changed:
            why = f"{requirements} has lines only pip can check, and changed"
        if why:
            return self.step(entry, "requirements", why, "-r", str(requirements), digest=current)
        return None

    def project_reason(self, entry: str, folder: Path) -> str:
        """Why the project in `folder` needs an install, as far as its pyproject tells."""
        pyproject = folder / "pyproject.toml"
        if not pyproject.is_file():
            return ""  # setup.py only: its name is code; the stamp decides
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise self.fail(entry, f"{pyproject} cannot be read: {exc}") from exc
        table = data.get("project")
        if not isinstance(table, dict) or not isinstance(table.get("name"), str):
            return ""  # no [project] table (e.g. poetry's own): the stamp decides
        name = table["name"]
        if canonicalize_name(name) not in self.installed:
            return f"{name} is not installed"
        deps = table.get("dependencies")
        if isinstance(deps, list) and "dependencies" not in (table.get("dynamic") or ()):
            for line in deps:
                try:
                    req = Requirement(str(line))
                except InvalidRequirement:
                    continue
                if why := unsatisfied(req, self.installed):
                    return f"{why} (needed by {name})"
        return ""


def plan(
    project: Project, python: str = sys.executable, data_dir: Path | None = None
) -> list[Step]:
    """The installs `python`'s environment needs for the project's `dependencies`, in the
    file's order (`data_dir`: where the stamp lives, `Settings().data_dir` by default)."""
    planner = _Planner(project, python, data_dir)
    steps = []
    for entry in project.config.dependencies:
        entry = entry.strip()
        if not entry:
            continue
        step = planner.local(entry) if is_local(entry) else planner.package(entry)
        if step is not None:
            steps.append(step)
    return steps


# --- installing --------------------------------------------------------------------


def _last_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    if errors:
        return errors[-1].removeprefix("ERROR:").strip()
    return lines[-1] if lines else "(pip said nothing)"


def _pip(python: str, args: Sequence[str]) -> tuple[int, str]:
    """Run `python -m pip install ...`; its exit code and its output (stdout and stderr)."""
    argv = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *args]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=PIP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 1, f"pip did not finish in {PIP_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return 1, f"{python} cannot be run: {exc}"
    return done.returncode, done.stdout or ""


def install(
    steps: Sequence[Step],
    say: Callable[[str], None],
    python: str = sys.executable,
    data_dir: Path | None = None,
    pip_args: Sequence[str] = (),
) -> None:
    """pip-install every step into `python`'s environment, one line each through `say`,
    and record each success; the first failure raises DependencyError naming its entry."""
    stamp = _stamp_path(data_dir)
    for step in steps:
        say(f"installing dependency {step.entry!r} from {step.source} ({step.reason})")
        code, output = _pip(python, [*pip_args, *step.pip_args])
        if code != 0:
            raise DependencyError(
                f"dependency {step.entry!r} from {step.source} could not be installed: "
                f"{_last_error_line(output)}"
            )
        _record(stamp, step, python)
    if steps:
        importlib.invalidate_caches()  # what this process looks up next sees them


def ensure(settings: Settings, say: Callable[[str], None]) -> bool:
    """The supervisor's hook: install what the project file's `dependencies` miss (nothing
    said when nothing is missing); False (errors said) when the start must stop."""
    try:
        project = load_project(settings.config)
        steps = plan(project, data_dir=settings.data_dir)
        if steps and not settings.install_dependencies:
            for step in steps:
                say(
                    f"error: dependency {step.entry!r} from {step.source} is missing "
                    f"({step.reason}); install it, or unset THREADRUN_INSTALL_DEPENDENCIES=0"
                )
            return False
        install(steps, say, data_dir=settings.data_dir)
    except ConfigError as exc:
        say(f"error: {exc}")
        return False
    return True
