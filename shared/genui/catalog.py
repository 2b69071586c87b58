"""What the web serves of the `ui` bundles: names, files, digests, and the tags of
`POST /ui/{name}` (pure: no IO but reading a bundle's files once when it is loaded)."""

from __future__ import annotations

import hashlib
import html
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

MEDIA_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".map": "application/json",
}
"""Content types of a bundle's files (esbuild writes no other kind with our options)."""


def global_name(name: str) -> str:
    """The global a bundle defines, as the react-ui package expects: `__LGUI_<name>` with
    every character outside [A-Za-z0-9] replaced by `_`."""
    return "__LGUI_" + re.sub(r"[^a-zA-Z0-9]", "_", name)


@dataclass(frozen=True)
class UiAsset:
    """One file of a bundle."""

    filename: str
    path: Path
    digest: str
    """sha256 of the file (hex, 32 chars): its ETag and its `?v=` in the tags."""

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES.get(Path(self.filename).suffix, "application/octet-stream")


@dataclass(frozen=True)
class UiBundle:
    """The built files of one `ui` entry."""

    name: str
    assets: tuple[UiAsset, ...]

    def asset(self, filename: str) -> UiAsset | None:
        """The file named `filename`, if the bundle has it."""
        return next((a for a in self.assets if a.filename == filename), None)

    def tags(self, component: str, prefix: str = "") -> str:
        """The HTML of `POST /ui/{name}`: a stylesheet link per CSS file, and a script per
        JS file whose `onload` renders `component` into the element `{{shadowRootId}}`
        (the client substitutes it), as the official server answers."""
        out = []
        call = html.escape(json.dumps(component), quote=True)
        for asset in self.assets:
            url = f"{prefix}/ui/{quote(self.name, safe='')}/{quote(asset.filename, safe='')}"
            href = html.escape(f"{url}?v={asset.digest}", quote=True)
            if asset.filename.endswith(".css"):
                out.append(f'<link rel="stylesheet" href="{href}" />')
            elif asset.filename.endswith(".js"):
                render = f'{global_name(self.name)}.render({call}, "{{{{shadowRootId}}}}")'
                out.append(f"<script src=\"{href}\" onload='{render}'></script>")
        return "\n".join(out)


@dataclass(frozen=True)
class UiCatalog:
    """Every bundle the web serves, by `ui` name (empty without `ui`)."""

    bundles: Mapping[str, UiBundle] = field(default_factory=dict)

    def get(self, name: str) -> UiBundle | None:
        """The bundle of `name`, if langgraph.json's `ui` has it."""
        return self.bundles.get(name)


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes (hex, 32 chars)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:32]


def load_bundle(name: str, folder: Path, filenames: list[str]) -> UiBundle:
    """The bundle of `name` from its built `folder`, CSS before JS (styles first)."""
    ordered = sorted(filenames, key=lambda f: (not f.endswith(".css"), f))
    return UiBundle(name, tuple(UiAsset(f, folder / f, file_digest(folder / f)) for f in ordered))
