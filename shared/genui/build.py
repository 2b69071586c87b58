"""Bundle langgraph.json's `ui` once per content: esbuild at the web's start, under a lock.

Each `ui` entry (name -> a module whose default export maps component names to React
components) becomes one IIFE script defining `__LGUI_<name>` with `render(component,
shadowRootId)` (plus a stylesheet when the components import CSS), as `@langchain/
langgraph-ui` builds it for the official server: React, ReactDOM, the SDK and
`ui_config.shared` are left out and taken at run time from the page's
`Symbol.for("LGUI_REQUIRE")` (the react-ui package installs it).

Why at start-up, under a file lock: a build error then stops the start with one line that
names the file (not a 500 at the first page view), every web process of a host serves the
same files from the first request, and the gunicorn workers of one host build once (the
first takes the lock and builds, the others wait and find the result). The cache key is the
entry's identity (name, path, esbuild version, externals); a cached build is reused only if
every file esbuild read for it (its metafile's inputs) still has the sha256 it had, so a
restart with unchanged sources builds nothing and an edited import is rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shared.genui import esbuild
from shared.genui.catalog import UiBundle, UiCatalog, file_digest, global_name, load_bundle
from shared.project import Project, ProjectConfigError
from shared.settings import Settings

log = logging.getLogger(__name__)

FORMAT = 1
"""Bump when the entry template or the options change: every cached build is stale."""
ALWAYS_EXTERNAL = (
    "react",
    "react-dom",
    "@langchain/langgraph-sdk",
    "@langchain/langgraph-sdk/react-ui",
)
"""What the page provides (the react-ui package's LGUI_REQUIRE); subpaths included."""
MANIFEST = "manifest.json"
ENTRY = "entrypoint.tsx"

_RENDERER = """
function createRenderer(components: Record<string, unknown>) {
  return (name: string, shadowRootId: string) => {
    const root = document.getElementById(shadowRootId)!.shadowRoot!;
    const renderEl = document.createElement("div");
    root.appendChild(renderEl);
    (window as any)[Symbol.for("LGUI_EXT_STORE")].respond(shadowRootId, components[name], renderEl);
  };
}
export const render = createRenderer(ui);
"""
_REQUIRE = 'typeof require !== "undefined" ? require'
_PAGE_REQUIRE = (
    'typeof globalThis[Symbol.for("LGUI_REQUIRE")] !== "undefined"'
    ' ? globalThis[Symbol.for("LGUI_REQUIRE")]'
)


def genui_root(settings: Settings) -> Path:
    """The folder of the esbuild installs and the bundle cache."""
    return settings.genui_dir or settings.data_dir / "genui"


def cache_key(name: str, source: Path, version: str, shared: list[str]) -> str:
    """The cache folder of one entry: what it is built from, less the files' contents."""
    ident = json.dumps([FORMAT, version, name, str(source), sorted(shared)])
    return hashlib.sha256(ident.encode()).hexdigest()[:24]


def _fresh(folder: Path) -> list[str] | None:
    """The files of a cached build if every input still has its recorded digest."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        for path, digest in manifest["inputs"].items():
            if file_digest(Path(path)) != digest:
                return None
        files: list[str] = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return files if all((folder / f).is_file() for f in files) else None


def _inputs(meta: Path, cwd: Path, work: Path) -> dict[str, str]:
    """Every real file esbuild read (its metafile, paths relative to `cwd`) -> sha256,
    but the generated entry."""
    out = {}
    for rel in json.loads(meta.read_text(encoding="utf-8"))["inputs"]:
        if ":" in rel.split("/")[0]:  # a namespace (`ns:path`), not a file
            continue
        path = (cwd / rel).resolve()
        if path.is_file() and path.parent != work.resolve():
            out[str(path)] = file_digest(path)
    return out


def _esbuild_args(name: str, work: Path, shared: list[str]) -> list[str]:
    args = [str(work / ENTRY), "--bundle", "--platform=browser", "--target=es2020"]
    args += ["--jsx=automatic", "--format=iife", f"--global-name={global_name(name)}"]
    args += [f"--external:{m}" for m in (*ALWAYS_EXTERNAL, *shared)]
    return [*args, f"--outdir={work / 'out'}", f"--metafile={work / 'meta.json'}"]


def build_one(
    tool: esbuild.Esbuild, project: Project, name: str, source: Path, folder: Path, timeout: float
) -> list[str]:
    """Bundle `ui.<name>` into `folder` (replaced); its files. A failed build raises one
    line naming the key and the file."""
    shared = project.ui_config.shared
    work = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    entry = f"import ui from {json.dumps(str(source))};\n{_RENDERER}"
    (work / ENTRY).write_text(entry, encoding="utf-8")
    where = f"{project.path}: 'ui.{name}' ({source})"
    try:
        done = esbuild.run(
            tool, _esbuild_args(name, work, shared), cwd=project.base, timeout_s=timeout
        )
    except subprocess.TimeoutExpired:
        shutil.rmtree(work, ignore_errors=True)
        raise ProjectConfigError(f"{where}: esbuild took more than {timeout:g} s") from None
    if done.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise ProjectConfigError(f"{where}: build failed: {esbuild.first_error(done.stderr)}")
    out = work / "out"
    script = out / "entrypoint.js"
    script.write_text(script.read_text(encoding="utf-8").replace(_REQUIRE, _PAGE_REQUIRE))
    files = sorted(p.name for p in out.iterdir() if p.is_file())
    inputs = _inputs(work / "meta.json", project.base, work)
    manifest = {"name": name, "source": str(source), "inputs": inputs, "files": files}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(out, folder)
    shutil.rmtree(work, ignore_errors=True)
    return files


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """The host-wide genui lock (one install or build at a time; others wait for it)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_catalog(project: Project, settings: Settings) -> UiCatalog:
    """The bundles of the project's `ui`, built or taken from the cache; empty (and free:
    no lock, no file, no npm) without `ui`."""
    sources = project.ui_sources()
    if not sources:
        return UiCatalog()
    root = genui_root(settings)
    version, timeout = settings.genui_esbuild_version, settings.genui_build_timeout_s
    bundles: dict[str, UiBundle] = {}
    with _locked(root):
        tool: esbuild.Esbuild | None = None
        for name, source in sources.items():
            key = cache_key(name, source, version, project.ui_config.shared)
            folder = root / "builds" / key
            files = _fresh(folder)
            if files is None:
                started = time.monotonic()
                tool = tool or esbuild.install(root, version, timeout)
                files = build_one(tool, project, name, source, folder, timeout)
                log.info("genui: built ui.%s in %.2f s", name, time.monotonic() - started)
            else:
                log.info("genui: ui.%s unchanged, cached build %s", name, key)
            bundles[name] = load_bundle(name, folder, [f for f in files if f != MANIFEST])
    return UiCatalog(bundles)
