"""A delta channel's history read in pages sized by the snapshot frequency (S4).

In `delta` mode, loading a checkpoint whose `messages` is not stored there rebuilds it from
the nearest ancestor snapshot plus the writes since (LangGraph's
`get_delta_channel_history`). LangGraph's Postgres saver finds that snapshot by reading the
thread's `checkpoints` rows newest-first from the target in pages of 1,024
(`_DELTA_PAGE_SIZE`) and stops after the page in which it found the snapshot. Its first
page is therefore min(1,024, the thread's checkpoints) rows however near the snapshot is:
a thread's every load read more rows as the thread aged (bench.growth, 200 turns: 194
`checkpoints` rows a turn at turns 11-30, ~1,000 at 181-200, where `full` reads 2).

The snapshot is at most about `snapshot_every` updates of the channel back (a snapshot is
written every K updates), which is a few checkpoints per update. So this reads a first page
of `first_page(K)` rows and doubles the page only while the walk has not found its
snapshot: rows read are bounded by a small multiple of the distance to the snapshot, never
by the thread's age, and a walk that does go further (a channel that stopped being written,
a thread migrated from `full`) still gets there, in a few more round trips. The walk itself,
the second stage (the writes of the chain and the seed blob) and the result are
LangGraph's own helpers, unchanged: only the page size differs, and the page size is not
part of the result (tests/integration/test_s4_delta_history.py pins that against LangGraph's).

One more difference, in the page's statement (`stage1_sql`): LangGraph's asks whether each
row's channel version has a blob with a correlated `EXISTS`, which PostgreSQL may run as a
hashed subplan, a scan of every blob of that channel in the database (every thread's), once
the table has statistics (EXPLAIN ANALYZE: a page of 42 rows read 360 blob rows for 60 hits).
Ours asks the same with a scalar subquery (`LIMIT 1`), which PostgreSQL always runs as one
primary-key probe per row: the same column, the same answer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import DeltaChannelHistory, get_checkpoint_id
from langgraph.checkpoint.postgres.base import (
    BasePostgresSaver,
    _build_delta_stage2_sql,
)

PAGE_MAX = 1024
"""The largest page: LangGraph's own."""
PAGE_MIN = 16
CHECKPOINTS_PER_UPDATE = 4
"""Checkpoints per update of `messages` allowed for in the first page: a turn writes ~6
checkpoints and updates `messages` 2-3 times (its input, the reply, a tool's result)."""


def stage1_sql(channels: Sequence[str], *, include_cursor: bool) -> str:
    """LangGraph's paged stage-1 statement (`_build_delta_stage1_sql(..., paged=True)` of
    langgraph-checkpoint-postgres 3.2.0: the same columns, parameters and rows) with each
    `hb_i` probe a scalar subquery instead of a correlated `EXISTS` (the module docstring)."""
    cols = []
    for i in range(len(channels)):
        cols.append(
            f"checkpoint -> 'channel_versions' ->> %s AS ver_{i}, "
            f"(SELECT true FROM checkpoint_blobs b{i} "
            f"WHERE b{i}.thread_id = checkpoints.thread_id "
            f"AND b{i}.checkpoint_ns = checkpoints.checkpoint_ns "
            f"AND b{i}.channel = %s "
            f"AND b{i}.version = checkpoint -> 'channel_versions' ->> %s "
            f"AND b{i}.type <> 'empty' LIMIT 1) IS NOT NULL AS hb_{i}, "
            f"checkpoint -> 'channel_values' -> %s AS inline_{i}"
        )
    return (
        "SELECT checkpoint_id, parent_checkpoint_id, "
        + ", ".join(cols)
        + " FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s"
        + f" AND checkpoint_id {'<=' if include_cursor else '<'} %s"
        + " ORDER BY checkpoint_id DESC LIMIT %s"
    )


def first_page(snapshot_every: int) -> int:
    """Rows of the first page: enough for a walk back to a snapshot `snapshot_every`
    updates away, at `CHECKPOINTS_PER_UPDATE` checkpoints per update."""
    return max(PAGE_MIN, min(PAGE_MAX, CHECKPOINTS_PER_UPDATE * snapshot_every + 2))


def page_sizes(snapshot_every: int) -> Iterator[int]:
    """The size of each page in turn: `first_page`, then doubling up to `PAGE_MAX`."""
    size = first_page(snapshot_every)
    while True:
        yield size
        size = min(PAGE_MAX, size * 2)


@dataclass
class Walk:
    """The state of one history read across its pages (LangGraph's own walk variables)."""

    thread_id: str
    checkpoint_ns: str
    target: str
    channels: list[str]
    parent_of: dict[str, str | None] = field(default_factory=dict)
    versions: list[dict[str, str | None]] = field(default_factory=list)
    has_blob: list[dict[str, bool]] = field(default_factory=list)
    inline: list[dict[str, Any]] = field(default_factory=list)
    chain: dict[str, list[str]] = field(default_factory=dict)
    seed_version: dict[str, str | None] = field(default_factory=dict)
    seed_inline: dict[str, Any] = field(default_factory=dict)
    cursors: dict[str, str | None] = field(default_factory=dict)
    seeded: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        n = len(self.channels)
        self.versions = [{} for _ in range(n)]
        self.has_blob = [{} for _ in range(n)]
        self.inline = [{} for _ in range(n)]
        self.chain = {ch: [] for ch in self.channels}
        self.seed_version = {ch: None for ch in self.channels}

    def stage1(self, cursor: str | None, first: bool, size: int) -> tuple[str, list[Any]]:
        """(statement, parameters) of the page of `size` rows from `cursor` down."""
        params: list[Any] = []
        for ch in self.channels:
            params.extend([ch, ch, ch, ch])  # version, blob channel, blob version, inline
        sql = stage1_sql(self.channels, include_cursor=first)
        return sql, [*params, self.thread_id, self.checkpoint_ns, cursor, size]

    def ingest(self, page: Sequence[Mapping[str, Any]]) -> str | None:
        """Fold one page in and advance every walk; the page's oldest checkpoint id."""
        oldest = BasePostgresSaver._ingest_stage1_page(
            page, self.channels, self.parent_of, self.versions, self.has_blob, self.inline
        )
        BasePostgresSaver._try_advance_walks(
            self.target,
            self.channels,
            self.parent_of,
            self.versions,
            self.has_blob,
            self.inline,
            self.chain,
            self.seed_version,
            self.seed_inline,
            self.cursors,
            self.seeded,
        )
        return oldest

    def done(self, page_rows: int, size: int) -> bool:
        """Whether the walk needs no further page: all seeded, or the thread's oldest read."""
        return len(self.seeded) == len(self.channels) or page_rows < size

    def stage2(self) -> tuple[str | None, list[Any]]:
        """(statement or None, parameters) of the chain's writes and the seeds' blobs."""
        with_chain = [ch for ch in self.channels if self.chain[ch]]
        with_seed = [ch for ch in self.channels if self.seed_version[ch] is not None]
        sql = _build_delta_stage2_sql(channels_with_chain=with_chain, channels_with_seed=with_seed)
        params: list[Any] = []
        where = [self.thread_id, self.checkpoint_ns]
        for ch in with_chain:
            params.extend([*where, ch, self.chain[ch]])
        for ch in with_seed:
            params.extend([*where, ch, self.seed_version[ch]])
        return (sql or None), params

    def result(
        self, saver: BasePostgresSaver, rows: Sequence[Any]
    ) -> dict[str, DeltaChannelHistory]:
        """Each channel's history (LangGraph's own assembly)."""
        return saver._build_delta_channels_writes_history(
            channels=self.channels,
            chain_by_ch=self.chain,
            seed_ver_by_ch=self.seed_version,
            seed_inline_by_ch=self.seed_inline,
            stage2_rows=cast(Any, rows),
        )


def target_of(config: RunnableConfig) -> tuple[str, str, str | None]:
    """(thread_id, checkpoint_ns, checkpoint_id or None for the head) of a history read."""
    conf = config["configurable"]
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")), get_checkpoint_id(config)


class BoundedDeltaHistory:
    """`get_delta_channel_history` for `StatePostgresSaver` (mix in before the saver)."""

    snapshot_every: int

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Each channel's seed and writes since, in pages sized by `page_sizes`."""
        saver = cast(Any, self)
        if not channels:
            return {}
        thread_id, ns, checkpoint_id = target_of(config)
        if not checkpoint_id:
            head = saver.get_tuple(config)
            if head is None:
                return {ch: {"writes": []} for ch in channels}
            checkpoint_id = str(head.config["configurable"]["checkpoint_id"])
        walk = Walk(thread_id, ns, checkpoint_id, list(channels))
        cursor: str | None = checkpoint_id
        with saver._cursor() as cur:
            for n, size in enumerate(page_sizes(self.snapshot_every)):
                sql, params = walk.stage1(cursor, n == 0, size)
                cur.execute(sql, params)
                page = cur.fetchall()
                if not page:
                    break
                cursor = walk.ingest(page)
                if walk.done(len(page), size):
                    break
            sql2, params2 = walk.stage2()
            rows: list[Any] = []
            if sql2 is not None:
                cur.execute(sql2, params2)
                rows = cur.fetchall()
        return walk.result(saver, rows)


class AsyncBoundedDeltaHistory:
    """`aget_delta_channel_history` for `FencedPostgresSaver` (mix in before the saver)."""

    snapshot_every: int

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Each channel's seed and writes since, in pages sized by `page_sizes`."""
        saver = cast(Any, self)
        if not channels:
            return {}
        thread_id, ns, checkpoint_id = target_of(config)
        if not checkpoint_id:
            head = await saver.aget_tuple(config)
            if head is None:
                return {ch: {"writes": []} for ch in channels}
            checkpoint_id = str(head.config["configurable"]["checkpoint_id"])
        walk = Walk(thread_id, ns, checkpoint_id, list(channels))
        cursor: str | None = checkpoint_id
        async with saver._cursor() as cur:
            for n, size in enumerate(page_sizes(self.snapshot_every)):
                sql, params = walk.stage1(cursor, n == 0, size)
                await cur.execute(sql, params)
                page = await cur.fetchall()
                if not page:
                    break
                cursor = walk.ingest(page)
                if walk.done(len(page), size):
                    break
            sql2, params2 = walk.stage2()
            rows: list[Any] = []
            if sql2 is not None:
                await cur.execute(sql2, params2)
                rows = await cur.fetchall()
        return walk.result(saver, rows)
