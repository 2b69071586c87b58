"""`CheckpointStateAccessor`: the only path from the API to a thread's checkpointed state (S5).

The web process reads and updates state through the thread's graph bound to a sync
PostgresSaver, so values, next nodes and interrupts come out exactly as LangGraph
computes them.
"""

from __future__ import annotations

import threading
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.pregel import Pregel
from langgraph.types import StateSnapshot

from shared import serde
from shared.agent.graphs import GraphRegistry
from shared.db import DictPool


def _checkpoint_ref(config: RunnableConfig | dict[str, Any] | None) -> dict[str, Any] | None:
    if not config:
        return None
    conf = config.get("configurable", {})
    return {
        "thread_id": conf.get("thread_id"),
        "checkpoint_ns": conf.get("checkpoint_ns", ""),
        "checkpoint_id": conf.get("checkpoint_id"),
        "checkpoint_map": conf.get("checkpoint_map"),
    }


def snapshot_to_json(snap: StateSnapshot) -> dict[str, Any]:
    """The LangGraph API's ThreadState shape."""
    tasks = [
        {
            "id": t.id,
            "name": t.name,
            "path": list(t.path),
            "error": None if t.error is None else repr(t.error),
            "interrupts": [serde.to_jsonable(i) for i in t.interrupts],
            "checkpoint": _checkpoint_ref(t.state) if isinstance(t.state, dict) else None,
            "state": None,
            "result": serde.to_jsonable(t.result) if t.result is not None else None,
        }
        for t in snap.tasks
    ]
    return {
        "values": serde.to_jsonable(snap.values),
        "next": list(snap.next),
        "tasks": tasks,
        "metadata": serde.to_jsonable(snap.metadata) if snap.metadata else {},
        "created_at": snap.created_at,
        "checkpoint": _checkpoint_ref(snap.config),
        "parent_checkpoint": _checkpoint_ref(snap.parent_config),
        "interrupts": [serde.to_jsonable(i) for i in snap.interrupts],
        "checkpoint_id": (snap.config or {}).get("configurable", {}).get("checkpoint_id"),
    }


def empty_state(thread_id: str) -> dict[str, Any]:
    """The state of a thread that has no checkpoint yet."""
    return {
        "values": {},
        "next": [],
        "tasks": [],
        "metadata": {},
        "created_at": None,
        "checkpoint": {
            "thread_id": thread_id,
            "checkpoint_ns": "",
            "checkpoint_id": None,
            "checkpoint_map": None,
        },
        "parent_checkpoint": None,
        "interrupts": [],
        "checkpoint_id": None,
    }


class CheckpointStateAccessor:
    """get / history / update of a thread's state through its graph (sync, web side)."""

    def __init__(self, pool: DictPool, registry: GraphRegistry) -> None:
        self._saver = PostgresSaver(pool)  # type: ignore[arg-type]
        self._registry = registry
        self._graphs: dict[str, Pregel] = {}
        self._lock = threading.Lock()

    def _graph(self, graph_id: str) -> Pregel:
        with self._lock:
            graph = self._graphs.get(graph_id)
            if graph is None:
                graph = self._registry.get(graph_id).copy(update={"checkpointer": self._saver})
                self._graphs[graph_id] = graph
            return graph

    @staticmethod
    def _config(thread_id: str, checkpoint: dict[str, Any] | None = None) -> RunnableConfig:
        conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
        if checkpoint:
            conf.update({k: v for k, v in checkpoint.items() if v is not None and k != "thread_id"})
        return {"configurable": conf}

    def get(
        self, thread_id: str, graph_id: str | None, checkpoint: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The thread's current (or a given checkpoint's) state."""
        if graph_id is None:
            return empty_state(thread_id)
        snap = self._graph(graph_id).get_state(self._config(thread_id, checkpoint))
        if snap.config is None or not snap.config.get("configurable", {}).get("checkpoint_id"):
            return empty_state(thread_id)
        return snapshot_to_json(snap)

    def history(
        self,
        thread_id: str,
        graph_id: str | None,
        *,
        limit: int,
        before: dict[str, Any] | None,
        metadata: dict[str, Any] | None,
        checkpoint: dict[str, Any] | None,
    ) -> list[dict[str, Any]]:
        """Past states, newest first."""
        if graph_id is None:
            return []
        before_cfg = self._config(thread_id, before) if before else None
        snaps = self._graph(graph_id).get_state_history(
            self._config(thread_id, checkpoint),
            filter=metadata or None,
            before=before_cfg,
            limit=limit,
        )
        return [snapshot_to_json(s) for s in snaps]

    def update(
        self,
        thread_id: str,
        graph_id: str,
        values: Any,
        *,
        as_node: str | None,
        checkpoint: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """Write `values` as if `as_node` returned them; a new head checkpoint."""
        cfg = self._graph(graph_id).update_state(
            self._config(thread_id, checkpoint), values, as_node=as_node
        )
        return {"checkpoint": _checkpoint_ref(cfg)}

    def delete_thread(self, thread_id: str) -> None:
        """Drop every checkpoint of the thread."""
        self._saver.delete_thread(thread_id)
