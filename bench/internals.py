"""Internals benchmark: each stage of the run pipeline beside a raw baseline from the same run.

Run with `make bench`, or `.venv/bin/python -m bench.internals --n 300 --json out.json`.
It creates a private database `threadrun_bench_<hex>` on the server of
THREADRUN_DATABASE_URL and uses the Redis key prefix `trbench:<hex>:` on
THREADRUN_REDIS_URL, and removes exactly those at the end, also on Ctrl-C, SIGTERM or
failure. bench/README.md explains every row.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import queue
import signal
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import redis
import redis.asyncio as aredis
import uvloop
from celery import Celery
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    create_checkpoint,
    empty_checkpoint,
)
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from shared import serde
from shared.bridge.base import END_EVENT, Event
from shared.bridge.codec import EventEncoder
from shared.bridge.publisher import (
    EventSink,
    PublishBatcher,
    PublishCall,
    PublishResult,
    StreamPublisher,
)
from shared.bridge.subscriber import StreamSubscriber
from shared.db import CONN_KWARGS, AsyncDictPool, DictPool, make_async_pool, make_pool
from shared.redis_keys import Keys
from shared.runs.admission import AdmissionOutcome
from shared.runs.leases import LeaseManager, lease_value
from shared.runs.model import MultitaskStrategy, RunRequest, RunStatus, ThreadStatus
from shared.runs.store import Admission, ClaimOutcome, RunStore
from shared.runs.taskqueue import RUNS_QUEUE, Dispatcher, make_celery
from shared.settings import Settings
from shared.state.savers import GATE_KEY, FencedPostgresSaver
from shared.tools.testing import Sandbox
from workers.executor import GATE_YIELDS

OWNER = "bench-user"
WORKER = "bench-worker"
LEASE = lease_value(1, WORKER)
"""The lease every publishing stage takes (epoch 1) before it publishes."""
WARMUP = 10
CONCURRENCY = 16
"""Concurrent checkpoint writers in the shared-saver row (a worker runs up to 32)."""
SUBSCRIBER_SETTLE_S = 0.003
"""Pause after a reader thread starts so that it is blocked in XREAD when we publish."""
TOKEN_EVENT = serde.dumps(
    [
        {
            "content": "t0042 ",
            "type": "AIMessageChunk",
            "id": "run--6f1c2a4e-3b7d-4a55-9d7e-0c1f2e3d4b5a",
            "additional_kwargs": {},
            "response_metadata": {},
            "tool_call_chunks": [],
            "usage_metadata": None,
        },
        {"langgraph_step": 1, "langgraph_node": "model", "thread_id": "x" * 36, "run_id": "y" * 36},
    ]
)
"""A typical `messages` token event (about 330 bytes of JSON)."""
METADATA_EVENT = serde.dumps({"run_id": "6f1c2a4e-3b7d-4a55-9d7e-0c1f2e3d4b5a", "attempt": 1})

QUOTA_USER_THREADS = 9_000
"""The threads of the bench's user when its admissions are checked against the thread quota
(below `max_threads_per_user`'s default, 10,000)."""
SEED_THREADS_SQL = """
INSERT INTO threads (thread_id, owner)
SELECT gen_random_uuid(), %(owner)s
FROM generate_series(1, %(want)s - (SELECT count(*) FROM threads WHERE owner = %(owner)s))
"""
RAW_INSERT_THREAD_SQL = """
INSERT INTO threads (thread_id, owner, metadata) VALUES (%(thread_id)s, %(owner)s, %(metadata)s)
RETURNING *
"""
RAW_CLAIM_SQL = """
UPDATE runs SET status = 'running', owner = %(owner)s, owner_epoch = owner_epoch + 1,
       attempt = attempt + 1, started_at = now(), updated_at = now()
WHERE run_id = %(run_id)s AND status = 'pending'
RETURNING *
"""
RAW_FINISH_SQL = """
UPDATE runs SET status = 'success', ended_at = now(), updated_at = now()
WHERE run_id = %(run_id)s AND owner_epoch = %(epoch)s AND status = 'running'
RETURNING thread_id
"""
RAW_BLOB_TABLE_SQL = "CREATE TABLE bench_raw_blob (id bigserial PRIMARY KEY, data bytea NOT NULL)"
RAW_BLOB_INSERT_SQL = "INSERT INTO bench_raw_blob (data) VALUES (%s)"
CHECKPOINT_BYTES_SQL = """
SELECT (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_blobs
        WHERE thread_id = %(thread_id)s)
     + (SELECT coalesce(sum(octet_length(checkpoint::text) + octet_length(metadata::text)), 0)
        FROM checkpoints WHERE thread_id = %(thread_id)s) AS n
"""


# --- pure helpers -------------------------------------------------------------------------------
def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) with linear interpolation; NaN when there are no values."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is not in 0..100")
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass(frozen=True, slots=True)
class Stats:
    """One side of a row: latencies in ms and a throughput."""

    n: int
    p50: float
    p99: float
    mean: float
    ops_per_s: float

    @classmethod
    def of(cls, samples_ms: Sequence[float], *, ops_per_s: float | None = None) -> Stats:
        """Summarise samples; ops/s defaults to serial throughput (1000 / mean)."""
        mean = sum(samples_ms) / len(samples_ms) if samples_ms else math.nan
        if ops_per_s is None:
            ops_per_s = 1000.0 / mean if mean and not math.isnan(mean) else math.nan
        return cls(
            len(samples_ms), percentile(samples_ms, 50), percentile(samples_ms, 99), mean, ops_per_s
        )


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: a stage of ours and the raw baseline it is compared with."""

    stage: str
    ours: Stats
    baseline_name: str
    baseline: Stats

    @property
    def ratio(self) -> float:
        """ours p50 / baseline p50 (NaN when undefined)."""
        if not self.baseline.p50 or math.isnan(self.baseline.p50):
            return math.nan
        return self.ours.p50 / self.baseline.p50


HEADERS = ("stage", "ours p50", "ours p99", "baseline", "base p50", "ratio", "ops/s")


def fmt_ms(value: float) -> str:
    """A duration in ms with about three significant digits."""
    if math.isnan(value):
        return "-"
    if value < 1:
        return f"{value:.3f}"
    if value < 100:
        return f"{value:.2f}"
    return f"{value:,.0f}"


def fmt_ratio(value: float) -> str:
    """A ratio like `2.31x`."""
    return "-" if math.isnan(value) else f"{value:.2f}x"


def fmt_rate(value: float) -> str:
    """Operations per second, integer with thousands separators."""
    return "-" if math.isnan(value) else f"{value:,.0f}"


def format_table(rows: Sequence[Row]) -> str:
    """A plain-text table (times in ms): stage, ours p50/p99, baseline, its p50, ratio, ops/s."""
    cells = [HEADERS] + [
        (
            r.stage,
            fmt_ms(r.ours.p50),
            fmt_ms(r.ours.p99),
            r.baseline_name,
            fmt_ms(r.baseline.p50),
            fmt_ratio(r.ratio),
            fmt_rate(r.ours.ops_per_s),
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(HEADERS))]
    left = {0, 3}  # text columns

    def line(values: Sequence[str]) -> str:
        parts = [
            v.ljust(w) if i in left else v.rjust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return " | ".join(parts).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(c) for c in cells[1:])])


def report_dict(rows: Sequence[Row], meta: dict[str, Any], notes: dict[str, Any]) -> dict[str, Any]:
    """The JSON document of `--json`: meta, one object per row, notes."""

    def clean(stats: Stats) -> dict[str, Any]:
        return {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in asdict(stats).items()
        }

    return {
        "meta": meta,
        "rows": [
            {
                "stage": r.stage,
                "ours": clean(r.ours),
                "baseline": {"name": r.baseline_name, **clean(r.baseline)},
                "ratio": None if math.isnan(r.ratio) else r.ratio,
            }
            for r in rows
        ],
        "notes": notes,
    }


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


# --- the components under test ---------------------------------------------------------------------
@dataclass
class Bench:
    """Pools, clients and our components, built like the web process and workers/runtime.py."""

    settings: Settings
    n: int
    events: int
    keys: Keys
    pool: DictPool
    store: RunStore
    apool: AsyncDictPool
    saver: AsyncPostgresSaver
    aredis: aredis.Redis
    sredis: redis.Redis
    celery: Celery
    dispatcher: Dispatcher
    leases: LeaseManager
    publisher: StreamPublisher
    subscriber: StreamSubscriber
    notes: dict[str, Any] = field(default_factory=dict)
    admitted: list[str] = field(default_factory=list)
    claimed: list[tuple[str, str, int]] = field(default_factory=list)
    next_seq: dict[str, int] = field(default_factory=dict)

    @classmethod
    async def open(cls, settings: Settings, *, n: int, events: int) -> Bench:
        """Build everything inside the running loop (the async pool and saver need it)."""
        s = settings
        keys = Keys(s.redis_prefix)
        pool = make_pool(s, name="bench-store", max_size=s.worker_concurrency + 2)
        apool = await make_async_pool(s, name="bench-saver", max_size=s.worker_concurrency + 2)
        client = aredis.Redis.from_url(s.redis_url, health_check_interval=30)
        sync_client = redis.Redis.from_url(
            s.redis_url, health_check_interval=30, max_connections=None
        )
        celery = make_celery(s)
        return cls(
            settings=s,
            n=n,
            events=events,
            keys=keys,
            pool=pool,
            store=RunStore(pool),
            apool=apool,
            saver=AsyncPostgresSaver(apool),
            aredis=client,
            sredis=sync_client,
            celery=celery,
            dispatcher=Dispatcher.of(s, sync_client, celery),
            leases=LeaseManager(client, keys, ttl_s=s.lease_ttl_s),
            publisher=StreamPublisher(client, keys, s),
            subscriber=StreamSubscriber(sync_client, keys, s),
        )

    async def close(self) -> None:
        """Close every pool and client (best effort)."""
        with contextlib.suppress(Exception):
            self.celery.close()
        with contextlib.suppress(Exception):
            await self.aredis.aclose()
        with contextlib.suppress(Exception):
            self.sredis.close()
        with contextlib.suppress(Exception):
            await self.apool.close()
        with contextlib.suppress(Exception):
            self.pool.close()

    async def publish(
        self, run_id: str, events: list[tuple[str, bytes]], *, end: bool = False
    ) -> PublishResult:
        """One fenced StreamPublisher call for the bench's lease, numbering events per run."""
        first = self.next_seq.get(run_id, 1)
        res = await self.publisher.publish(PublishCall(run_id, LEASE, first, events, end=end))
        self.next_seq[run_id] = first + len(events)
        return res

    def raw_key(self, kind: str) -> str:
        """A fresh key under our prefix for a raw baseline."""
        return f"{self.settings.redis_prefix}raw:{kind}:{uuid.uuid4().hex}"


Op = Callable[[int], Awaitable[float]]
"""One timed iteration: gets its index, does its own setup, returns the ms it timed."""


async def interleave(n: int, ops: Sequence[Op], *, warmup: int = WARMUP) -> list[list[float]]:
    """Run the ops round-robin n times (after `warmup` untimed rounds), rotating who goes first."""
    samples: list[list[float]] = [[] for _ in ops]
    for i in range(warmup + n):
        for j in range(len(ops)):
            k = (i + j) % len(ops)
            ms = await ops[k](i)
            if i >= warmup:
                samples[k].append(ms)
    return samples


def _request(thread_id: str, *, create_thread: bool) -> RunRequest:
    return RunRequest(
        thread_id=thread_id,
        assistant_id="bench",
        input={"messages": [{"role": "user", "content": "hello"}]},
        config={"configurable": {}},
        metadata={},
        kwargs={"stream_mode": ["values", "messages-tuple"]},
        create_thread=create_thread,
    )


def _admit(store: RunStore, request: RunRequest, run_id: str) -> Admission:
    """What the web's RunManager.admit asks of the store (strategy `enqueue`)."""
    return store.admit(
        request, run_id=run_id, owner=OWNER, graph_id="bench", strategy=MultitaskStrategy.ENQUEUE
    )


def _raw_insert_thread(pool: DictPool) -> None:
    with pool.connection() as conn, conn.transaction():
        conn.execute(
            RAW_INSERT_THREAD_SQL,
            {"thread_id": str(uuid.uuid4()), "owner": OWNER, "metadata": Jsonb({})},
        ).fetchone()


# --- 1. admission -----------------------------------------------------------------------------------
async def stage_admission(b: Bench) -> list[Row]:
    """RunStore.admit on fresh threads and on one thread (enqueue) vs a raw INSERT … RETURNING."""

    def fresh_on(store: RunStore) -> Op:
        """An admission on a new thread each time, through `store`."""

        async def fresh(i: int) -> float:
            request, run_id = _request(str(uuid.uuid4()), create_thread=True), str(uuid.uuid4())
            t0 = time.perf_counter()
            adm = _admit(store, request, run_id)
            ms = _ms_since(t0)
            assert adm.decision.outcome is AdmissionOutcome.DISPATCH
            b.admitted.append(run_id)
            return ms

        return fresh

    async def raw(i: int) -> float:
        t0 = time.perf_counter()
        _raw_insert_thread(b.pool)
        return _ms_since(t0)

    ours_fresh, base_fresh = await interleave(b.n, [fresh_on(b.store), raw])

    thread_id = b.store.create_thread(None, OWNER, {}, "raise").thread_id

    async def one_thread(i: int) -> float:
        request, run_id = _request(thread_id, create_thread=False), str(uuid.uuid4())
        t0 = time.perf_counter()
        _admit(b.store, request, run_id)
        return _ms_since(t0)

    ours_one, base_one = await interleave(b.n, [one_thread, raw])
    tenth = max(1, len(ours_one) // 10)
    b.notes["admit_one_thread_p50_first_tenth_ms"] = percentile(ours_one[:tenth], 50)
    b.notes["admit_one_thread_p50_last_tenth_ms"] = percentile(ours_one[-tenth:], 50)
    b.notes["admit_one_thread_queued_runs_at_end"] = WARMUP + b.n

    # The web checks every new thread against `max_threads_per_user`: the same admission for
    # a user who already has QUOTA_USER_THREADS threads (the quota high enough to refuse none).
    with b.pool.connection() as conn:
        conn.execute(SEED_THREADS_SQL, {"owner": OWNER, "want": QUOTA_USER_THREADS})
    quota_store = RunStore(b.pool, max_threads_per_user=QUOTA_USER_THREADS + 4 * (WARMUP + b.n))
    ours_quota, base_quota = await interleave(b.n, [fresh_on(quota_store), raw])
    return [
        Row(
            "admit, fresh thread",
            Stats.of(ours_fresh),
            "INSERT threads RETURNING (tx)",
            Stats.of(base_fresh),
        ),
        Row(
            "admit, 1 thread enqueue",
            Stats.of(ours_one),
            "INSERT threads RETURNING (tx)",
            Stats.of(base_one),
        ),
        Row(
            f"admit, fresh thread, quota, {QUOTA_USER_THREADS:,} threads",
            Stats.of(ours_quota),
            "INSERT threads RETURNING (tx)",
            Stats.of(base_quota),
        ),
    ]


# --- 2. dispatch ---------------------------------------------------------------------------------------
async def stage_dispatch(b: Bench) -> list[Row]:
    """Dispatcher.dispatch_run (Celery send_task, nobody consumes) vs a raw LPUSH of the same bytes."""
    queue_key = Keys(b.settings.redis_prefix).celery_queue(RUNS_QUEUE)
    b.dispatcher.dispatch_run(str(uuid.uuid4()))
    body = b.sredis.lindex(queue_key, 0)
    payload = body if isinstance(body, bytes) else b"x" * 950
    b.notes["dispatch_message_bytes"] = len(payload)
    raw_key = b.raw_key("lpush")

    # What-if: the same app without `task_send_sent_event` (one PUBLISH fewer per dispatch).
    quiet_celery = make_celery(b.settings)
    quiet_celery.conf.task_send_sent_event = False
    quiet = Dispatcher.of(b.settings, b.sredis, quiet_celery)

    async def ours(i: int) -> float:
        t0 = time.perf_counter()
        b.dispatcher.dispatch_run(str(uuid.uuid4()))
        return _ms_since(t0)

    async def ours_quiet(i: int) -> float:
        t0 = time.perf_counter()
        quiet.dispatch_run(str(uuid.uuid4()))
        return _ms_since(t0)

    async def raw(i: int) -> float:
        t0 = time.perf_counter()
        b.sredis.lpush(raw_key, payload)
        return _ms_since(t0)

    try:
        s_ours, s_quiet, s_raw = await interleave(b.n, [ours, ours_quiet, raw])
    finally:
        quiet_celery.close()
        b.sredis.delete(queue_key, raw_key)
    return [
        Row(
            "dispatch_run (send_task)", Stats.of(s_ours), f"LPUSH {len(payload)} B", Stats.of(s_raw)
        ),
        Row(
            "  what-if: no sent-event",
            Stats.of(s_quiet),
            f"LPUSH {len(payload)} B",
            Stats.of(s_raw),
        ),
    ]


# --- 3. claim and finish ---------------------------------------------------------------------------------
async def stage_claim(b: Bench) -> list[Row]:
    """store.claim (via to_thread, as the worker) + LeaseManager.acquire vs a raw UPDATE … RETURNING."""
    raw_runs: list[str] = []
    for _ in range(WARMUP + b.n):  # pending heads for the baseline (untimed)
        run_id = str(uuid.uuid4())
        _admit(b.store, _request(str(uuid.uuid4()), create_thread=True), run_id)
        raw_runs.append(run_id)
    raw_claimed: list[tuple[str, int]] = []
    claim_part: list[float] = []

    async def ours(i: int) -> float:
        run_id = b.admitted[i]
        t0 = time.perf_counter()
        claim = await asyncio.to_thread(b.store.claim, run_id, WORKER)
        t1 = time.perf_counter()
        assert claim.outcome is ClaimOutcome.CLAIMED and claim.run is not None, claim.outcome
        epoch = claim.run.owner_epoch
        assert await b.leases.acquire(run_id, epoch, WORKER)
        ms = _ms_since(t0)
        if i >= WARMUP:
            claim_part.append((t1 - t0) * 1000.0)
        b.claimed.append((run_id, claim.run.thread_id, epoch))
        return ms

    async def raw(i: int) -> float:
        t0 = time.perf_counter()
        with b.pool.connection() as conn, conn.transaction():
            row = conn.execute(RAW_CLAIM_SQL, {"run_id": raw_runs[i], "owner": WORKER}).fetchone()
        ms = _ms_since(t0)
        assert row is not None
        raw_claimed.append((raw_runs[i], int(row["owner_epoch"])))
        return ms

    s_ours, s_raw = await interleave(b.n, [ours, raw])
    b.notes["claim_store_part_p50_ms"] = percentile(claim_part, 50)

    async def lease(i: int) -> float:
        run_id = str(uuid.uuid4())
        t0 = time.perf_counter()
        assert await b.leases.acquire(run_id, 1, WORKER)
        return _ms_since(t0)

    async def raw_set(i: int) -> float:
        key = b.raw_key("lease")
        t0 = time.perf_counter()
        await b.aredis.set(key, lease_value(1, WORKER), px=int(b.settings.lease_ttl_s * 1000))
        return _ms_since(t0)

    s_lease, s_set = await interleave(b.n, [lease, raw_set])

    async def finish(i: int) -> float:
        run_id, thread_id, epoch = b.claimed[i]
        t0 = time.perf_counter()
        fin = b.store.finish(
            run_id,
            thread_id,
            epoch,
            status=RunStatus.SUCCESS,
            error=None,
            thread_status=ThreadStatus.IDLE,
        )
        ms = _ms_since(t0)
        assert not fin.fenced
        return ms

    async def raw_finish(i: int) -> float:
        run_id, epoch = raw_claimed[i]
        t0 = time.perf_counter()
        with b.pool.connection() as conn, conn.transaction():
            row = conn.execute(RAW_FINISH_SQL, {"run_id": run_id, "epoch": epoch}).fetchone()
        ms = _ms_since(t0)
        assert row is not None
        return ms

    s_fin, s_raw_fin = await interleave(b.n, [finish, raw_finish])
    return [
        Row(
            "claim + lease (worker path)",
            Stats.of(s_ours),
            "UPDATE runs RETURNING (tx)",
            Stats.of(s_raw),
        ),
        Row("  lease.acquire (Lua)", Stats.of(s_lease), "SET PX", Stats.of(s_set)),
        Row(
            "finish (fenced, settle)",
            Stats.of(s_fin),
            "UPDATE runs RETURNING (tx)",
            Stats.of(s_raw_fin),
        ),
    ]


async def stage_pool(b: Bench) -> list[Row]:
    """A checkout of make_pool's pool (check=check_connection) vs the same pool without a check."""
    plain: ConnectionPool = ConnectionPool(
        b.settings.dsn,
        min_size=1,
        max_size=2,
        kwargs=dict(CONN_KWARGS),
        name="bench-plain",
        open=False,
    )
    plain.open(wait=True, timeout=30)

    async def ours(i: int) -> float:
        t0 = time.perf_counter()
        with b.pool.connection():
            pass
        return _ms_since(t0)

    async def raw(i: int) -> float:
        t0 = time.perf_counter()
        with plain.connection():
            pass
        return _ms_since(t0)

    try:
        s_ours, s_raw = await interleave(b.n, [ours, raw])
    finally:
        plain.close()
    return [
        Row("pool checkout (make_pool)", Stats.of(s_ours), "same pool, check=None", Stats.of(s_raw))
    ]


# --- 4. first checkpoint ----------------------------------------------------------------------------------
def _checkpoint_args(
    saver: AsyncPostgresSaver | PostgresSaver,
) -> tuple[dict[str, Any], Checkpoint, dict[str, Any], ChannelVersions]:
    """(config, checkpoint, metadata, new_versions) of a small first checkpoint on a fresh thread."""
    version = saver.get_next_version(None, None)
    base = empty_checkpoint()
    base["channel_values"] = {
        "messages": [HumanMessage("hello", id=str(uuid.uuid4()))],
        "title": "bench",
    }
    base["channel_versions"] = {"messages": version, "title": version}
    checkpoint = create_checkpoint(base, None, 0)
    config = {"configurable": {"thread_id": str(uuid.uuid4()), "checkpoint_ns": ""}}
    metadata = {"source": "input", "step": -1, "parents": {}, "run_id": str(uuid.uuid4())}
    return config, checkpoint, metadata, {"messages": version, "title": version}


async def stage_checkpoint(b: Bench) -> list[Row]:
    """AsyncPostgresSaver.aput (runtime-shaped pool) vs PostgresSaver.put and a raw INSERT of the same bytes."""
    sync_pool = make_pool(b.settings, name="bench-sync-saver", max_size=4)
    sync_saver = PostgresSaver(sync_pool)
    async with b.apool.connection() as conn:
        await conn.execute(RAW_BLOB_TABLE_SQL)
    config, *rest = _checkpoint_args(b.saver)
    await b.saver.aput(config, *rest)  # type: ignore[arg-type]
    async with b.apool.connection() as conn:
        cur = await conn.execute(
            CHECKPOINT_BYTES_SQL, {"thread_id": config["configurable"]["thread_id"]}
        )
        row = await cur.fetchone()
    size = int(row["n"]) if row else 0
    blob = b"\x00" * size
    b.notes["checkpoint_bytes"] = size

    async def ours(i: int) -> float:
        args = _checkpoint_args(b.saver)
        t0 = time.perf_counter()
        await b.saver.aput(*args)  # type: ignore[arg-type]
        return _ms_since(t0)

    async def sync_put(i: int) -> float:
        args = _checkpoint_args(sync_saver)
        t0 = time.perf_counter()
        sync_saver.put(*args)  # type: ignore[arg-type]
        return _ms_since(t0)

    async def raw(i: int) -> float:
        t0 = time.perf_counter()
        async with b.apool.connection() as conn:
            await conn.execute(RAW_BLOB_INSERT_SQL, (blob,))
        return _ms_since(t0)

    try:
        s_ours, s_sync, s_raw = await interleave(b.n, [ours, sync_put, raw])
    finally:
        sync_pool.close()

    # Concurrency: the runtime shares one saver across all runs of a process; the saver
    # holds an asyncio.Lock around every cursor, so concurrent writes queue on it even
    # with a pool. Baseline: the same writes through one saver per writer, same pool.
    own_savers = [AsyncPostgresSaver(b.apool) for _ in range(CONCURRENCY)]

    async def shared_batch(i: int) -> float:
        batch = [_checkpoint_args(b.saver) for _ in range(CONCURRENCY)]
        t0 = time.perf_counter()
        await asyncio.gather(*(b.saver.aput(*a) for a in batch))  # type: ignore[arg-type]
        return _ms_since(t0)

    async def own_batch(i: int) -> float:
        batch = [_checkpoint_args(b.saver) for _ in range(CONCURRENCY)]
        t0 = time.perf_counter()
        await asyncio.gather(*(s.aput(*a) for s, a in zip(own_savers, batch, strict=True)))  # type: ignore[arg-type]
        return _ms_since(t0)

    batches = max(5, b.n // 10)
    s_shared, s_own = await interleave(batches, [shared_batch, own_batch], warmup=2)

    def per_batch(samples: list[float]) -> Stats:
        return Stats.of(samples, ops_per_s=CONCURRENCY * 1000.0 / (sum(samples) / len(samples)))

    return [
        Row("checkpoint aput", Stats.of(s_ours), "PostgresSaver.put (sync)", Stats.of(s_sync)),
        Row("checkpoint aput", Stats.of(s_ours), f"INSERT {size} B bytea (async)", Stats.of(s_raw)),
        Row(
            f"aput x{CONCURRENCY} concurrent, 1 saver",
            per_batch(s_shared),
            f"x{CONCURRENCY}, 1 saver each",
            per_batch(s_own),
        ),
    ]


async def stage_stream_gate(b: Bench) -> list[Row]:
    """The stream gate of every fenced checkpoint write (B5): FencedPostgresSaver.aput with
    the gate vs without it, when the run's sink has published everything (the gate only
    checks) and when it has just emitted 10 events (the gate waits for their publish)."""
    saver = FencedPostgresSaver(b.apool, mode=b.settings.checkpoint_mode)
    batcher = PublishBatcher(b.publisher)

    async def new_sink() -> EventSink:
        run_id = str(uuid.uuid4())
        assert await b.leases.acquire(run_id, 1, WORKER)
        sink = EventSink(batcher, run_id, LEASE, on_cancel=lambda _a: None, on_lost=lambda _e: None)
        sink.emit("metadata", METADATA_EVENT)
        await sink.drain()
        return sink

    def gated(sink: EventSink) -> tuple[Any, ...]:
        config, *rest = _checkpoint_args(saver)

        async def gate() -> None:  # as workers.executor.stream_gate
            for _ in range(GATE_YIELDS):
                await asyncio.sleep(0)
            await sink.flush()

        config["configurable"][GATE_KEY] = gate
        return (config, *rest)

    async def plain(i: int) -> float:
        args = _checkpoint_args(saver)
        t0 = time.perf_counter()
        await saver.aput(*args)  # type: ignore[arg-type]
        return _ms_since(t0)

    async def idle(i: int) -> float:
        args = gated(await new_sink())
        t0 = time.perf_counter()
        await saver.aput(*args)
        return _ms_since(t0)

    async def pending(i: int) -> float:
        sink = await new_sink()
        args = gated(sink)
        for _ in range(10):
            sink.emit("messages", METADATA_EVENT)
        t0 = time.perf_counter()
        await saver.aput(*args)
        return _ms_since(t0)

    s_plain, s_idle, s_pending = await interleave(b.n, [plain, idle, pending])
    return [
        Row("aput, gate (sink published)", Stats.of(s_idle), "aput, no gate", Stats.of(s_plain)),
        Row(
            "aput, gate (10 events pending)",
            Stats.of(s_pending),
            "aput, no gate",
            Stats.of(s_plain),
        ),
    ]


# --- 5. first publish and publish -> subscriber latency -----------------------------------------------------
class Waiter:
    """A thread that runs one blocking read per job and stamps when it returned."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._done: queue.Queue[tuple[float, BaseException | None]] = queue.Queue()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._ready.set()
            try:
                job()
                self._done.put((time.perf_counter(), None))
            except BaseException as exc:  # noqa: BLE001 - handed to the measuring side
                self._done.put((time.perf_counter(), exc))

    async def measure(
        self, read: Callable[[], None], trigger: Callable[[], Awaitable[Any]]
    ) -> float:
        """Start `read` in the thread, let it block, then ms from calling `trigger` to `read` returning."""
        self._ready.clear()
        self._jobs.put(read)
        if not self._ready.wait(10):
            raise TimeoutError("reader thread did not start")
        await asyncio.sleep(SUBSCRIBER_SETTLE_S)
        t0 = time.perf_counter()
        await trigger()
        t1, exc = await asyncio.to_thread(self._done.get, True, 10)
        if exc is not None:
            raise exc
        return (t1 - t0) * 1000.0

    def stop(self) -> None:
        """End the thread after its current job."""
        self._jobs.put(None)


async def stage_publish(b: Bench) -> list[Row]:
    """StreamPublisher.publish (fenced Lua) vs XADD, and publish -> subscriber vs XADD -> XREAD BLOCK."""

    async def ours(i: int) -> float:
        run_id = str(uuid.uuid4())
        assert await b.leases.acquire(run_id, 1, WORKER)
        t0 = time.perf_counter()
        await b.publish(run_id, [("metadata", METADATA_EVENT)])
        return _ms_since(t0)

    async def raw(i: int) -> float:
        key = b.raw_key("xadd")
        t0 = time.perf_counter()
        await b.aredis.xadd(key, {"e": "metadata", "d": METADATA_EVENT, "n": 1})
        return _ms_since(t0)

    s_pub, s_xadd = await interleave(b.n, [ours, raw])

    sub_thread, raw_thread = Waiter("bench-subscriber"), Waiter("bench-xread")

    async def ours_latency(i: int) -> float:
        run_id = str(uuid.uuid4())
        assert await b.leases.acquire(run_id, 1, WORKER)

        def read() -> None:
            items = b.subscriber.subscribe(run_id, None, is_terminal=lambda: False)
            try:
                for item in items:
                    if isinstance(item, Event):
                        return
            finally:
                items.close()  # type: ignore[attr-defined]

        return await sub_thread.measure(
            read, lambda: b.publish(run_id, [("metadata", METADATA_EVENT)])
        )

    async def raw_latency(i: int) -> float:
        key = b.raw_key("xread")

        def read() -> None:
            got = b.sredis.xread({key: "0-0"}, count=1, block=5000)
            assert got, "XREAD timed out"

        return await raw_thread.measure(
            read, lambda: b.aredis.xadd(key, {"e": "metadata", "d": METADATA_EVENT, "n": 1})
        )

    try:
        s_lat, s_raw_lat = await interleave(b.n, [ours_latency, raw_latency])
    finally:
        sub_thread.stop()
        raw_thread.stop()
    s_follow, s_raw_follow = await _follow_latency(b)
    return [
        Row("first publish (fenced Lua)", Stats.of(s_pub), "XADD", Stats.of(s_xadd)),
        Row(
            "publish -> new subscriber", Stats.of(s_lat), "XADD -> XREAD BLOCK", Stats.of(s_raw_lat)
        ),
        Row(
            "publish -> live subscriber",
            Stats.of(s_follow),
            "XADD -> XREAD BLOCK loop",
            Stats.of(s_raw_follow),
        ),
    ]


class Follower:
    """A thread that follows one iterator and stamps each item it accepts."""

    def __init__(self, name: str, items: Iterator[Any], accept: Callable[[Any], bool]) -> None:
        self._items = items
        self._accept = accept
        self._stamps: queue.Queue[float | BaseException] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            for item in self._items:
                if self._accept(item):
                    self._stamps.put(time.perf_counter())
        except BaseException as exc:  # noqa: BLE001 - handed to the measuring side
            self._stamps.put(exc)

    async def next_stamp(self) -> float:
        """When the thread accepted its next item."""
        got = await asyncio.to_thread(self._stamps.get, True, 10)
        if isinstance(got, BaseException):
            raise got
        return got

    async def measure(self, trigger: Callable[[], Awaitable[Any]]) -> float:
        """Ms from calling `trigger` (once the reader is idle in XREAD) to the next accepted item."""
        await asyncio.sleep(SUBSCRIBER_SETTLE_S)
        t0 = time.perf_counter()
        await trigger()
        return (await self.next_stamp() - t0) * 1000.0

    def join(self, timeout: float) -> None:
        """Wait for the iterator to end."""
        self._thread.join(timeout)


def _raw_follow(client: redis.Redis, key: str) -> Iterator[bytes]:
    """Follow a stream with XREAD BLOCK like a minimal relay; yields event names until `end`."""
    last = "0-0"
    while True:
        got: Any = client.xread({key: last}, count=500, block=5000)
        for raw_id, fields in got[0][1] if got else []:
            last = raw_id.decode()
            yield fields[b"e"]
            if fields[b"e"] == END_EVENT.encode():
                return


async def _follow_latency(b: Bench) -> tuple[list[float], list[float]]:
    """Publish -> an already-following subscriber (phase 2, live XREAD) vs a raw XREAD loop."""
    run_id = str(uuid.uuid4())
    assert await b.leases.acquire(run_id, 1, WORKER)
    await b.publish(run_id, [("metadata", METADATA_EVENT)])
    ours = Follower(
        "bench-follower",
        b.subscriber.subscribe(run_id, None, is_terminal=lambda: False),
        lambda item: isinstance(item, Event),
    )
    raw_key = b.raw_key("follow")
    await b.aredis.xadd(raw_key, {"e": "metadata", "d": METADATA_EVENT, "n": 1})
    raw = Follower("bench-raw-follower", _raw_follow(b.sredis, raw_key), lambda _item: True)
    await ours.next_stamp()  # the metadata events: both are now following live
    await raw.next_stamp()
    seq = iter(range(2, 1 << 30))

    async def publish(i: int) -> float:
        return await ours.measure(lambda: b.publish(run_id, [("messages", TOKEN_EVENT)]))

    async def xadd(i: int) -> float:
        return await raw.measure(
            lambda: b.aredis.xadd(raw_key, {"e": "messages", "d": TOKEN_EVENT, "n": next(seq)})
        )

    try:
        s_ours, s_raw = await interleave(b.n, [publish, xadd])
        return s_ours, s_raw
    finally:
        await b.publish(run_id, [(END_EVENT, METADATA_EVENT)], end=True)
        await b.aredis.xadd(raw_key, {"e": END_EVENT, "d": METADATA_EVENT, "n": 0})
        ours.join(5)
        raw.join(5)


# --- 6. sustained publish ------------------------------------------------------------------------------------
class CountingPublisher:
    """Wraps StreamPublisher.publish_many to record each round trip's events and duration."""

    def __init__(self, inner: StreamPublisher) -> None:
        self.inner = inner
        self.calls: list[tuple[int, float]] = []
        self.coalesce_turns = inner.coalesce_turns
        """The loop turns the batcher lets pass before it publishes (the real publisher's)."""

    async def publish_many(self, calls: list[PublishCall]) -> list[PublishResult | Exception]:
        """Publish through the real publisher, timing the round trip."""
        t0 = time.perf_counter()
        res = await self.inner.publish_many(calls)
        self.calls.append((sum(len(c.events) for c in calls), _ms_since(t0)))
        return res

    def encoder(self, lease_value: str) -> EventEncoder:
        """The real publisher's stream encoder."""
        return self.inner.encoder(lease_value)


async def _sink_run(b: Bench, events: int) -> tuple[float, CountingPublisher]:
    """Emit `events` token events through an EventSink, yielding to the loop after each; wall s."""
    run_id = str(uuid.uuid4())
    assert await b.leases.acquire(run_id, 1, WORKER)
    counting = CountingPublisher(b.publisher)
    lost: list[BaseException] = []
    sink = EventSink(
        batcher=PublishBatcher(cast(StreamPublisher, counting)),
        run_id=run_id,
        lease_value=LEASE,
        on_cancel=lambda _action: None,
        on_lost=lost.append,
    )
    t0 = time.perf_counter()
    for _ in range(events):
        sink.emit("messages", TOKEN_EVENT)
        await asyncio.sleep(0)  # the producer is an astream loop: it yields between chunks
    await sink.drain()
    wall = time.perf_counter() - t0
    assert not lost and sink.published == events, (lost, sink.published)
    return wall, counting


async def _raw_pipelined(b: Bench, events: int, size: int = 100) -> tuple[float, list[float]]:
    """XADD `events` entries in non-transactional pipelines of `size`; wall s and per-event ms."""
    key = b.raw_key("pipe")
    per_event: list[float] = []
    t0 = time.perf_counter()
    for start in range(0, events, size):
        pipe = b.aredis.pipeline(transaction=False)
        count = min(size, events - start)
        for j in range(count):
            pipe.xadd(
                key,
                {"e": "messages", "d": TOKEN_EVENT, "n": start + j + 1},
                maxlen=b.settings.stream_maxlen,
            )
        t1 = time.perf_counter()
        await pipe.execute()
        per_event.extend([_ms_since(t1) / count] * count)
    return time.perf_counter() - t0, per_event


async def stage_sustained(b: Bench) -> list[Row]:
    """EventSink + PublishBatcher throughput for `events` events vs raw pipelined XADD (pipelines of 100)."""
    await _sink_run(b, 500)  # warm-up
    await _raw_pipelined(b, 500)
    wall, counting = await _sink_run(b, b.events)
    raw_wall, raw_per_event = await _raw_pipelined(b, b.events)
    per_event = [ms / k for k, ms in counting.calls for _ in range(k)]
    sizes = [k for k, _ in counting.calls]
    b.notes["eventsink_round_trips"] = len(sizes)
    b.notes["eventsink_mean_batch"] = sum(sizes) / len(sizes)
    b.notes["eventsink_p50_batch"] = percentile(sizes, 50)
    b.notes["eventsink_max_batch"] = max(sizes)
    b.notes["eventsink_call_p50_ms"] = percentile([ms for _, ms in counting.calls], 50)
    b.notes["eventsink_call_max_ms"] = max(ms for _, ms in counting.calls)
    b.notes["eventsink_wall_s"] = wall
    b.notes["raw_pipelined_wall_s"] = raw_wall
    return [
        Row(
            f"EventSink {b.events:,} events (ms/event)",
            Stats.of(per_event, ops_per_s=b.events / wall),
            "XADD pipelined x100",
            Stats.of(raw_per_event, ops_per_s=b.events / raw_wall),
        )
    ]


# --- 7. replay ---------------------------------------------------------------------------------------------------
async def stage_replay(b: Bench) -> list[Row]:
    """subscribe(run_id, '-1') over the retained events until `end` vs one raw XRANGE."""
    total = min(1024, b.settings.stream_maxlen)
    run_id = str(uuid.uuid4())
    assert await b.leases.acquire(run_id, 1, WORKER)
    body = total - 1
    for start in range(0, body, 100):
        batch = [("messages", TOKEN_EVENT)] * min(100, body - start)
        await b.publish(run_id, batch)
    await b.publish(run_id, [(END_EVENT, METADATA_EVENT)], end=True)
    key = b.keys.stream(run_id)
    assert await b.aredis.xlen(key) == total

    async def ours(i: int) -> float:
        t0 = time.perf_counter()
        count = 0
        for item in b.subscriber.subscribe(run_id, "-1", is_terminal=lambda: True):
            if isinstance(item, Event):
                count += 1
                if item.event == END_EVENT:
                    break
        ms = _ms_since(t0)
        assert count == total, count
        return ms

    async def raw(i: int) -> float:
        t0 = time.perf_counter()
        got: Any = b.sredis.xrange(key, "-", "+")
        ms = _ms_since(t0)
        assert len(got) == total
        return ms

    s_ours, s_raw = await interleave(b.n, [ours, raw])
    b.notes["replay_events"] = total
    return [Row(f"replay {total} events -> end", Stats.of(s_ours), "XRANGE - +", Stats.of(s_raw))]


# --- the driver ------------------------------------------------------------------------------------------------------
STAGES: tuple[Callable[[Bench], Awaitable[list[Row]]], ...] = (
    stage_admission,
    stage_dispatch,
    stage_claim,
    stage_pool,
    stage_checkpoint,
    stage_stream_gate,
    stage_publish,
    stage_sustained,
    stage_replay,
)


async def run_all(
    settings: Settings, *, n: int, events: int, log: Callable[[str], None]
) -> tuple[list[Row], dict[str, Any]]:
    """Build the components, run every stage, close everything; return rows and notes."""
    b = await Bench.open(settings, n=n, events=events)
    rows: list[Row] = []
    try:
        for stage in STAGES:
            t0 = time.perf_counter()
            rows.extend(await stage(b))
            b.notes[f"{stage.__name__}_s"] = round(time.perf_counter() - t0, 2)
            log(f"  {stage.__name__.removeprefix('stage_'):<11} {time.perf_counter() - t0:5.1f} s")
        b.notes["redis_version"] = (await b.aredis.info("server"))["redis_version"]
        with b.pool.connection() as conn:
            ver = conn.execute("SHOW server_version").fetchone()
        b.notes["postgres_version"] = ver["server_version"] if ver else None
        return rows, b.notes
    finally:
        await b.close()


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """Ignore SIGINT/SIGTERM for the duration (so that cleanup is not cut short)."""
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(
        prog="python -m bench.internals", description=__doc__.splitlines()[0]
    )
    p.add_argument("--n", type=int, default=300, help="timed iterations per stage (default 300)")
    p.add_argument(
        "--events", type=int, default=20_000, help="events of the sustained-publish stage"
    )
    p.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="also write the numbers here"
    )
    args = p.parse_args(argv)
    if args.n < 1 or args.events < 1:
        p.error("--n and --events must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark in a private sandbox, print the table, always clean up."""
    args = parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    sandbox = Sandbox(Settings())
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    started = time.time()
    rc = 0
    try:
        log(f"bench: database {sandbox.db_name}, redis prefix {sandbox.prefix}")
        settings = sandbox.create()
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            rows, notes = runner.run(run_all(settings, n=args.n, events=args.events, log=log))
        meta = {
            "n": args.n,
            "events": args.events,
            "warmup": WARMUP,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "elapsed_s": round(time.time() - started, 1),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": len(os.sched_getaffinity(0)),
            "loop": "uvloop",
        }
        print(
            f"threadrun internals, n={args.n} (+{WARMUP} warm-up), times in ms, "
            f"redis {notes.get('redis_version')}, postgres {notes.get('postgres_version')}, "
            f"{meta['cpus']} cpus, {meta['elapsed_s']} s"
        )
        print(format_table(rows))
        if args.json is not None:
            args.json.write_text(json.dumps(report_dict(rows, meta, notes), indent=2) + "\n")
            log(f"bench: wrote {args.json}")
    except KeyboardInterrupt:
        log("bench: interrupted")
        rc = 130
    finally:
        with signals_ignored():
            try:
                deleted = sandbox.destroy()
                log(
                    f"bench: dropped {sandbox.db_name}, deleted {deleted} keys under {sandbox.prefix}"
                )
            except Exception as exc:  # noqa: BLE001 - say exactly what is left behind
                log(
                    f"bench: CLEANUP FAILED ({exc}); drop {sandbox.db_name} and keys {sandbox.prefix}* by hand"
                )
                rc = rc or 1
        signal.signal(signal.SIGTERM, old_term)
    return rc


if __name__ == "__main__":
    sys.exit(main())
