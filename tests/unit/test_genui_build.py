"""Bundling langgraph.json's `ui` with the real esbuild (shared/genui/build.py): the bundle
the react-ui package expects, a build error as one line naming the key and the file, the
content-hash cache (a restart with unchanged sources builds nothing, an edited import is
rebuilt), and nothing at all for a project without `ui`.

esbuild comes from the npm registry once, into `.threadrun/genui` (kept between runs, shared
with tests/e2e/test_genui.py); each test builds into a folder of its own."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from shared.genui import build as genui_build
from shared.genui import build_catalog, esbuild
from shared.project import Project, ProjectConfigError, parse_project
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".threadrun" / "genui"
VERSION = Settings.model_fields["genui_esbuild_version"].default

REQUIRE = 'typeof require !== "undefined" ? require'
"""esbuild's own `require` shim, which the page's LGUI_REQUIRE replaces."""
COMPONENT = """import "./card.css";
import { label } from "./label";
export default { card: (p: { n: number }) => <b className="card">{label(p.n)}</b> };
"""


@pytest.fixture(scope="module")
def tools() -> Path:
    """The shared esbuild install (npm, once per version, under the genui lock)."""
    with genui_build._locked(TOOLS):
        esbuild.install(TOOLS, VERSION, 300)
    return TOOLS / f"esbuild-{VERSION}"


@pytest.fixture
def settings(tmp_path: Path, tools: Path) -> Settings:
    """A genui dir of this test's, with the shared esbuild linked in."""
    root = tmp_path / "genui"
    root.mkdir()
    (root / tools.name).symlink_to(tools, target_is_directory=True)
    return Settings(genui_dir=root)


def write_project(
    folder: Path, source: str = COMPONENT, shared: list[str] | None = None
) -> Project:
    (folder / "g.py").write_text("graph = None\n")
    ui = folder / "ui"
    ui.mkdir(exist_ok=True)
    (ui / "card.tsx").write_text(source)
    (ui / "card.css").write_text(".card { color: red; }\n")
    (ui / "label.ts").write_text("export const label = (n: number) => `#${n}`;\n")
    config: dict[str, object] = {
        "graphs": {"agent": "./g.py:graph"},
        "ui": {"agent": "./ui/card.tsx"},
    }
    if shared is not None:
        config["ui_config"] = {"shared": shared}
    (folder / "langgraph.json").write_text(json.dumps(config))
    return parse_project(folder / "langgraph.json")


def test_the_bundle_is_what_the_react_ui_package_loads(tmp_path: Path, settings: Settings) -> None:
    """An IIFE defining `__LGUI_agent` with `render`, React and the JSX runtime taken from
    the page's LGUI_REQUIRE (not bundled), the imported CSS as its own file."""
    catalog = build_catalog(write_project(tmp_path), settings)
    bundle = catalog.get("agent")
    assert bundle is not None and catalog.get("other") is None
    assert [a.filename for a in bundle.assets] == ["entrypoint.css", "entrypoint.js"]
    js = bundle.assets[1].path.read_text()
    assert js.startswith("var __LGUI_agent = (() => {")
    assert 'globalThis[Symbol.for("LGUI_REQUIRE")]' in js and REQUIRE not in js
    assert '__require("react/jsx-runtime")' in js and "React.createElement" not in js
    assert 'Symbol.for("LGUI_EXT_STORE")' in js and "`#${n}`" in js
    assert ".card" in bundle.assets[0].path.read_text()


def test_ui_config_shared_modules_are_left_to_the_page(tmp_path: Path, settings: Settings) -> None:
    """A module in `ui_config.shared` is required at run time, not resolved at build."""
    source = 'import { x } from "my-design-system";\nexport default { a: () => <i>{x}</i> };\n'
    bundle = build_catalog(write_project(tmp_path, source, ["my-design-system"]), settings).get(
        "agent"
    )
    assert bundle is not None
    assert '__require("my-design-system")' in bundle.assets[-1].path.read_text()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("export default { a: () => <div> ;\n", "ui/card.tsx:2:0: Unexpected end of file"),
        (
            'import x from "not-installed-pkg";\nexport default { x };\n',
            'Could not resolve "not-installed-pkg"',
        ),
    ],
)
def test_a_build_error_is_one_line_naming_the_key_and_the_file(
    tmp_path: Path, settings: Settings, source: str, expected: str
) -> None:
    """A syntax error or a missing package stops the start: one line with the project
    file, `ui.agent`, the component file and esbuild's first error with its position."""
    project = write_project(tmp_path, source)
    with pytest.raises(ProjectConfigError) as err:
        build_catalog(project, settings)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(
        f"{project.path}: 'ui.agent' ({tmp_path / 'ui' / 'card.tsx'}): build failed: "
    )
    assert expected in text
    assert not list((settings.genui_dir or tmp_path).glob("builds/.tmp-*"))  # nothing half-built


def test_an_unchanged_restart_builds_nothing_and_an_edited_import_rebuilds(
    tmp_path: Path,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cache: keyed by the entry, valid while every file esbuild read (the imported
    label.ts and card.css too) has the digest it had."""
    project = write_project(tmp_path)
    first = build_catalog(project, settings).get("agent")
    built: list[str] = []
    real = genui_build.build_one

    def counting(*args: object, **kw: object) -> list[str]:
        built.append(str(args[2]))
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(genui_build, "build_one", counting)
    with caplog.at_level(logging.INFO, logger="shared.genui.build"):
        again = build_catalog(parse_project(project.path), settings).get("agent")
    assert built == [] and "unchanged, cached build" in caplog.text
    assert first is not None and again is not None
    assert [a.digest for a in again.assets] == [a.digest for a in first.assets]
    (tmp_path / "ui" / "label.ts").write_text("export const label = (n: number) => `No. ${n}`;\n")
    edited = build_catalog(parse_project(project.path), settings).get("agent")
    assert built == ["agent"] and edited is not None
    assert "No. ${n}" in edited.assets[-1].path.read_text()
    assert edited.assets[-1].digest != first.assets[-1].digest


def test_a_project_without_ui_costs_nothing(tmp_path: Path) -> None:
    """No `ui`: no lock, no folder, no npm; an empty catalog."""
    (tmp_path / "g.py").write_text("graph = None\n")
    (tmp_path / "langgraph.json").write_text(json.dumps({"graphs": {"a": "./g.py:graph"}}))
    root = tmp_path / "genui"
    catalog = build_catalog(parse_project(tmp_path / "langgraph.json"), Settings(genui_dir=root))
    assert dict(catalog.bundles) == {} and not root.exists()


def test_without_npm_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `ui` on a host with no npm (and no esbuild installed yet): the start stops naming
    Node.js and npm."""
    monkeypatch.setattr("shared.genui.esbuild.shutil.which", lambda _name: None)
    with pytest.raises(ProjectConfigError, match="needs Node.js and npm on the PATH"):
        build_catalog(write_project(tmp_path), Settings(genui_dir=tmp_path / "genui"))
