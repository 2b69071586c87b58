"""`AssistantManager`: assistants for a caller, the system assistants, and their graphs.

System assistants are rows, upserted by every web process at start (`ensure_system`),
not served virtually: search, count, sort, pagination and versions then run as one SQL
query over one table for system and user assistants alike, and a run resolves either
with one primary-key read. Their ids are `assistant_id_for(graph)` (uuid5 of the graph
name, the LangGraph Agent Server's own), so they are the same across restarts and hosts,
and the upsert (`INSERT … ON CONFLICT DO NOTHING`) is idempotent and safe when several
processes start at once. A graph dropped from the config keeps its row, which is hidden
(reads filter system assistants by the served graphs) until the graph comes back.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel

from shared.agent.graphs import GraphNotFound, assistant_id_for
from shared.assistants.model import (
    SYSTEM_METADATA,
    Assistant,
    AssistantContent,
    AssistantPatch,
    AssistantVersion,
    OnConflict,
    storage_id,
    synced,
)
from shared.assistants.store import AssistantFilter, AssistantStore
from shared.errors import AssistantNotFound
from shared.vocab import JSONObject

log = logging.getLogger(__name__)

DEFAULT_NAME = "Untitled"
"""A created assistant's name when the request gives none (the LangGraph Agent Server's)."""


class GraphSource(Protocol):
    """The graphs of the config (`shared.agent.graphs.GraphRegistry`)."""

    def ids(self) -> list[str]:
        """Graph ids, in config order."""
        ...

    def get(
        self, graph_id: str, config: RunnableConfig | None = None
    ) -> Pregel[Any, Any, Any, Any]:
        """The compiled graph; GraphNotFound for an unknown id."""
        ...


@dataclass(frozen=True, slots=True)
class AssistantSpec:
    """A request for a new assistant (`POST /assistants`)."""

    graph_id: str
    assistant_id: str | None = None
    name: str | None = None
    description: str | None = None
    metadata: JSONObject = field(default_factory=dict)
    config: JSONObject = field(default_factory=dict)
    context: JSONObject | None = None
    if_exists: OnConflict = OnConflict.RAISE


def system_content(graph_id: str) -> AssistantContent:
    """What a graph's system assistant holds: the graph, its name, no configuration."""
    return AssistantContent(graph_id=graph_id, name=graph_id, metadata=dict(SYSTEM_METADATA))


class AssistantManager:
    """Decisions about assistants; HTTP views and run admission call this, never the store."""

    def __init__(self, store: AssistantStore, graphs: GraphSource) -> None:
        self.store = store
        self._graphs = graphs
        # System assistants by id, kept once read: their rows never change after the
        # upsert (`ensure_system` inserts or does nothing; every write refuses them,
        # `check_writable`), so a run on a graph name costs no read on its admission path.
        self._system: dict[str, Assistant] = {}

    def ensure_system(self) -> list[str]:
        """Upsert a system assistant per graph of the config; return the ids created now."""
        contents = {assistant_id_for(g): system_content(g) for g in self._graphs.ids()}
        created = self.store.ensure_system(contents)
        if created:
            log.info("system assistants created", extra={"assistant_ids": created})
        return created

    def assistant_id(self, id_or_graph: str) -> str:
        """The assistant id named by `id_or_graph`: a graph name names its system assistant;
        anything that is neither a graph name nor a UUID cannot exist (404)."""
        if id_or_graph in self._graphs.ids():
            return assistant_id_for(id_or_graph)
        try:
            return str(uuid.UUID(id_or_graph))
        except (ValueError, TypeError, AttributeError):
            raise AssistantNotFound(f"assistant {id_or_graph[:64]!r} not found") from None

    def get(self, owner: str, id_or_graph: str) -> Assistant:
        """The caller's or a system assistant; AssistantNotFound otherwise."""
        assistant_id = self.assistant_id(id_or_graph)
        known = self._system.get(assistant_id)
        if known is not None and known.graph_id in self._graphs.ids():
            return known
        assistant = self.store.get(assistant_id, owner, self._graphs.ids())
        if assistant.system:
            self._system[assistant_id] = assistant
        return assistant

    def resolve(self, owner: str, id_or_graph: str) -> Assistant:
        """The assistant a run of `owner` runs on, whose graph this deployment serves."""
        assistant = self.get(owner, id_or_graph)
        self._require_graph(assistant.graph_id)
        return assistant

    def create(self, owner: str, spec: AssistantSpec) -> Assistant:
        """Create an assistant owned by `owner` (version 1)."""
        self._require_graph(spec.graph_id)
        config, context = synced(spec.config, spec.context)
        content = AssistantContent(
            graph_id=spec.graph_id,
            name=spec.name or DEFAULT_NAME,
            description=spec.description,
            metadata=spec.metadata,
            config=config,
            context=context or {},
        )
        # A client-chosen id is stored per owner (A4: no user's choice meets another's).
        chosen = self.assistant_id(spec.assistant_id) if spec.assistant_id else None
        assistant, _ = self.store.create(
            chosen or str(uuid.uuid4()),
            owner,
            content,
            if_exists=spec.if_exists,
            graphs=self._graphs.ids(),
            storage_id=storage_id(owner, chosen) if chosen else None,
        )
        return assistant

    def patch(self, owner: str, id_or_graph: str, patch: AssistantPatch) -> Assistant:
        """Write a new version of the caller's assistant and make it current."""
        if patch.graph_id is not None:
            self._require_graph(patch.graph_id)
        return self.store.patch(self.assistant_id(id_or_graph), owner, self._graphs.ids(), patch)

    def set_latest(self, owner: str, id_or_graph: str, version: int) -> Assistant:
        """Make `version` the caller's assistant's current version."""
        return self.store.set_latest(
            self.assistant_id(id_or_graph), owner, self._graphs.ids(), version
        )

    def delete(self, owner: str, id_or_graph: str) -> str:
        """Delete the caller's assistant with its versions; return its id."""
        assistant_id = self.assistant_id(id_or_graph)
        self.store.delete(assistant_id, owner, self._graphs.ids())
        return assistant_id

    def search(
        self,
        owner: str,
        where: AssistantFilter,
        *,
        limit: int,
        offset: int,
        sort_by: str,
        sort_order: str,
    ) -> list[Assistant]:
        """Visible assistants matching `where`."""
        return self.store.search(
            owner,
            self._graphs.ids(),
            where,
            limit=limit,
            offset=offset,
            sort_by=sort_by,
            sort_order=sort_order,
        )

    def count(self, owner: str, where: AssistantFilter) -> int:
        """How many visible assistants match `where`."""
        return self.store.count(owner, self._graphs.ids(), where)

    def versions(
        self, owner: str, id_or_graph: str, *, metadata: JSONObject, limit: int, offset: int
    ) -> list[AssistantVersion]:
        """The versions of a visible assistant, newest first."""
        return self.store.versions(
            self.assistant_id(id_or_graph),
            owner,
            self._graphs.ids(),
            metadata=metadata,
            limit=limit,
            offset=offset,
        )

    def compiled(
        self, owner: str, id_or_graph: str
    ) -> tuple[Assistant, Pregel[Any, Any, Any, Any]]:
        """A visible assistant and its graph, built with its config (factories that take a
        config see it, as they do at run time)."""
        assistant = self.get(owner, id_or_graph)
        graph = self._graphs.get(assistant.graph_id, cast(RunnableConfig, dict(assistant.config)))
        return assistant, graph

    def _require_graph(self, graph_id: str) -> None:
        if graph_id not in self._graphs.ids():
            raise GraphNotFound(graph_id)
