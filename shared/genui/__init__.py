"""Generative UI: langgraph.json's `ui` components bundled with esbuild (build.py, esbuild.py)
and what the web serves of them (catalog.py). docs/genui.md has the whole picture."""

from shared.genui.build import build_catalog, genui_root
from shared.genui.catalog import UiAsset, UiBundle, UiCatalog, global_name

__all__ = ["UiAsset", "UiBundle", "UiCatalog", "build_catalog", "genui_root", "global_name"]
