"""`CheckpointStateAccessor`: the only path to a thread's checkpointed state (S5).

Reads and writes go through the thread's graph bound to one of our savers
(`shared.state.savers`), so values, next nodes and interrupts come out exactly as
LangGraph computes them, and every checkpoint is mode-stamped and mode-checked (S4).
The web binds it to the sync `StatePostgresSaver` (get, history, update); a worker binds
it to its async `FencedPostgresSaver` (the pre-run rollback point and the rollback
itself, fenced by the run's epoch).

State replacements (compaction, a rollback to the empty thread) use a *state-only
graph*: the agent's assembled state schema with a single node that is never run;
`update_state(..., as_node=that node)` writes one new head checkpoint through LangGraph's
own versioning and reducers, and no agent node starts. A rollback to an earlier
checkpoint copies that checkpoint as a child of the head instead (values, versions, what
each node has seen and the pending writes recorded at run start), the way LangGraph forks
a checkpoint, so a paused thread comes back paused. Nothing outside `shared/state/` opens
a saver (tests/unit/test_state_boundary.py).
"""

from __future__ import annotations

import base64
import copy
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson
from langchain_core.runnables import RunnableConfig
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    CheckpointTuple,
    PendingWrite,
    copy_checkpoint,
)
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Interrupt, Overwrite, StateSnapshot, StateUpdate
from psycopg import Connection
from psycopg.rows import DictRow

from shared import serde
from shared.db import DictPool
from shared.errors import CheckpointNotFound, Conflict, NotFound, ValidationFailed
from shared.state.modes import CheckpointMode
from shared.state.savers import DEFAULT_SNAPSHOT_EVERY, HeadsSaver, StatePostgresSaver
from shared.state.upstream import delta_snapshot

DEFAULT_VALUES_MAX_BYTES = 256 * 1024
"""`Settings.thread_values_max_bytes`' default: larger head values get no stored copy."""

log = logging.getLogger(__name__)

NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"
"""LangGraph's task id for writes no task owns (its constant is private since v1)."""

RESTORE_NODE = "threadrun_restore"
"""The one node of a state-only graph; `update_state` writes as it, it never runs."""


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


def interrupt_json(interrupt: Interrupt) -> dict[str, Any]:
    """The LangGraph API's Interrupt shape: `id` and `value`, `response_schema` when set."""
    out: dict[str, Any] = {"id": interrupt.id, "value": serde.to_jsonable(interrupt.value)}
    schema = getattr(interrupt, "response_schema", None)
    if schema is not None:
        json_schema = getattr(schema, "model_json_schema", None)
        out["response_schema"] = (
            json_schema() if callable(json_schema) else serde.to_jsonable(schema)
        )
    return out


@dataclass(frozen=True)
class ThreadHead:
    """What a thread object shows of its head checkpoint (the LangGraph API's Thread
    `values` and `interrupts`): the state values, kept as encoded JSON, and the pending
    interrupts by task id; `checkpoint_id` names the checkpoint they are of.

    Why encoded: a search page's values are encoded once, straight into the response
    (`values_fragment`); decoding them to a tree only to encode it again cost about a
    fifth of a 100-thread page's time (bench/thread_search.py: 175 -> 135 ms at 40
    messages a thread). The stored copies (`shared.state.head_copies`) keep that text.
    """

    values_json: bytes
    interrupts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    checkpoint_id: str | None = None

    @classmethod
    def of(cls, snap: StateSnapshot) -> ThreadHead:
        """The head of a live StateSnapshot (`get_state` of the thread)."""
        return cls(
            values_json=serde.dumps(snap.values),
            interrupts={
                t.id: [interrupt_json(i) for i in t.interrupts] for t in snap.tasks if t.interrupts
            },
            checkpoint_id=(snap.config or {}).get("configurable", {}).get("checkpoint_id"),
        )

    @property
    def values(self) -> Any:
        """The values as plain JSON values."""
        return serde.loads(self.values_json)

    @property
    def values_fragment(self) -> orjson.Fragment:
        """The values for `serde.dumps` to embed as they are."""
        return orjson.Fragment(self.values_json)


@dataclass
class HistoryPage:
    """A page of past states, each already JSON; `truncated` when the byte cap ended it
    before `limit` (the next page starts `before` `last_checkpoint_id`)."""

    states: list[bytes]
    truncated: bool
    last_checkpoint_id: str | None = None

    def body(self) -> bytes:
        """The page as one JSON array."""
        return b"[" + b",".join(self.states) + b"]"

    def decoded(self) -> list[dict[str, Any]]:
        """The page's states as objects."""
        return [serde.loads(state) for state in self.states]


def snapshot_to_json(snap: StateSnapshot) -> dict[str, Any]:
    """The LangGraph API's ThreadState shape."""
    tasks = [
        {
            "id": t.id,
            "name": t.name,
            "path": list(t.path),
            "error": None if t.error is None else repr(t.error),
            "interrupts": [interrupt_json(i) for i in t.interrupts],
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
        "interrupts": [interrupt_json(i) for i in snap.interrupts],
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


def checkpoint_not_found(thread_id: str, checkpoint_id: str) -> CheckpointNotFound:
    """The 404 for a checkpoint the thread does not have."""
    return CheckpointNotFound(f"checkpoint {checkpoint_id} not found in thread {thread_id}")


def delete_checkpoints_in(conn: Connection[DictRow], thread_id: str) -> None:
    """Drop every checkpoint of the thread on the caller's connection, inside its
    transaction (a temporary thread goes with its row, or not at all)."""
    PostgresSaver(conn).delete_thread(thread_id)


def keep_latest_on(conn: Connection[DictRow], thread_id: str) -> None:
    """Prune the thread to its latest checkpoint on `conn` (an idle connection: LangGraph's
    prune runs its own transaction, on one snapshot). The expiry sweep's `keep_latest`
    (shared/retention/); NotImplementedError for a thread written in `delta` mode."""
    PostgresSaver(conn).prune([thread_id], strategy="keep_latest")


class GraphSource(Protocol):
    """Where the accessor finds a thread's graph by id (`shared.agent.graphs.GraphRegistry`).

    A protocol, so the state layer does not import the agent layer
    (tests/unit/test_state_boundary.py).
    """

    def get(self, graph_id: str) -> Pregel[Any, Any, Any, Any]:
        """The compiled graph registered under `graph_id` (no checkpointer)."""
        ...


class CheckpointStateAccessor:
    """get / history / update / rollback of a thread's state through its graph (S5)."""

    def __init__(
        self,
        saver: BaseCheckpointSaver[Any],
        registry: GraphSource,
        *,
        values_max_bytes: int = DEFAULT_VALUES_MAX_BYTES,
    ) -> None:
        self._saver = saver
        self._registry = registry
        self.values_max_bytes = values_max_bytes
        self._graphs: dict[tuple[str, bool], Pregel[Any, Any, Any, Any]] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_pool(
        cls,
        pool: DictPool,
        registry: GraphSource,
        *,
        mode: CheckpointMode,
        values_max_bytes: int = DEFAULT_VALUES_MAX_BYTES,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
    ) -> CheckpointStateAccessor:
        """The web's accessor: sync, over a connection pool."""
        saver = StatePostgresSaver(pool, mode=mode, snapshot_every=snapshot_every)
        return cls(saver, registry, values_max_bytes=values_max_bytes)

    @property
    def mode(self) -> CheckpointMode:
        """The checkpoint mode this accessor stamps and checks."""
        mode: CheckpointMode = getattr(self._saver, "mode", "full")
        return mode

    def _graph(self, graph_id: str, *, state_only: bool = False) -> Pregel[Any, Any, Any, Any]:
        with self._lock:
            graph = self._graphs.get((graph_id, state_only))
            if graph is None:
                agent = self._registry.get(graph_id)
                if state_only:
                    graph = state_only_graph(agent, self._saver)
                else:
                    graph = agent.copy(update={"checkpointer": self._saver})
                self._graphs[(graph_id, state_only)] = graph
            return graph

    @staticmethod
    def _config(
        thread_id: str,
        checkpoint: dict[str, Any] | None = None,
        *,
        configurable: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> RunnableConfig:
        conf: dict[str, Any] = {**(configurable or {}), "thread_id": thread_id, "checkpoint_ns": ""}
        if checkpoint:
            conf.update({k: v for k, v in checkpoint.items() if v is not None and k != "thread_id"})
        config: RunnableConfig = {"configurable": conf}
        if metadata:
            config["metadata"] = metadata
        return config

    # --- web (sync) ---------------------------------------------------------------------
    def get(
        self, thread_id: str, graph_id: str | None, checkpoint: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The thread's current (or a given checkpoint's) state."""
        wanted = (checkpoint or {}).get("checkpoint_id")
        if graph_id is None:
            if wanted:
                raise checkpoint_not_found(thread_id, wanted)
            return empty_state(thread_id)
        snap = self._graph(graph_id).get_state(self._config(thread_id, checkpoint))
        if wanted and snap.created_at is None:
            # LangGraph answers an unknown checkpoint with an empty snapshot carrying the
            # requested config: a 404 here, not the empty state.
            raise checkpoint_not_found(thread_id, wanted)
        if snap.config is None or not snap.config.get("configurable", {}).get("checkpoint_id"):
            return empty_state(thread_id)
        return snapshot_to_json(snap)

    def has_checkpoint(self, thread_id: str, checkpoint_id: str) -> bool:
        """Whether the thread (root namespace) has this checkpoint."""
        config = self._config(thread_id, {"checkpoint_id": checkpoint_id})
        return self._saver.get_tuple(config) is not None

    def history(
        self,
        thread_id: str,
        graph_id: str | None,
        *,
        limit: int,
        before: dict[str, Any] | None,
        metadata: dict[str, Any] | None,
        checkpoint: dict[str, Any] | None,
        max_bytes: int | None = None,
    ) -> HistoryPage:
        """Past states, newest first, each encoded as JSON: at most `limit` of them and, with
        `max_bytes`, no more than fit in that many bytes (always at least one). States are
        read one at a time, so a page of huge states never sits in memory whole."""
        if graph_id is None:
            return HistoryPage([], truncated=False)
        before_cfg = self._config(thread_id, before) if before else None
        snaps = self._graph(graph_id).get_state_history(
            self._config(thread_id, checkpoint),
            filter=metadata or None,
            before=before_cfg,
            limit=limit,
        )
        page = HistoryPage([], truncated=False)
        size = 0
        for snap in snaps:
            encoded = serde.dumps(snapshot_to_json(snap))
            if max_bytes is not None and page.states and size + len(encoded) > max_bytes:
                page.truncated = True
                break
            page.states.append(encoded)
            page.last_checkpoint_id = snap.config["configurable"].get("checkpoint_id")
            size += len(encoded)
        return page

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
        self.refresh_heads({thread_id: graph_id})
        return {"checkpoint": _checkpoint_ref(cfg)}

    def replace(self, thread_id: str, graph_id: str, values: dict[str, Any]) -> dict[str, Any]:
        """Write `values` through the channels' reducers as a new head checkpoint, through
        the state-only graph: no agent node starts or is scheduled by it (C2 compaction).

        A thread paused on a pending node (an interrupt waiting for its answer) is refused
        with Conflict: any state write ends the pending step, and a replacement must not
        silently drop a question the user has not answered yet.
        """
        snap = self._graph(graph_id).get_state(self._config(thread_id))
        if snap.next:
            raise Conflict(
                f"the thread is paused before {', '.join(snap.next)}: resume or cancel it first"
            )
        cfg = self._graph(graph_id, state_only=True).update_state(
            self._config(thread_id), values, as_node=RESTORE_NODE
        )
        self.refresh_heads({thread_id: graph_id})
        return {"checkpoint": _checkpoint_ref(cfg)}

    def delete_thread(self, thread_id: str) -> None:
        """Drop every checkpoint of the thread."""
        self._saver.delete_thread(thread_id)

    def _web_saver(self) -> StatePostgresSaver:
        if not isinstance(self._saver, StatePostgresSaver):
            raise TypeError("this accessor is bound to a worker's saver, not the web's")
        return self._saver

    def heads(self, graph_ids: Mapping[str, str | None]) -> dict[str, ThreadHead]:
        """The head of each thread (thread id -> its graph id, None for a thread that never
        ran) that has a checkpoint.

        From the stored copies (`shared.state.head_copies`) where they are of the head as
        it is now: one statement for the whole page, and the values embedded as stored.
        The others (no copy yet, a head moved without one, values over the size cap) are
        computed from their checkpoints (`compute_heads`), and their copies refreshed
        (lazily filling in threads from before the copies existed).
        """
        wanted = {tid: gid for tid, gid in graph_ids.items() if gid is not None}
        if not wanted:
            return {}
        stored = self._web_saver().read_head_copies(sorted(wanted))
        out: dict[str, ThreadHead] = {}
        stale: dict[str, str] = {}
        for tid, row in stored.items():
            if row.head_id is None:
                continue  # no checkpoint: no head
            if row.usable:
                assert row.values_json is not None  # (usable says so)
                out[tid] = ThreadHead(
                    values_json=row.values_json.encode(),
                    interrupts=orjson.loads(row.interrupts_json or "{}"),
                    checkpoint_id=row.head_id,
                )
            else:
                stale[tid] = wanted[tid]
        if stale:
            computed = self.compute_heads(stale)
            out.update(computed)
            # A copy that is current but over the cap is not written again on every read.
            self._store_heads({t: h for t, h in computed.items() if not stored[t].current})
        return out

    def stored_heads(self, thread_ids: Sequence[str]) -> dict[str, ThreadHead]:
        """The heads of threads whose graph this server does not serve, from their stored
        copies only: without the graph a checkpoint cannot be computed into a state, but
        the copy its last run left is the state as it was then (a copy that is stale or
        over the size cap gives no head)."""
        if not thread_ids:
            return {}
        stored = self._web_saver().read_head_copies(sorted(thread_ids))
        return {
            tid: ThreadHead(
                values_json=row.values_json.encode(),
                interrupts=orjson.loads(row.interrupts_json or "{}"),
                checkpoint_id=row.head_id,
            )
            for tid, row in stored.items()
            if row.usable and row.values_json is not None
        }

    def refresh_heads(self, graph_ids: Mapping[str, str | None]) -> None:
        """Recompute and store the head copies of threads whose head the web just moved
        (state update, compaction, copy, prune); never fails the request that did it."""
        wanted: dict[str, str] = {tid: gid for tid, gid in graph_ids.items() if gid is not None}
        if wanted:
            try:
                self._store_heads(self.compute_heads(wanted))
            except Exception:  # reads fall back to the checkpoint and refresh it then
                log.exception("refreshing thread head copies failed")

    def _store_heads(self, heads: Mapping[str, ThreadHead]) -> None:
        """Store head copies, unfenced (idle threads only); a failure only logs: a read
        that finds no current copy computes the head instead."""
        if not heads:
            return
        try:
            self._web_saver().write_head_copies(heads.items(), self.values_max_bytes)
        except Exception:
            log.exception("storing thread head copies failed")

    def compute_heads(self, graph_ids: Mapping[str, str]) -> dict[str, ThreadHead]:
        """The head of each thread that has a checkpoint, computed from its checkpoint:
        its checkpoints in one query, then each thread's `get_state` through its graph,
        served from those rows (`HeadsSaver`).

        Why not one `get_state` per thread: a page of 100 thread objects would be 100
        round trips through the saver's lock (73 ms against 44 ms for a page of 100
        six-message threads, database on localhost; bench/thread_search.py).
        """
        if not graph_ids:
            return {}
        saver = self._web_saver()
        tuples = saver.get_heads(sorted(graph_ids))
        if not tuples:
            return {}
        served = HeadsSaver(saver, tuples)
        graphs: dict[str, Pregel[Any, Any, Any, Any]] = {}
        out: dict[str, ThreadHead] = {}
        for tid in tuples:
            gid = graph_ids[tid]
            graph = graphs.get(gid)
            if graph is None:
                graph = graphs[gid] = self._graph(gid).copy(update={"checkpointer": served})
            out[tid] = ThreadHead.of(graph.get_state(self._config(tid)))
        return out

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy the whole checkpoint history of a thread (every namespace, with the pending
        writes and blobs) to a new thread id, in one statement."""
        self._web_saver().copy_thread(source_thread_id, target_thread_id)

    def keep_latest(self, thread_ids: Sequence[str]) -> None:
        """Keep only each thread's latest checkpoint (with its pending writes), deleting the
        older checkpoints, their writes and the blobs only they used.

        LangGraph's own `PostgresSaver.prune` does it, each thread in a transaction of its
        own on one snapshot, so a run appending meanwhile is safe. It refuses, before
        pruning anything, threads whose state uses a `DeltaChannel` (their latest value is
        rebuilt from older checkpoints): every thread written in `delta` mode; 422.
        """
        if not thread_ids:
            return
        try:
            self._web_saver().prune(list(thread_ids), strategy="keep_latest")
        except NotImplementedError as exc:
            raise ValidationFailed(
                f"strategy keep_latest cannot prune threads written in 'delta' checkpoint"
                f" mode (their messages are rebuilt from older checkpoints): {exc}",
                field="strategy",
            ) from exc

    # --- workers (async) -----------------------------------------------------------------
    async def ahead_id(self, thread_id: str) -> str | None:
        """The id of the thread's head checkpoint (mode-checked), or None for a new thread."""
        tup = await self._saver.aget_tuple(self._config(thread_id))
        return str(tup.checkpoint["id"]) if tup is not None else None

    async def aget_snapshot(self, thread_id: str, graph_id: str) -> StateSnapshot:
        """The head StateSnapshot through the agent graph (values, next, interrupts)."""
        return await self._graph(graph_id).aget_state(self._config(thread_id))

    async def ahead(self, thread_id: str, graph_id: str) -> ThreadHead | None:
        """The thread's head as thread objects show it (None: no checkpoint), for the head
        copy a run's finalize stores (`shared.state.head_copies`)."""
        snap = await self.aget_snapshot(thread_id, graph_id)
        head = ThreadHead.of(snap)
        return head if head.checkpoint_id else None

    async def acommit_as_node(
        self,
        thread_id: str,
        graph_id: str,
        values: Any,
        *,
        as_node: str,
        configurable: dict[str, Any],
    ) -> None:
        """Write `values` as if `as_node` returned them, then drop the tasks they would
        trigger: a new head with nothing next (a stopped run's partial answer). Two
        supersteps of one update, fenced by the run's `configurable` keys (L2)."""
        await self._graph(graph_id).abulk_update_state(
            self._config(thread_id, configurable=configurable),
            [[StateUpdate(values, as_node)], [StateUpdate(None, END)]],
        )

    async def arollback_point(self, thread_id: str) -> tuple[str | None, list[list[str]]]:
        """The thread's rollback point before a run (R5): the head checkpoint's id (None for
        a thread with none) and a JSON-safe copy of its pending writes.

        The copy matters: a run that resumes the head (a Command, an interrupt answered)
        adds its own writes to that same checkpoint.
        """
        return self.rollback_point(await self.ahead_tuple(thread_id))

    async def ahead_tuple(self, thread_id: str) -> CheckpointTuple | None:
        """The thread's head checkpoint as the saver reads it (mode-checked), or None."""
        return await self._saver.aget_tuple(self._config(thread_id))

    def rollback_point(self, head: CheckpointTuple | None) -> tuple[str | None, list[list[str]]]:
        """`arollback_point` of a head already read."""
        if head is None:
            return None, []
        return str(head.checkpoint["id"]), self.dump_writes(head.pending_writes or [])

    def dump_writes(self, writes: list[PendingWrite]) -> list[list[str]]:
        """Pending writes as JSON rows, values serialized by the saver's own serde."""
        rows = []
        for task_id, channel, value in writes:
            typ, data = self._saver.serde.dumps_typed(value)
            rows.append([task_id, channel, typ, base64.b64encode(data).decode()])
        return rows

    def load_writes(self, rows: list[list[str]]) -> list[PendingWrite]:
        """The inverse of `dump_writes`."""
        return [
            (task_id, channel, self._saver.serde.loads_typed((typ, base64.b64decode(data))))
            for task_id, channel, typ, data in rows
        ]

    async def arollback(
        self,
        thread_id: str,
        graph_id: str,
        to_checkpoint_id: str | None,
        *,
        pending_writes: list[PendingWrite] | None = None,
        configurable: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str | None:
        """Restore the state of `to_checkpoint_id` (None: the empty thread) as a new head.

        History stays linear: the restore is a child of the current head. `pending_writes`
        are the target's pending writes as recorded before the run (default: as they are
        now). Returns the new head's id, or None when nothing was written after the
        target. `configurable` carries the run's fence keys, so a stale attempt cannot
        restore over a newer owner's work; `metadata` (primitive values) is recorded on
        the new checkpoint.
        """
        head = await self._saver.aget_tuple(self._config(thread_id))
        if head is None:
            return None
        if head.checkpoint["id"] == to_checkpoint_id and pending_writes is None:
            return None
        if to_checkpoint_id is None:
            return await self._aclear(thread_id, graph_id, configurable, metadata)
        return await self._acopy_as_head(
            thread_id, graph_id, head, to_checkpoint_id, pending_writes, configurable, metadata
        )

    async def _acopy_as_head(
        self,
        thread_id: str,
        graph_id: str,
        head: CheckpointTuple,
        to_checkpoint_id: str,
        pending_writes: list[PendingWrite] | None,
        configurable: dict[str, Any] | None,
        metadata: dict[str, Any] | None,
    ) -> str:
        """The target checkpoint, copied as a child of the head: values, channel versions,
        what each node has seen (so the same nodes are next), and its pending writes
        re-keyed to the copy's tasks (so an interrupt waits again, finished tasks stay
        finished). This is what LangGraph's own fork does to a checkpoint, with the head
        as parent instead of the target's parent, plus the pending writes it leaves out.

        Delta channels get a full snapshot under a fresh version: their value must not
        be rebuilt by replaying the head's ancestors, which include the undone run.
        """
        target_cfg = self._config(thread_id, {"checkpoint_id": to_checkpoint_id})
        target = await self._saver.aget_tuple(target_cfg)
        if target is None:
            raise NotFound(f"checkpoint {to_checkpoint_id} of thread {thread_id} not found")
        agent = self._graph(graph_id)
        new = copy_checkpoint(target.checkpoint)
        new_versions: dict[str, Any] = {}
        deltas = [k for k, ch in agent.channels.items() if isinstance(ch, DeltaChannel)]
        if deltas:
            values = (await self._graph(graph_id, state_only=True).aget_state(target_cfg)).values
            for key in deltas:
                if key not in values:
                    continue
                old = new["channel_versions"].get(key)
                version = self._saver.get_next_version(old, None)
                new["channel_versions"][key] = version
                new["channel_values"][key] = delta_snapshot(values[key])
                new_versions[key] = version
                for seen in new["versions_seen"].values():
                    if key in seen and seen[key] == old:
                        seen[key] = version
        step = int(head.metadata.get("step", -1)) + 1
        new["id"] = str(uuid6(clock_seq=step))
        new["ts"] = datetime.now(UTC).isoformat()
        meta: dict[str, Any] = {
            "source": "update",
            "step": step,
            "parents": target.metadata.get("parents", {}),
            **{
                k: v for k, v in (metadata or {}).items() if isinstance(v, str | int | float | bool)
            },
        }
        put_cfg = self._config(
            thread_id, {"checkpoint_id": head.checkpoint["id"]}, configurable=configurable
        )
        cfg = await self._saver.aput(put_cfg, new, meta, new_versions)  # type: ignore[arg-type]
        writes = (target.pending_writes or []) if pending_writes is None else pending_writes
        await self._acopy_pending_writes(agent, target.config, writes, cfg, configurable)
        return str(cfg["configurable"]["checkpoint_id"])

    async def _acopy_pending_writes(
        self,
        agent: Pregel[Any, Any, Any, Any],
        target_cfg: RunnableConfig,
        writes: list[PendingWrite],
        new_cfg: RunnableConfig,
        configurable: dict[str, Any] | None,
    ) -> None:
        """The target's pending writes, under the ids its tasks have on the copy."""
        if not writes:
            return
        old_tasks = (await agent.aget_state(target_cfg)).tasks
        new_tasks = (await agent.aget_state(new_cfg)).tasks
        by_key = {(t.name, tuple(t.path)): t.id for t in new_tasks}
        renamed = {t.id: by_key.get((t.name, tuple(t.path))) for t in old_tasks}
        grouped: dict[str, list[tuple[str, Any]]] = {}
        for task_id, channel, value in writes:
            new_id = task_id if task_id == NULL_TASK_ID else renamed.get(task_id)
            if new_id is None:
                raise RuntimeError(f"rollback: no task on the copy for pending write {task_id}")
            grouped.setdefault(new_id, []).append((channel, value))
        write_cfg: RunnableConfig = {
            "configurable": {**(configurable or {}), **new_cfg["configurable"]}
        }
        for task_id, task_writes in grouped.items():
            await self._saver.aput_writes(write_cfg, task_writes, task_id)

    async def _aclear(
        self,
        thread_id: str,
        graph_id: str,
        configurable: dict[str, Any] | None,
        metadata: dict[str, Any] | None,
    ) -> str | None:
        """Back to the empty thread: every channel reset through the state-only graph."""
        graph = self._graph(graph_id, state_only=True)
        head = await graph.aget_state(self._config(thread_id))
        updates = {
            key: _replacement(graph.channels[key], _empty_value(graph.channels[key]))
            for key in sorted(head.values)
            if key in graph.channels
        }
        if not updates:
            return None
        cfg = await graph.aupdate_state(
            self._config(thread_id, configurable=configurable, metadata=metadata),
            updates,
            as_node=RESTORE_NODE,
        )
        return str(cfg["configurable"]["checkpoint_id"])


def state_only_graph(
    agent: Pregel[Any, Any, Any, Any], saver: BaseCheckpointSaver[Any]
) -> Pregel[Any, Any, Any, Any]:
    """The agent's assembled state schema with one node that never runs (S5)."""
    builder = getattr(agent, "builder", None)
    schema = getattr(builder, "state_schema", None)
    if schema is None:
        raise TypeError(f"graph {agent.name!r} is not a StateGraph: no state schema to restore")
    sg: StateGraph[Any] = StateGraph(schema)
    sg.add_node(RESTORE_NODE, _never_runs)
    sg.add_edge(START, RESTORE_NODE)
    return sg.compile(checkpointer=saver, name=f"{agent.name}:state")


def _replacement(spec: Any, value: Any) -> Any:
    """A write that sets the channel to `value`: `Overwrite` past a reducer, else the value
    itself (a plain last-value channel stores its write as is)."""
    if isinstance(spec, BinaryOperatorAggregate | DeltaChannel):
        return Overwrite(value)
    return value


def _empty_value(spec: Any) -> Any:
    """A channel's value before any write: [] / {} for containers, else None."""
    if isinstance(spec, DeltaChannel) or not spec.is_available():
        return None  # a DeltaChannel turns Overwrite(None) into its empty container
    return copy.deepcopy(spec.get())


def _never_runs(state: Any) -> dict[str, Any]:
    raise RuntimeError("the state-only graph's node is never executed")
