"""Our checkpoint savers: LangGraph's Postgres savers plus the mode stamp (S4) and, for the
worker, the epoch fence (L2).

`StatePostgresSaver` (sync, web side) and `FencedPostgresSaver` (async, workers) both
stamp every checkpoint's metadata with the process's checkpoint mode and check it on every
read (`shared.state.modes`), so a `full` process never mistakes a `delta` checkpoint for an
empty thread.

The fence: a run attempt's checkpoint writes carry its run id and lease in `configurable`.
`FencedPostgresSaver` opens the write's transaction with

    SELECT 1 FROM runs WHERE run_id = … AND owner_epoch = … AND status = 'running' FOR SHARE

and writes the checkpoint rows in the same transaction. The share lock holds until commit
and conflicts with the `UPDATE` that re-claims (epoch + 1), requeues or fails the run, so
either the write commits while the attempt is still the owner, or it sees a newer epoch and
raises `LeaseLost` — no check-then-write window. The Postgres epoch is the fencing token
(L1); the Redis lease only decides when a re-claim may happen.

The stream gate (B5, L5): a worker attempt also passes, under `GATE_KEY`, an async callable
that every fenced write awaits before its transaction: it returns once every event the
attempt emitted so far is in the run's stream, and raises when one cannot be published. So
no checkpoint (nor pending write, which LangGraph also reads to skip a finished task on
resume) commits past events that never reached the stream: the next attempt re-runs that
step from the previous checkpoint and streams it whole, instead of resuming after it with
a silent hole in the stream.

Why a private hook: LangGraph's `AsyncPostgresSaver` opens its own cursor per write
(`_cursor`), with no way to pass a transaction in, so we override `_cursor` for fenced
writes only (reads and unfenced writes take LangGraph's path unchanged). The test
`tests/integration/test_fenced_saver.py` pins the behaviour against the installed version.
"""

from __future__ import annotations

import asyncio
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg import AsyncCursor, Cursor
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from shared.db import apipelined_transaction
from shared.errors import LeaseLost
from shared.state import head_copies
from shared.state.delta_history import (
    AsyncBoundedDeltaHistory,
    BoundedDeltaHistory,
)
from shared.state.held_writes import HeldWrite, HeldWrites
from shared.state.modes import METADATA_KEY, CheckpointMode, check_readable
from shared.state.upstream import saver_connection

if TYPE_CHECKING:
    from shared.state.accessor import ThreadHead

RUN_KEY = "__threadrun_run_id"
LEASE_KEY = "__threadrun_lease"
"""configurable keys naming the run and the lease (`{epoch}|{owner}`) the writer holds
("__" keys are LangGraph-internal style: never copied into checkpoint metadata)."""
GATE_KEY = "__threadrun_stream_gate"
"""configurable key of the attempt's stream gate (see the module docstring)."""

StreamGate = Callable[[], Awaitable[None]]

HELD_WRITES_KEY = "__threadrun_held_writes"
"""configurable key of the attempt's `HeldWrites`: its pending writes go in the transaction of
the checkpoint that follows them (shared/state/held_writes.py)."""

DEFAULT_SNAPSHOT_EVERY = 10
"""`checkpoint_snapshot_every`'s default: the history page size of a saver built without it
(only the page size depends on it, never what is read)."""

HEAD_KEY = "__threadrun_head"
"""configurable key of a `ReadHead`: the head checkpoint the attempt already read."""


class ReadHead:
    """The thread's head checkpoint a run attempt read before starting its graph (for its
    rollback point, R5), handed to the graph's own first read of the head instead of a
    second identical query and decode on the path to the first token.

    One-shot: only the first read of the root head (no checkpoint id, namespace '') takes
    it; later reads, subgraphs' and a run from a given checkpoint go to the database. While
    the attempt is being set up nothing else writes the thread's checkpoints (the thread's
    running run is this one), so the copy is the head the graph would read.
    """

    __slots__ = ("_tuple", "_taken")

    def __init__(self, head: CheckpointTuple | None) -> None:
        self._tuple = head
        self._taken = False

    def take(self, config: RunnableConfig) -> tuple[bool, CheckpointTuple | None]:
        """(True, the head) the first time `config` reads the root head, else (False, None)."""
        conf = config.get("configurable") or {}
        if self._taken or conf.get("checkpoint_id") or conf.get("checkpoint_ns", ""):
            return False, None
        self._taken = True
        head, self._tuple = self._tuple, None
        return True, head


FENCE_SQL = """
SELECT 1 FROM runs, (SELECT set_config('idle_in_transaction_session_timeout', %s, true)) AS t
WHERE run_id = %s::uuid AND owner_epoch = %s AND status = 'running'
FOR SHARE OF runs
"""
"""The fence, and a transaction-local idle timeout: a writer frozen inside the transaction
(SIGSTOP, a stalled VM) is disconnected by PostgreSQL after it, which frees the run row
for the reaper instead of holding it until the writer thaws."""

SELECT_SQL = """
select
    thread_id,
    checkpoint,
    checkpoint_ns,
    checkpoint_id,
    parent_checkpoint_id,
    metadata,
    (
        select array_agg(array[bl.channel::bytea, bl.type::bytea, bl.blob])
        from jsonb_each_text(checkpoint -> 'channel_versions') AS cv (channel, version)
        cross join lateral (
            select b.channel, b.type, b.blob from checkpoint_blobs b
            where b.thread_id = checkpoints.thread_id
                and b.checkpoint_ns = checkpoints.checkpoint_ns
                and b.channel = cv.channel
                and b.version = cv.version
            limit 1
        ) AS bl
    ) as channel_values,
    (
        select
        array_agg(array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea, cw.blob,
                        convert_to(cw.task_path, 'UTF8'), cw.idx::text::bytea])
        from checkpoint_writes cw
        where cw.thread_id = checkpoints.thread_id
            and cw.checkpoint_ns = checkpoints.checkpoint_ns
            and cw.checkpoint_id = checkpoints.checkpoint_id
    ) as pending_writes
from checkpoints """
"""LangGraph's checkpoint read (`BasePostgresSaver.SELECT_SQL` of langgraph-checkpoint-postgres
3.2.0: the same columns, rows and order of arguments) with one change: a checkpoint's blobs
are fetched one primary-key probe per channel version (a `LATERAL` subquery with `LIMIT 1`,
which the planner cannot flatten back into a join; the key is unique, so the limit drops
nothing). LangGraph's join of `jsonb_each_text` to `checkpoint_blobs` is planned as a hash
join over every blob of the thread, analyzed or not, so each read of an old thread's head
fetched thousands of rows for the ten or so it uses (bench.growth, 500 turns: 2,946
`checkpoint_blobs` rows a turn at turns 481-500). Every read through our savers (`get_tuple`,
`list`, the heads of a page of threads) uses it; tests/integration/test_fenced_saver.py holds
its answers equal to LangGraph's and its rows read to the channels of the checkpoint."""

HEADS_SQL = """
WHERE (thread_id, checkpoint_ns, checkpoint_id) IN (
    SELECT t.thread_id, '', h.checkpoint_id
    FROM unnest(%(thread_ids)s::text[]) AS t (thread_id)
    CROSS JOIN LATERAL (
        SELECT c.checkpoint_id FROM checkpoints c
        WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = ''
        ORDER BY c.checkpoint_id DESC LIMIT 1
    ) AS h
)
"""
"""Appended to LangGraph's own `SELECT_SQL`: the head checkpoint of each of many threads (the
one `get_tuple` loads), with its blobs and pending writes, in one statement. One backward
primary-key probe per thread (`LIMIT 1`), never a sort of a thread's whole history."""

COPY_THREAD_SQL = """
WITH source AS (
    SELECT checkpoint_ns, checkpoint_id FROM checkpoints WHERE thread_id = %(source)s
), copied_checkpoints AS (
    INSERT INTO checkpoints
        (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
    SELECT %(target)s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint,
           CASE WHEN metadata ? 'thread_id'
                THEN jsonb_set(metadata, '{thread_id}', to_jsonb(%(target)s::text))
                ELSE metadata END
    FROM checkpoints WHERE thread_id = %(source)s
    RETURNING 1
), copied_blobs AS (
    INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT %(target)s, checkpoint_ns, channel, version, type, blob
    FROM checkpoint_blobs WHERE thread_id = %(source)s
    RETURNING 1
), copied_writes AS (
    INSERT INTO checkpoint_writes
        (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
    SELECT %(target)s, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.task_path, w.idx,
           w.channel, w.type, w.blob
    FROM checkpoint_writes w
    JOIN source s USING (checkpoint_ns, checkpoint_id)
    WHERE w.thread_id = %(source)s
    RETURNING 1
)
SELECT (SELECT count(*) FROM copied_checkpoints) AS checkpoints,
       (SELECT count(*) FROM copied_blobs) AS blobs,
       (SELECT count(*) FROM copied_writes) AS writes
"""
"""Every checkpoint, blob and pending write of a thread (every namespace), re-keyed to another
thread id. One statement, so one snapshot and one transaction: a run writing to the source
meanwhile is either wholly in the copy or not at all, and a write committed before its
checkpoint (LangGraph saves a step's writes in the background) is left out with it."""

_fence: ContextVar[tuple[str, int] | None] = ContextVar("threadrun_fence", default=None)
_riders: ContextVar[Sequence[tuple[str, Sequence[Any]]]] = ContextVar(
    "threadrun_riders", default=()
)
"""Held pending writes (statement, rows) that the fenced transaction being opened commits
first: those of a checkpoint's parent, in the checkpoint's own transaction."""


def fence_of(config: RunnableConfig) -> tuple[str, int] | None:
    """(run_id, epoch) of a run attempt's config, or None for an unfenced write."""
    conf = config.get("configurable") or {}
    run_id, lease = conf.get(RUN_KEY), conf.get(LEASE_KEY)
    if not run_id or not lease:
        return None
    epoch, _, _owner = str(lease).partition("|")
    return str(run_id), int(epoch)


async def _pass_gate(config: RunnableConfig) -> None:
    """Await the write's stream gate, if its config has one."""
    gate: StreamGate | None = (config.get("configurable") or {}).get(GATE_KEY)
    if gate is not None:
        await gate()


def _stamp(metadata: CheckpointMetadata, mode: CheckpointMode) -> CheckpointMetadata:
    stamped: dict[str, Any] = {**metadata, METADATA_KEY: mode}
    return stamped  # type: ignore[return-value]


def _checked(tup: CheckpointTuple | None, mode: CheckpointMode) -> CheckpointTuple | None:
    if tup is not None:
        check_readable(mode, tup.metadata)
    return tup


class StatePostgresSaver(BoundedDeltaHistory, PostgresSaver):
    """The web's sync saver: stamps and checks the checkpoint mode (S4); reads a delta
    channel's history in pages sized by `snapshot_every` (shared/state/delta_history.py)."""

    SELECT_SQL = SELECT_SQL

    def __init__(
        self,
        conn: Any,
        *,
        mode: CheckpointMode,
        serde: SerializerProtocol | None = None,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
    ) -> None:
        super().__init__(conn, serde=serde)
        self.mode = mode
        self.snapshot_every = snapshot_every

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Write a checkpoint stamped with this process's mode."""
        return super().put(config, checkpoint, _stamp(metadata, self.mode), new_versions)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """A checkpoint this process can read, or CheckpointModeMismatch."""
        return _checked(super().get_tuple(config), self.mode)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """History, each checkpoint checked."""
        for tup in super().list(config, filter=filter, before=before, limit=limit):
            check_readable(self.mode, tup.metadata)
            yield tup

    def get_heads(self, thread_ids: Sequence[str]) -> dict[str, CheckpointTuple]:
        """The head checkpoint of each thread that has one, in one query (each checked)."""
        if not thread_ids:
            return {}
        with self._cursor() as cur:
            cur.execute(self.SELECT_SQL + HEADS_SQL, {"thread_ids": list(thread_ids)})
            rows = cur.fetchall()
        heads: dict[str, CheckpointTuple] = {}
        for row in rows:
            tid = str(row["thread_id"])
            if row["checkpoint"]["v"] < 4 and row["parent_checkpoint_id"]:
                # A pre-v4 checkpoint takes its pending sends from its parent: LangGraph's
                # own read migrates them (one more query, for legacy threads only).
                tup = self.get_tuple({"configurable": {"thread_id": tid, "checkpoint_ns": ""}})
            else:
                tup = self._load_checkpoint_tuple(row)
            if tup is not None:
                check_readable(self.mode, tup.metadata)
                heads[tid] = tup
        return heads

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, blob and pending write of a thread to another thread id,
        in one statement (LangGraph's `BaseCheckpointSaver.copy_thread` contract: the whole
        parent chain, so delta channels rebuild on the copy exactly as on the source)."""
        with self._cursor() as cur:
            cur.execute(COPY_THREAD_SQL, {"source": source_thread_id, "target": target_thread_id})

    @contextmanager
    def _pooled_cursor(self) -> Iterator[Cursor[DictRow]]:
        """A cursor of its own from the pool, outside the saver's lock (which serialises
        LangGraph's reads and writes on a single connection, not these statements)."""
        if isinstance(self.conn, ConnectionPool):
            with self.conn.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                yield cur
        else:
            with self._cursor() as cur:
                yield cur

    def read_head_copies(self, thread_ids: Sequence[str]) -> dict[str, head_copies.StoredHead]:
        """Each thread's head checkpoint id and stored head copy (`shared.state.head_copies`)."""
        with self._pooled_cursor() as cur:
            return head_copies.read(cur, thread_ids)

    def write_head_copies(self, heads: Iterable[tuple[str, ThreadHead]], max_bytes: int) -> None:
        """Store head copies, unfenced: taken only by threads that are not busy."""
        with self._pooled_cursor() as cur:
            head_copies.write(cur, heads, max_bytes=max_bytes, fenced=False)


class HeadsSaver(StatePostgresSaver):
    """A `StatePostgresSaver` that answers the head reads of some threads from checkpoints
    already fetched (`get_heads`), so a page of thread objects is one query, not one per
    thread; every other read (a delta channel's history, a given checkpoint) goes to the
    database as usual."""

    def __init__(self, base: StatePostgresSaver, heads: Mapping[str, CheckpointTuple]) -> None:
        super().__init__(
            base.conn, mode=base.mode, serde=base.serde, snapshot_every=base.snapshot_every
        )
        self._heads = dict(heads)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The prefetched head for a head read of a prefetched thread, else the database's."""
        conf = config.get("configurable") or {}
        if not conf.get("checkpoint_id") and not conf.get("checkpoint_ns"):
            head = self._heads.get(str(conf.get("thread_id")))
            if head is not None:
                return head
        return super().get_tuple(config)


class FencedPostgresSaver(AsyncBoundedDeltaHistory, AsyncPostgresSaver):
    """The workers' async saver: mode stamp and check, writes fenced by the run epoch, and a
    delta channel's history read in pages sized by `snapshot_every`."""

    SELECT_SQL = SELECT_SQL

    def __init__(
        self,
        conn: Any,
        *,
        mode: CheckpointMode,
        idle_timeout_s: float = 5.0,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
    ) -> None:
        super().__init__(conn)
        self.mode = mode
        self.snapshot_every = snapshot_every
        self._idle_timeout = f"{int(idle_timeout_s * 1000)}ms"

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[AsyncCursor[DictRow]]:
        fence = _fence.get()
        if fence is None:
            async with super()._cursor(pipeline=pipeline) as cur:
                yield cur
            return
        # Pipeline mode, as LangGraph's own writes use: BEGIN and the fence go in one round
        # trip (its answer is needed before writing), the checkpoint's statements and COMMIT
        # in the next (`apipelined_transaction`: `conn.transaction()` would add three).
        async with (
            self.lock,
            saver_connection(self.conn) as conn,
            apipelined_transaction(conn),
            conn.cursor(binary=True, row_factory=dict_row) as cur,
        ):
            await cur.execute(FENCE_SQL, (self._idle_timeout, *fence))
            if await cur.fetchone() is None:
                raise LeaseLost(
                    f"run {fence[0]}: checkpoint write fenced (epoch {fence[1]} is not current)"
                )
            riders, _ = _riders.get(), _riders.set(())  # once: this transaction's only
            for statement, rows in riders:
                await cur.executemany(statement, rows)
            yield cur

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Write a checkpoint (stamped) in the same transaction as the epoch check, once its
        events are in the stream (the gate); the pending writes held for its parent
        checkpoint go first in that transaction."""
        await _pass_gate(config)
        fence = fence_of(config)
        conf = config["configurable"]
        held: HeldWrites | None = conf.get(HELD_WRITES_KEY)
        parents = []
        if held is not None and fence is not None:
            parents = held.take(
                str(conf["thread_id"]),
                str(conf.get("checkpoint_ns", "")),
                conf.get("checkpoint_id"),
            )
        riders = await asyncio.to_thread(self._dump_held, parents) if parents else ()
        token, riders_token = _fence.set(fence), _riders.set(riders)
        try:
            return await super().aput(config, checkpoint, _stamp(metadata, self.mode), new_versions)
        finally:
            _riders.reset(riders_token)
            _fence.reset(token)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Pending writes: held for the next checkpoint's transaction when the attempt
        holds them (`HELD_WRITES_KEY`), else written at once."""
        held: HeldWrites | None = (config.get("configurable") or {}).get(HELD_WRITES_KEY)
        if held is not None and fence_of(config) is not None:
            held.hold(HeldWrite(config, list(writes), task_id, task_path), self._write_held)
            return
        await self._write_held(HeldWrite(config, writes, task_id, task_path))

    async def _write_held(self, write: HeldWrite) -> None:
        """Pending writes in their own transaction with the epoch check, once their events
        are in the stream (the gate)."""
        await _pass_gate(write.config)
        token = _fence.set(fence_of(write.config))
        try:
            await super().aput_writes(write.config, write.writes, write.task_id, write.task_path)
        finally:
            _fence.reset(token)

    def _dump_held(self, held: Sequence[HeldWrite]) -> list[tuple[str, Sequence[Any]]]:
        """(statement, rows) of held writes, as LangGraph's `aput_writes` would send them."""
        out: list[tuple[str, Sequence[Any]]] = []
        for write in held:
            thread_id, checkpoint_ns, checkpoint_id = write.checkpoint
            special = all(w[0] in WRITES_IDX_MAP for w in write.writes)
            statement = (
                self.UPSERT_CHECKPOINT_WRITES_SQL if special else self.INSERT_CHECKPOINT_WRITES_SQL
            )
            rows = self._dump_writes(
                thread_id,
                checkpoint_ns,
                checkpoint_id,
                write.task_id,
                write.task_path,
                write.writes,
            )
            out.append((statement, rows))
        return out

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """A checkpoint this process can read, or CheckpointModeMismatch; the attempt's
        `ReadHead` when it has one for this read."""
        held: ReadHead | None = (config.get("configurable") or {}).get(HEAD_KEY)
        if held is not None:
            taken, head = held.take(config)
            if taken:
                return head  # read (and mode-checked) by this saver moments ago
        return _checked(await super().aget_tuple(config), self.mode)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """History, each checkpoint checked."""
        async for tup in super().alist(config, filter=filter, before=before, limit=limit):
            check_readable(self.mode, tup.metadata)
            yield tup
