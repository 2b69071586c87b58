"""The `store` section of the langgraph.json-compatible config: semantic index and TTL.

Same shape as the LangGraph Agent Server's:

    "store": {
        "index": {"dims": 1536, "embed": "openai:text-embedding-3-small", "fields": ["text"]},
        "ttl": {"refresh_on_read": true, "default_ttl": 1440, "sweep_interval_minutes": 60}
    }

`embed` is a LangChain provider string (`init_embeddings`) or, when it contains `.py:`, a
function or `Embeddings` object in a file beside the config (`./embed.py:embed`), as the
official server reads it. Without `index` the store has no semantic search (a search with
`query` is refused); the index needs the pgvector extension in PostgreSQL.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from langchain_core.embeddings import Embeddings
from langgraph.store.base import TTLConfig, ensure_embeddings
from langgraph.store.postgres.base import PostgresIndexConfig
from pydantic import ValidationError

from shared.errors import ConfigError
from shared.project import StoreSection


class StoreConfigError(ConfigError):
    """The config file's `store` section is unusable."""


@dataclass(frozen=True)
class StoreConfig:
    """The store section of one config file, with the folder its relative paths start from."""

    section: StoreSection
    base: Path

    @classmethod
    def from_file(cls, path: Path) -> StoreConfig:
        """Read `store` from a config file; a missing file or section is the default store."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raw = {}
        except (OSError, ValueError) as exc:
            raise StoreConfigError(f"config {path} cannot be read: {exc}") from exc
        store = raw.get("store") if isinstance(raw, dict) else None
        try:
            section = StoreSection.model_validate(store or {})
        except ValidationError as exc:
            raise StoreConfigError(f'config {path}: "store" is invalid: {exc}') from exc
        return cls(section, path.resolve().parent)

    @property
    def semantic(self) -> bool:
        """Whether an embeddings index is configured (search by `query`)."""
        return self.section.index is not None

    def ttl(self) -> TTLConfig:
        """The TTL config. Expired items are omitted from reads even before a sweep."""
        ttl = self.section.ttl
        config = TTLConfig(refresh_on_read=ttl.refresh_on_read, omit_expired=True)
        if ttl.default_ttl is not None:
            config["default_ttl"] = whole_minutes(ttl.default_ttl)
        if ttl.sweep_interval_minutes is not None:
            config["sweep_interval_minutes"] = ttl.sweep_interval_minutes
        return config

    def index(self, *, embeddings: Embeddings | None = None) -> PostgresIndexConfig | None:
        """The store's index config; `embeddings` stands in for resolving `embed`."""
        section = self.section.index
        if section is None:
            return None
        config = PostgresIndexConfig(
            dims=section.dims, embed=embeddings or self.embeddings(), fields=section.fields
        )
        if section.distance_type is not None:
            config["distance_type"] = section.distance_type
        if section.ann_index_config is not None:
            config["ann_index_config"] = section.ann_index_config  # type: ignore[typeddict-item]
        return config

    def setup_index(self) -> PostgresIndexConfig | None:
        """The index config for creating tables: dims and index kind only, so migrating never
        loads an embeddings model (or needs its API key)."""
        return self.index(embeddings=ensure_embeddings(_never_embed))

    def embeddings(self) -> Embeddings:
        """The configured embeddings (a provider string, or a `.py:` object)."""
        assert self.section.index is not None
        embed = self.section.index.embed
        if ".py:" not in embed:
            try:
                return ensure_embeddings(embed)
            except Exception as exc:  # any provider failure is a config error
                raise StoreConfigError(f"store.index.embed {embed!r}: {exc}") from exc
        from shared.agent.graphs import load_variable

        value = load_variable("store.index.embed", embed, self.base)
        if not isinstance(value, Embeddings) and not callable(value):
            raise StoreConfigError(f"store.index.embed {embed!r} is not a function or Embeddings")
        return ensure_embeddings(value)


def whole_minutes(minutes: float) -> int:
    """A TTL as PostgresStore keeps it: whole minutes (its `ttl_minutes` column is an
    integer, and a read's refresh sets `expires_at` from it), so a fraction is rounded up;
    kept as given, 0.5 would be stored as 0 and the first refresh would expire the item."""
    return max(1, math.ceil(minutes))


def _never_embed(texts: Sequence[str]) -> list[list[float]]:
    raise AssertionError("the store's tables are set up without embedding anything")
