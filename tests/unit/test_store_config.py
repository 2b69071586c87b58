"""The config file's `store` section: defaults, refusals, the index and its embeddings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.embeddings import Embeddings

from shared.settings import PROJECT_ROOT
from shared.store import StoreConfig, StoreConfigError

EMBED = """
def embed(texts):
    return [[float(len(t)), 1.0] for t in texts]
"""


def write(folder: Path, store: Any) -> Path:
    path = folder / "langgraph.json"
    path.write_text(json.dumps({"graphs": {}, "store": store}))
    return path


def test_default_store_has_no_index_and_hides_expired_items(tmp_path: Path) -> None:
    for config in (
        StoreConfig.from_file(tmp_path / "missing.json"),
        StoreConfig.from_file(PROJECT_ROOT / "langgraph.json"),
    ):
        assert config.semantic is False
        assert config.index() is None and config.setup_index() is None
        assert config.ttl() == {"refresh_on_read": True, "omit_expired": True}


@pytest.mark.parametrize(
    "store",
    [
        {"indexx": {}},
        {"index": {"dims": 0, "embed": "x:y"}},
        {"index": {"dims": 4}},
        {"ttl": {"default_ttl": -1}},
        {"path": "./my_store.py:store"},
    ],
)
def test_bad_sections_are_config_errors(tmp_path: Path, store: Any) -> None:
    with pytest.raises(StoreConfigError):
        StoreConfig.from_file(write(tmp_path, store))


def test_ttl_section(tmp_path: Path) -> None:
    ttl = {"refresh_on_read": False, "default_ttl": 60, "sweep_interval_minutes": 5}
    config = StoreConfig.from_file(write(tmp_path, {"ttl": ttl}))
    assert config.ttl() == {**ttl, "omit_expired": True}


def test_index_with_a_function_beside_the_config(tmp_path: Path) -> None:
    (tmp_path / "embed.py").write_text(EMBED)
    index = {"dims": 2, "embed": "./embed.py:embed", "fields": ["text"]}
    config = StoreConfig.from_file(write(tmp_path, {"index": index}))
    assert config.semantic is True
    built = config.index()
    assert built is not None and built["dims"] == 2 and built["fields"] == ["text"]
    assert isinstance(built["embed"], Embeddings)
    assert built["embed"].embed_query("abc") == [3.0, 1.0]


def test_migrating_never_loads_the_embeddings(tmp_path: Path) -> None:
    """Tables need dims and the index kind only: no provider, no API key at migrate time."""
    index = {"dims": 3, "embed": "no-such-provider:model", "ann_index_config": {"kind": "flat"}}
    config = StoreConfig.from_file(write(tmp_path, {"index": index}))
    setup = config.setup_index()
    assert setup is not None and setup["dims"] == 3
    assert setup.get("ann_index_config") == {"kind": "flat"}
    with pytest.raises(StoreConfigError, match="no-such-provider"):
        config.embeddings()
