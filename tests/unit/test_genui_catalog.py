"""Generative UI without a build: langgraph.json's `ui` / `ui_config` in the project model,
the tags of `POST /ui/{name}`, esbuild's error as one line (shared/genui/, shared/project.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.project_http.routes import section_of
from shared.genui.catalog import UiAsset, UiBundle, global_name
from shared.genui.esbuild import first_error
from shared.project import ProjectConfigError, parse_project


def project_file(tmp_path: Path, **keys: Any) -> Path:
    (tmp_path / "g.py").write_text("graph = None\n")
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"agent": "./g.py:graph"}, **keys}))
    return path


def test_ui_and_ui_config_are_honoured(tmp_path: Path) -> None:
    """`ui` names a component module per graph (relative to the file); `ui_config.shared`
    lists more modules left to the page."""
    (tmp_path / "ui.tsx").write_text("export default {};\n")
    project = parse_project(
        project_file(tmp_path, ui={"agent": "./ui.tsx"}, ui_config={"shared": ["clsx"]})
    )
    assert project.ui_sources() == {"agent": (tmp_path / "ui.tsx").resolve()}
    assert project.ui_config.shared == ["clsx"]
    assert parse_project(project_file(tmp_path)).ui_sources() == {}


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"ui": {"agent": "./missing.tsx"}}, "'ui.agent' names './missing.tsx':"),
        ({"ui": {"agent": "./g.py"}}, "'ui.agent' names './g.py': not one of .tsx"),
        ({"ui": {"static": "./ui.tsx"}}, "'ui.static': not a usable component name"),
        ({"ui": {"a/b": "./ui.tsx"}}, "'ui.a/b': not a usable component name"),
        (
            {"ui": {"agent": "./ui.tsx"}, "ui_config": {"share": []}},
            "unknown key 'ui_config.share'",
        ),
        ({"ui": {"agent": 3}}, "ui.agent: Input should be a valid string"),
    ],
)
def test_a_ui_entry_that_cannot_be_served_stops_the_start(
    tmp_path: Path, keys: dict[str, Any], expected: str
) -> None:
    """A missing file, a file that is no JS/TS module, a name the routes cannot carry, an
    unknown `ui_config` key: a start-up error naming the key (and the file)."""
    (tmp_path / "ui.tsx").write_text("export default {};\n")
    path = project_file(tmp_path, **keys)
    with pytest.raises(ProjectConfigError) as err:
        parse_project(path)
    assert str(path) in str(err.value) and expected in str(err.value)
    if "missing" in expected:
        assert str(tmp_path / "missing.tsx") in str(err.value)


def test_global_name_is_the_react_ui_packages() -> None:
    """`__LGUI_` + the name with every character outside [A-Za-z0-9] as `_`."""
    assert global_name("agent") == "__LGUI_agent"
    assert global_name("my-agent.v2") == "__LGUI_my_agent_v2"


def test_tags_are_the_official_ones_and_escape_the_component_name(tmp_path: Path) -> None:
    """A stylesheet link per CSS file first, then the script whose onload renders the
    component into `{{shadowRootId}}`; names are URL-quoted and HTML-escaped, files carry
    their digest as `?v=`, and the mount prefix leads every URL."""
    bundle = UiBundle(
        "my agent",
        (
            UiAsset("entrypoint.css", tmp_path / "a.css", "c" * 32),
            UiAsset("entrypoint.js", tmp_path / "a.js", "j" * 32),
        ),
    )
    tags = bundle.tags('it\'s "x"', prefix="/api").split("\n")
    assert (
        tags[0]
        == f'<link rel="stylesheet" href="/api/ui/my%20agent/entrypoint.css?v={"c" * 32}" />'
    )
    assert tags[1] == (
        f'<script src="/api/ui/my%20agent/entrypoint.js?v={"j" * 32}" '
        "onload='__LGUI_my_agent.render(&quot;it&#x27;s \\&quot;x\\&quot;&quot;, "
        '"{{shadowRootId}}")\'></script>'
    )
    assert bundle.asset("entrypoint.js") is bundle.assets[1] and bundle.asset("x.js") is None
    assert bundle.assets[0].media_type == "text/css; charset=utf-8"
    assert bundle.assets[1].media_type == "text/javascript; charset=utf-8"


ESBUILD_OUTPUT = """\u2718 [ERROR] Expected "}" but found ";"

    ui/bad.tsx:2:41:
      2 \u2502 export default { a: () => <div>{x}</div> ;
        \u2502                                          ^
        \u2575                                          }

\u2718 [ERROR] Could not resolve "nope-pkg"

    ui/bad.tsx:1:14:
      1 \u2502 import x from "nope-pkg";
        \u2575               ~~~~~~~~~~

"""


def test_esbuild_errors_become_one_line_with_the_file_and_position() -> None:
    """The first error with its `file:line:col`, and how many more there are."""
    assert first_error(ESBUILD_OUTPUT) == (
        'ui/bad.tsx:2:41: Expected "}" but found ";" (and 1 more error)'
    )
    assert first_error("\u2718 [ERROR] Something odd\n") == "Something odd"
    assert first_error("") == "esbuild failed with no output"


def test_http_disable_ui_covers_the_generative_ui_routes() -> None:
    """`http.disable_ui` turns off the chat page and the generative UI routes alike."""
    assert section_of("/ui/<graph_id>") == "ui"
    assert section_of("/ui/<graph_id>/<path:filename>") == "ui"
    assert section_of("/ui/static/<path:filename>") == "ui"
