"""The vocabulary of assistants: frozen `Assistant` / `AssistantVersion` records, what a
version holds (`AssistantContent`), and the pure rules of an assistant's configuration.

An assistant is a versioned configuration of a graph of the config. Every version is kept;
the assistant row carries the current one. The rules here are plain functions with no IO
(STYLE 3): how a create or patch request becomes a version (`synced`, `AssistantPatch`),
who may change an assistant (`check_writable`), and how a version's config and context lie
under a run's own values (`merged_config`, `merged_context`; `RunRequest.on_assistant` applies them).
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.errors import AssistantReadOnly, ValidationFailed
from shared.vocab import JSONObject

OWNER_NAMESPACE = uuid.UUID("0c3c8a6e-2f4b-4d9e-8a51-7b1e6d2f9c34")
"""The root of the per-owner namespaces of client-chosen assistant ids (fixed: changing it
would orphan every stored client-chosen assistant)."""


def storage_id(owner: str, public_id: str) -> str:
    """Where `owner`'s assistant with the client-chosen `public_id` is stored (A4): per
    owner, whether or not another user has that public id, so `POST /assistants
    {"assistant_id": X}` answers the same whoever else has X (as thread ids do)."""
    return str(uuid.uuid5(uuid.uuid5(OWNER_NAMESPACE, owner), str(uuid.UUID(public_id))))


SYSTEM_METADATA: JSONObject = {"created_by": "system"}
"""The metadata of a graph's system assistant, as the LangGraph Agent Server gives it."""

ASSISTANT_FIELDS = (
    "assistant_id",
    "graph_id",
    "name",
    "description",
    "config",
    "context",
    "created_at",
    "updated_at",
    "metadata",
    "version",
)
"""The fields of the SDK's Assistant shape (what `select` may name), in its order."""

CONFIGURABLE_AND_CONTEXT = (
    "Cannot specify both configurable and context. Prefer setting context alone. Context was "
    "introduced in LangGraph 0.6.0 and is the long term planned replacement for configurable."
)


class OnConflict(enum.StrEnum):
    """What creating an assistant under an id that exists does (`if_exists`)."""

    RAISE = "raise"
    DO_NOTHING = "do_nothing"


@dataclass(frozen=True, slots=True)
class AssistantContent:
    """What one version holds: the graph, its config and context, a name and metadata."""

    graph_id: str
    name: str
    description: str | None = None
    metadata: JSONObject = field(default_factory=dict)
    config: JSONObject = field(default_factory=dict)
    context: JSONObject = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Assistant:
    """One `assistants` row: its current version's content, its owner (None: a system one).
    `assistant_id` is the id its owner sees (its public id), `storage_id` its row's key."""

    assistant_id: str
    graph_id: str
    name: str
    version: int
    created_at: dt.datetime
    updated_at: dt.datetime
    owner: str | None = None
    description: str | None = None
    metadata: JSONObject = field(default_factory=dict)
    config: JSONObject = field(default_factory=dict)
    context: JSONObject = field(default_factory=dict)
    storage_id: str = ""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Assistant:
        """The assistant of an `assistants` row (a dict row of psycopg)."""
        return cls(
            assistant_id=str(row.get("public_id") or row["assistant_id"]),
            storage_id=str(row["assistant_id"]),
            graph_id=row["graph_id"],
            name=row["name"],
            version=int(row["version"]),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            owner=row.get("owner"),
            description=row.get("description"),
            metadata=row.get("metadata") or {},
            config=row.get("config") or {},
            context=row.get("context") or {},
        )

    @property
    def system(self) -> bool:
        """Whether this is a graph's system assistant (no owner)."""
        return self.owner is None


@dataclass(frozen=True, slots=True)
class AssistantVersion:
    """One `assistant_versions` row."""

    assistant_id: str
    version: int
    graph_id: str
    name: str
    created_at: dt.datetime
    description: str | None = None
    metadata: JSONObject = field(default_factory=dict)
    config: JSONObject = field(default_factory=dict)
    context: JSONObject = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> AssistantVersion:
        """The version of an `assistant_versions` row (joined with its assistant's
        `public_id`: the id its owner knows)."""
        return cls(
            assistant_id=str(row.get("public_id") or row["assistant_id"]),
            version=int(row["version"]),
            graph_id=row["graph_id"],
            name=row["name"],
            created_at=row["created_at"],
            description=row.get("description"),
            metadata=row.get("metadata") or {},
            config=row.get("config") or {},
            context=row.get("context") or {},
        )


@dataclass(frozen=True, slots=True)
class AssistantPatch:
    """A PATCH: each field given replaces the current one, metadata is merged key-wise."""

    graph_id: str | None = None
    name: str | None = None
    description: str | None = None
    metadata: JSONObject | None = None
    config: JSONObject | None = None
    context: JSONObject | None = None

    def applied_to(self, current: Assistant) -> AssistantContent:
        """The next version's content (the LangGraph Agent Server's rules: an empty config
        keeps the current one, as does a missing context; config and context stay in sync)."""
        config, context = synced(self.config or {}, self.context)
        return AssistantContent(
            graph_id=self.graph_id if self.graph_id is not None else current.graph_id,
            name=self.name if self.name is not None else current.name,
            description=self.description if self.description is not None else current.description,
            metadata={**current.metadata, **(self.metadata or {})},
            config=config or current.config,
            context=context if context is not None else current.context,
        )


def synced(config: JSONObject, context: JSONObject | None) -> tuple[JSONObject, JSONObject | None]:
    """Config and context kept in step as the LangGraph Agent Server keeps them.

    `config.configurable` becomes the context too, or a context becomes
    `config.configurable`; giving both is refused (400), since a graph reads one or the
    other and the two would disagree.
    """
    configurable = config.get("configurable")
    if configurable and context:
        raise ValidationFailed(CONFIGURABLE_AND_CONTEXT, field="context", status=400)
    if configurable:
        return config, dict(configurable)
    if context:
        return {**config, "configurable": dict(context)}, context
    return config, context


def check_writable(assistant: Assistant, owner: str) -> None:
    """Raise AssistantReadOnly (403) unless `owner` may change `assistant`.

    A system assistant is visible to everyone, so refusing it as missing (404) would
    contradict the GET that just returned it; 403 is what the LangGraph Agent Server
    answers when its auth handler lets a user read a resource but not change it. Another
    user's assistant never gets here: it is not visible, so it is a 404 like a missing one.
    """
    if assistant.system or assistant.owner != owner:
        raise AssistantReadOnly(f"assistant {assistant.assistant_id} is read-only")


def merged_config(base: JSONObject, own: JSONObject) -> JSONObject:
    """A run's config on top of its assistant's: top-level keys replaced, `configurable`
    and `metadata` merged key-wise, the run's own values winning."""
    out = {**base, **own}
    for key in ("configurable", "metadata"):
        if key in base or key in own:
            out[key] = {**(base.get(key) or {}), **(own.get(key) or {})}
    return out


def merged_context(base: JSONObject, own: JSONObject | None) -> JSONObject | None:
    """A run's context on top of its assistant's (key-wise, the run winning); None when
    neither has one, so a graph without a context schema is called exactly as before."""
    if not base:
        return own
    return {**base, **(own or {})}
