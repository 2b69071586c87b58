"""Cost that does not grow with the work: per turn, per run and per connection.

Run with `.venv/bin/python -m bench.growth [--part turns|runs|rss|all] [--turns 500]
[--modes full,delta] [--sizes 0,50000,200000] [--streams 1000,5000] [--inflight 1000,5000]
[--json PATH]`. Every part starts real processes (one gunicorn web process, one Celery runs
worker: shared.tools.testing's Cluster) on a private database `threadrun_growth_<hex>` and
Redis prefix `trgrowth:<hex>:` (Sandbox), and stops them, drops the database and deletes the
keys at the end, also on a failure or Ctrl-C.

1. turns: one thread, `--turns` sequential streamed runs (turns) of the built-in model
   (`--tokens` tokens, `messages-tuple`), once per checkpoint mode (S4:
   `THREADRUN_CHECKPOINT_MODE=full` / `delta`, one sandbox each). After each turn it reads
   the CPU of the web and worker process trees and of the database's PostgreSQL backends
   (bench.system_cpu's counters, sampled at the turn's end), so each turn has its latency
   (request to the stream's end) and its CPU ms. Printed at turns 1, 10, 50, 100, 250, 500
   (those within `--turns`), each the mean of a `--window`-turn window around it, with the
   ratio last/first; and the rows PostgreSQL read per turn from each checkpoint table and
   `runs` (pg_stat_user_tables `seq_tup_read + idx_tup_fetch`) over two `--rows-window`-turn
   windows, turns 11-30 and the last ones (read `STATS_FLUSH_S` after the window's edges, so
   the backends have flushed their counters; that wait is not in any turn's figures).
   `--no-summary` turns the summary middleware off (C1: the history then
   grows without bound); `--analyze-every N` runs ANALYZE every N turns, as autovacuum
   would (a server without it plans on the statistics of empty tables); `--analyze-interval S`
   sets the runs worker's own statistics upkeep (`THREADRUN_ANALYZE_INTERVAL_S`, 0: off;
   shared/db/statistics.py).
2. runs: a fixed batch (`--batch` runs at C=`--concurrency`, one thread each) measured
   `--passes` times with 0, then 50,000, then 200,000 finished runs in the database
   (`--sizes`), seeded with INSERT ... SELECT generate_series (10 runs per thread, the
   threads spread over 1,000 users and the bench's own user, who gets a tenth of them):
   CPU ms per run (web + worker + PostgreSQL) and latency p50, and their ratio to size 0.
3. rss: the web process's RSS with `--streams` idle thread streams open (`GET
   /threads/{id}/stream` of idle threads, held by raw sockets on one asyncio loop, read no
   further; they get a heartbeat every `stream_heartbeat_s`), and the runs worker's RSS with
   `--inflight` runs in flight (`worker_concurrency` = the largest count; built-in-model
   runs of one token per 2 s, `token_delay_ms` at its maximum). RSS before, after and per
   item (KiB); what was reached when a count was not, and why.

Defaults are the full curves (turn 1 to 500, 0 to 200,000 runs, 1,000 and 5,000 streams
and runs in flight) and finish `--part all` in about 8-10 minutes on a
2-core machine (turns ~2 min, runs ~3 min, rss ~4 min); shorter: `--turns 100 --sizes
0,50000 --streams 1000 --inflight 1000`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import resource
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import redis

from bench.chaos import INSERT_THREADS_SQL, bench_cluster, log, table
from bench.internals import percentile
from bench.scale import sandboxed, tree_cpu_s
from bench.system_cpu import (
    CLK_TCK,
    BackendCpu,
    logged_and_stopped,
    proc_ticks,
    redis_pid,
    run_bench,
)
from shared.settings import Settings
from shared.tools.testing import Cluster

T = TypeVar("T")
POINTS = (1, 10, 50, 100, 250, 500)
"""The turns of the per-turn curve (those within `--turns`, plus the last turn)."""
SEED_CHUNK = 50_000
"""Historic runs per seeding transaction."""
RUNS_PER_THREAD = 10
HISTORIC_USERS = 1000
IDLE_DELAY_MS = 2000.0
"""An in-flight run's pace: one token per 2 s (the built-in model's largest delay)."""
OPEN_CONCURRENCY = 200
HEAD_TIMEOUT_S = 30.0
SETTLE_S = 5.0
WORKER_START_S = 180.0
STATS_FLUSH_S = 11.0
"""A backend flushes its table counters at most every 10 s while idle (PostgreSQL 15+)."""
ROWS_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "runs")
ROWS_FIRST = 11
"""The first rows window starts here (the first turns warm the plans and caches)."""


# --- pure helpers (tests/unit/test_bench_growth.py) ----------------------------------------------
def points_within(turns: int, points: Sequence[int] = POINTS) -> list[int]:
    """The curve's points that a run of `turns` turns reaches, plus the last turn."""
    out = [p for p in points if p <= turns]
    if turns >= 1 and (not out or out[-1] != turns):
        out.append(turns)
    return out


def window(turns: int, point: int, width: int) -> range:
    """The 1-based turns averaged for `point`: `width` turns centred on it, shifted to stay
    within 1..`turns` (turn 1: 1..width; the last turn: the last `width`)."""
    if turns < 1 or not 1 <= point <= turns:
        raise ValueError(f"point {point} is not within 1..{turns}")
    width = max(1, min(width, turns))
    lo = max(1, min(point - width // 2, turns - width + 1))
    return range(lo, lo + width)


def window_mean(values: Sequence[float], point: int, width: int) -> float:
    """Mean of `values` (index 0 = turn 1) over the window of `point`."""
    turns = window(len(values), point, width)
    return sum(values[t - 1] for t in turns) / len(turns)


def deltas(cumulative: Sequence[float]) -> list[float]:
    """Per-step increments of a cumulative counter (n+1 readings -> n steps)."""
    return [b - a for a, b in zip(cumulative, cumulative[1:], strict=False)]


def rows_windows(turns: int, width: int, first: int = ROWS_FIRST) -> list[range]:
    """The 1-based turns whose table reads are counted: `width` turns from `first`, and the
    last `width` turns when they do not overlap it (a short run: one window, or none)."""
    if width < 1 or turns < first + width - 1:
        return []
    out = [range(first, first + width)]
    last = range(turns - width + 1, turns + 1)
    if last.start > out[0].stop - 1:
        out.append(last)
    return out


def rows_per_turn(
    before: Mapping[str, int], after: Mapping[str, int], turns: int
) -> dict[str, float]:
    """Rows read per turn of each table between two readings of its counter."""
    return {t: (after.get(t, 0) - before.get(t, 0)) / turns for t in after}


def ratio(value: float | None, base: float | None) -> float | None:
    """value / base; None when either is missing or the base is not positive."""
    if value is None or base is None or not base > 0 or math.isnan(value):
        return None
    return value / base


def per_item_kib(before_kib: float, after_kib: float, items: int) -> float | None:
    """RSS growth per item, KiB (None without items)."""
    return (after_kib - before_kib) / items if items > 0 else None


def fmt(v: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:{spec}}{suffix}"


def joined(values: Sequence[float | None], spec: str = ".1f", suffix: str = "") -> str:
    """Repeated measurements of one cell, `a / b`."""
    return " / ".join(fmt(v, spec, suffix) for v in values)


def seed_plan(have: int, want: int, chunk: int = SEED_CHUNK) -> list[tuple[int, int]]:
    """[lo, hi) ranges of historic run numbers to insert to grow from `have` to `want` runs,
    at most `chunk` per range, whole threads (`RUNS_PER_THREAD` runs) each."""
    if want < have:
        raise ValueError(f"cannot shrink from {have} to {want} runs")
    out: list[tuple[int, int]] = []
    lo = have
    while lo < want:
        hi = min(want, lo + chunk)
        out.append((lo, hi))
        lo = hi
    return out


@dataclass
class Turn:
    """One turn: latency and CPU ms of each part."""

    latency_ms: float
    web_ms: float
    worker_ms: float
    postgres_ms: float
    ok: bool = True

    @property
    def cpu_ms(self) -> float:
        return self.web_ms + self.worker_ms + self.postgres_ms


@dataclass
class TurnCurve:
    """One checkpoint mode's turns."""

    mode: str
    turns: list[Turn]
    messages: int | None = None
    """Messages in the thread's state after the last turn (the summary middleware, C1,
    replaces a long history by a summary and a tail)."""
    checkpoints: int | None = None
    checkpoint_bytes: int | None = None
    """The thread's checkpoint rows and their bytes (checkpoints + checkpoint_blobs)."""
    rows: dict[str, dict[str, float]] = field(default_factory=dict)
    """Rows read per turn, by window ("11-30") then table (`ROWS_TABLES`)."""

    @property
    def failed(self) -> int:
        return sum(1 for t in self.turns if not t.ok)


def curve_rows(curve: TurnCurve, width: int) -> list[list[str]]:
    """The table rows of one mode: one per point, then last/first."""
    n = len(curve.turns)
    if n == 0:
        return []
    cols: dict[str, list[float]] = {
        "latency": [t.latency_ms for t in curve.turns],
        "web": [t.web_ms for t in curve.turns],
        "worker": [t.worker_ms for t in curve.turns],
        "postgres": [t.postgres_ms for t in curve.turns],
        "all": [t.cpu_ms for t in curve.turns],
    }
    points = points_within(n)
    means = {p: {k: window_mean(v, p, width) for k, v in cols.items()} for p in points}
    rows = []
    for p in points:
        w = window(n, p, width)
        m = means[p]
        rows.append(
            [
                curve.mode,
                f"{p} ({w.start}-{w.stop - 1})",
                f"{m['latency']:.1f}",
                f"{m['web']:.1f}",
                f"{m['worker']:.1f}",
                f"{m['postgres']:.1f}",
                f"{m['all']:.1f}",
            ]
        )
    first, last = means[points[0]], means[points[-1]]
    rows.append(
        [
            curve.mode,
            f"ratio {points[-1]}/{points[0]}",
            *(
                fmt(ratio(last[k], first[k]), ".2f", "x")
                for k in ("latency", "web", "worker", "postgres", "all")
            ),
        ]
    )
    return rows


def rows_table(curves: Sequence[TurnCurve]) -> str:
    """Rows read per turn: one row per table, one column per (mode, window)."""
    cols = [(c.mode, w) for c in curves for w in c.rows]
    if not cols:
        return ""
    by_mode = {c.mode: c for c in curves}
    rows = [[t, *(f"{by_mode[m].rows[w].get(t, 0.0):,.0f}" for m, w in cols)] for t in ROWS_TABLES]
    return table(("rows per turn", *(f"{m}, turns {w}" for m, w in cols)), rows)


def turns_table(curves: Sequence[TurnCurve], width: int) -> str:
    rows = [row for c in curves for row in curve_rows(c, width)]
    return table(
        ("mode", "turn (window)", "latency ms", "web CPU ms", "worker CPU ms", "postgres CPU ms",
         "CPU ms all"),
        rows,
    )  # fmt: skip


@dataclass
class Batch:
    """One pass of the fixed batch at one database size."""

    size: int
    runs: int
    failed: int
    p50_ms: float
    web_ms: float
    worker_ms: float
    postgres_ms: float

    @property
    def cpu_ms(self) -> float:
        return self.web_ms + self.worker_ms + self.postgres_ms


def runs_table(batches: Sequence[Batch]) -> str:
    """One row per database size, each cell the passes `a / b`; ratios against size 0 (the
    first size) on the mean of the passes."""
    by_size: dict[int, list[Batch]] = {}
    for b in batches:
        by_size.setdefault(b.size, []).append(b)
    if not by_size:
        return ""
    base = by_size[min(by_size)]

    def mean(bs: Sequence[Batch], key: Callable[[Batch], float]) -> float:
        return sum(key(b) for b in bs) / len(bs)

    base_cpu = mean(base, lambda b: b.cpu_ms)
    base_p50 = mean(base, lambda b: b.p50_ms)
    rows = []
    for size in sorted(by_size):
        bs = by_size[size]
        rows.append(
            [
                f"{size:,}",
                joined([b.p50_ms for b in bs], ".0f"),
                joined([b.web_ms for b in bs]),
                joined([b.worker_ms for b in bs]),
                joined([b.postgres_ms for b in bs]),
                joined([b.cpu_ms for b in bs]),
                fmt(ratio(mean(bs, lambda b: b.cpu_ms), base_cpu), ".2f", "x"),
                fmt(ratio(mean(bs, lambda b: b.p50_ms), base_p50), ".2f", "x"),
                str(sum(b.failed for b in bs)),
            ]
        )
    return table(
        ("runs in DB", "latency p50 ms", "web CPU ms/run", "worker", "postgres", "CPU ms/run all",
         "CPU vs 0", "p50 vs 0", "failed"),
        rows,
    )  # fmt: skip


@dataclass
class Memory:
    """RSS of one process with `reached` of `wanted` items open / in flight."""

    what: str
    wanted: int
    reached: int
    before_kib: float
    after_kib: float
    note: str = ""
    cpu_pct: float | None = None

    @property
    def per_item_kib(self) -> float | None:
        return per_item_kib(self.before_kib, self.after_kib, self.reached)


def marginal_kib(items: Sequence[Memory]) -> list[float | None]:
    """KiB per item between consecutive counts of the same `what` (the first: from before):
    flat when it stays near the first one."""
    out: list[float | None] = []
    prev: dict[str, Memory] = {}
    for m in items:
        p = prev.get(m.what)
        out.append(m.per_item_kib if p is None
                   else per_item_kib(p.after_kib, m.after_kib, m.reached - p.reached))  # fmt: skip
        prev[m.what] = m
    return out


def memory_table(items: Sequence[Memory]) -> str:
    return table(
        ("what", "wanted", "reached", "RSS before MiB", "RSS after MiB", "KiB per item",
         "KiB per added item", "process CPU % meanwhile", "note"),
        [
            [
                m.what,
                f"{m.wanted:,}",
                f"{m.reached:,}",
                f"{m.before_kib / 1024:.1f}",
                f"{m.after_kib / 1024:.1f}",
                fmt(m.per_item_kib),
                fmt(added),
                fmt(m.cpu_pct, ".0f"),
                m.note or "-",
            ]
            for m, added in zip(items, marginal_kib(items), strict=True)
        ],
    )  # fmt: skip


# --- the cluster ---------------------------------------------------------------------------------
@dataclass
class Procs:
    """The running cluster: its web URL and the pids of the web and worker trees."""

    cluster: Cluster
    url: str
    web: int
    worker: int
    settings: Settings


def on_cluster(
    name: str,
    measure: Callable[[Procs], T],
    env: Mapping[str, str] | None = None,
    concurrency: int | None = None,
) -> T:
    """`measure(procs)` on one web process and one runs worker (`concurrency` slots) on a
    private database and Redis prefix, `env` in every process. The processes' logs are
    printed if it fails; the cluster is stopped and the sandbox dropped either way."""
    base = Settings()
    workdir = Path(tempfile.mkdtemp(prefix=f"threadrun-growth-{name}-"))
    with sandboxed(base, "growth") as (sandbox, settings):
        log(f"growth {name}: database {sandbox.db_name}, prefix {sandbox.prefix}, logs {workdir}")
        cluster = bench_cluster(settings, workdir)
        cluster.env.update(env or {})
        with logged_and_stopped(cluster):
            url = cluster.start_web()
            web = next(p for p in cluster.procs if p.role == "web")
            slots = concurrency or base.worker_concurrency
            worker = cluster.start_worker(name, slots, timeout=WORKER_START_S)
            return measure(Procs(cluster, url, web.pid, worker.pid, settings))


def turn_body(text: str, tokens: int, modes: Sequence[str]) -> dict[str, Any]:
    return {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": text}]},
        "stream_mode": list(modes),
        "config": {"configurable": {"tokens": tokens, "token_delay_ms": 0}},
    }


def stream_one(client: httpx.Client, tid: str, body: dict[str, Any]) -> tuple[float, bool]:
    """Stream one run to its end; (ms from the request to the end, ended without error)."""
    t0 = time.perf_counter()
    ok = False
    with client.stream("POST", f"/threads/{tid}/runs/stream", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("event: "):
                ok = line != "event: error"
    return 1000 * (time.perf_counter() - t0), ok


def new_thread(client: httpx.Client) -> str:
    return str(client.post("/threads", json={}).raise_for_status().json()["thread_id"])


# --- 1. per-turn cost ----------------------------------------------------------------------------
def measure_turns(p: Procs, mode: str, args: argparse.Namespace) -> TurnCurve:
    modes = args.stream_mode.split(",")
    with httpx.Client(base_url=p.url, timeout=300) as client:
        warm = new_thread(client)
        for i in range(5):  # imports, pools, prepared statements
            stream_one(client, warm, turn_body(f"warm {i}", args.tokens, modes))
        tid = new_thread(client)
        turns: list[Turn] = []
        with BackendCpu(p.settings.dsn) as pg:

            def reading() -> tuple[float, float, float]:
                pg._sample()  # at the turn's end, not only on the 0.2 s timer
                return tree_cpu_s([p.web]), tree_cpu_s([p.worker]), pg.seconds({})

            windows = rows_windows(args.turns, args.rows_window)
            counted: dict[str, dict[str, float]] = {}
            opened: dict[str, int] = {}
            before = reading()
            for i in range(args.turns):
                if args.analyze_every and i and i % args.analyze_every == 0:
                    analyze(p.settings.dsn)
                    before = reading()  # the ANALYZE's backend CPU is not the turn's
                if any(w.start == i + 1 for w in windows):
                    opened = table_reads(p.settings.dsn)
                    before = reading()  # the wait is not the turn's
                ms, ok = stream_one(client, tid, turn_body(f"turn {i + 1}", args.tokens, modes))
                after = reading()
                web, wk, pgs = (1000 * (b - a) for a, b in zip(before, after, strict=True))
                turns.append(Turn(ms, web, wk, pgs, ok))
                before = after
                for w in windows:
                    if w.stop - 1 == i + 1:
                        label = f"{w.start}-{w.stop - 1}"
                        counted[label] = rows_per_turn(opened, table_reads(p.settings.dsn), len(w))
                        before = reading()
                if (i + 1) % 50 == 0:
                    log(f"growth turns {mode}: {i + 1}/{args.turns}, last {ms:.0f} ms")
        curve = TurnCurve(mode, turns, rows=counted)
        with contextlib.suppress(httpx.HTTPError, psycopg.Error, KeyError, TypeError):
            values = client.get(f"/threads/{tid}/state").raise_for_status().json()["values"]
            curve.messages = len(values.get("messages") or [])
            with psycopg.connect(p.settings.dsn, autocommit=True) as conn:
                row = conn.execute(THREAD_CHECKPOINTS_SQL, {"tid": tid}).fetchone()
            if row is not None:
                curve.checkpoints, curve.checkpoint_bytes = int(row[0]), int(row[1])
    return curve


def analyze(dsn: str) -> None:
    """ANALYZE the sandbox database (what autovacuum does on a server that runs it)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")


TABLE_READS_SQL = """
SELECT relname, seq_tup_read + coalesce(idx_tup_fetch, 0) AS n FROM pg_stat_user_tables
WHERE relname = ANY(%(tables)s)
"""


def table_reads(dsn: str) -> dict[str, int]:
    """Rows read so far from each of `ROWS_TABLES`, once the backends flushed their counters
    (`STATS_FLUSH_S` from now)."""
    time.sleep(STATS_FLUSH_S)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = conn.execute(TABLE_READS_SQL, {"tables": list(ROWS_TABLES)}).fetchall()
    return {str(name): int(n) for name, n in rows}


THREAD_CHECKPOINTS_SQL = """
SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = %(tid)s::text),
       (SELECT coalesce(sum(pg_column_size(c.*)), 0) FROM checkpoints c
        WHERE thread_id = %(tid)s::text)
     + (SELECT coalesce(sum(pg_column_size(b.*)), 0) FROM checkpoint_blobs b
        WHERE thread_id = %(tid)s::text)
"""


# --- 2. per-run cost with N runs in the database -------------------------------------------------
SEED_SQL = """
WITH t AS (
    INSERT INTO threads (thread_id, owner, status, metadata, created_at, updated_at)
    SELECT gen_random_uuid(),
           CASE WHEN g %% 10 = 0 THEN %(user)s ELSE 'hist-' || (g %% %(users)s) END,
           'idle', jsonb_build_object('seeded', g),
           now() - make_interval(secs => g), now() - make_interval(secs => g)
    FROM generate_series(%(lo)s, %(hi)s - 1) g
    RETURNING thread_id, created_at
)
INSERT INTO runs (run_id, thread_id, assistant_id, graph_id, status, input, config, kwargs,
                  multitask_strategy, created_at, updated_at, dispatched_at, started_at,
                  ended_at, attempt, last_message, usage)
SELECT gen_random_uuid(), t.thread_id, 'lead_agent', 'lead_agent', 'success',
       jsonb_build_object('messages', jsonb_build_array(
           jsonb_build_object('role', 'user', 'content', 'historic run ' || k))),
       '{}'::jsonb, '{}'::jsonb, 'enqueue',
       t.created_at + make_interval(secs => k), t.created_at + make_interval(secs => k + 1),
       t.created_at + make_interval(secs => k), t.created_at + make_interval(secs => k),
       t.created_at + make_interval(secs => k + 1), 1, 'hello world',
       '{"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}'::jsonb
FROM t CROSS JOIN generate_series(1, %(per)s) k
"""


def seed_runs(dsn: str, user: str, have: int, want: int) -> float:
    """Grow the historic runs from `have` to `want` (finished, `RUNS_PER_THREAD` per thread);
    return the seconds it took (with VACUUM ANALYZE)."""
    t0 = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for lo, hi in seed_plan(have, want, SEED_CHUNK):
            thread_lo, thread_hi = lo // RUNS_PER_THREAD, -(-hi // RUNS_PER_THREAD)
            conn.execute(
                SEED_SQL,
                {
                    "lo": thread_lo,
                    "hi": thread_hi,
                    "user": user,
                    "users": HISTORIC_USERS,
                    "per": RUNS_PER_THREAD,
                },
            )
        conn.execute("VACUUM ANALYZE threads")
        conn.execute("VACUUM ANALYZE runs")
    return time.monotonic() - t0


def count_runs(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM runs").fetchone()
    return int(row[0]) if row else 0


def batch_pass(p: Procs, size: int, args: argparse.Namespace) -> Batch:
    modes = args.stream_mode.split(",")
    clients = [httpx.Client(base_url=p.url, timeout=300) for _ in range(args.concurrency)]
    try:

        def one(i: int) -> tuple[float, bool]:
            cl = clients[i % len(clients)]
            tid = new_thread(cl)
            return stream_one(cl, tid, turn_body(f"batch {i}", args.tokens, modes))

        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(one, range(args.concurrency)))  # warm-up at this size
            with BackendCpu(p.settings.dsn) as pg:
                base = pg.snapshot()
                web0, wk0 = tree_cpu_s([p.web]), tree_cpu_s([p.worker])
                results = list(pool.map(one, range(args.batch)))
                web1, wk1 = tree_cpu_s([p.web]), tree_cpu_s([p.worker])
            pg_s = pg.seconds(base)
    finally:
        for cl in clients:
            cl.close()
    per = 1000 / args.batch
    return Batch(
        size=size,
        runs=args.batch,
        failed=sum(1 for _, ok in results if not ok),
        p50_ms=percentile([ms for ms, _ in results], 50),
        web_ms=(web1 - web0) * per,
        worker_ms=(wk1 - wk0) * per,
        postgres_ms=pg_s * per,
    )


def measure_runs(p: Procs, args: argparse.Namespace) -> list[Batch]:
    user = p.settings.local_user
    out: list[Batch] = []
    have = 0
    for size in args.size_list:
        if size > have:
            took = seed_runs(p.settings.dsn, user, have, size)
            have = size
            log(f"growth runs: seeded {size:,} historic runs ({count_runs(p.settings.dsn):,} in "
                f"the database) in {took:.1f} s")  # fmt: skip
        for n in range(args.passes):
            b = batch_pass(p, size, args)
            log(
                f"growth runs: {size:,} pass {n + 1}: p50 {b.p50_ms:.0f} ms, {b.cpu_ms:.1f} CPU ms/run"
            )
            out.append(b)
    return out


# --- 3. memory per idle stream / in-flight run ---------------------------------------------------
def raise_nofile(wanted: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards `wanted` (the hard limit caps it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class StreamHolder:
    """Idle SSE streams held by raw sockets on one asyncio loop in a thread. A stream counts
    once the server sent its 200 head (the first heartbeat, up to `stream_heartbeat_s` after
    the request); it is read no further. The connections are opened `OPEN_CONCURRENCY` at a
    time; their heads are awaited together."""

    def __init__(self, base: str) -> None:
        host, port = base.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.loop = asyncio.new_event_loop()
        self.held: list[asyncio.StreamWriter] = []
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def _one(self, path: str, gate: asyncio.Semaphore, errors: Counter[str]) -> None:
        writer = None
        try:
            async with gate:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), HEAD_TIMEOUT_S
                )
                writer.write(
                    f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                    "Accept: text/event-stream\r\n\r\n".encode()
                )
                await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                errors[f"HTTP {status}"] += 1
                writer.close()
                return
        except Exception as exc:  # noqa: BLE001 - counted by type
            errors[type(exc).__name__] += 1
            if writer is not None:
                writer.close()
            return
        self.held.append(writer)

    async def _open(self, paths: Sequence[str]) -> Counter[str]:
        errors: Counter[str] = Counter()
        gate = asyncio.Semaphore(OPEN_CONCURRENCY)
        await asyncio.gather(*(self._one(p, gate, errors) for p in paths))
        return errors

    def open(self, paths: Sequence[str]) -> Counter[str]:
        """Open a stream on each path; the errors by type."""
        return asyncio.run_coroutine_threadsafe(self._open(paths), self.loop).result()

    def close(self) -> None:
        async def close_all() -> None:
            for w in self.held:
                w.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def rss_kib(pid: int) -> float:
    """VmRSS of a process, KiB (/proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return float(line.split()[1])
    return math.nan


def proc_cpu_pct(pids: Sequence[int], seconds: float) -> float:
    c0 = tree_cpu_s(pids)
    time.sleep(seconds)
    return 100 * (tree_cpu_s(pids) - c0) / seconds


def seeded_threads(dsn: str, owner: str, n: int) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(INSERT_THREADS_SQL, {"owner": owner, "n": n}).fetchall()
    return [str(r[0]) for r in rows]


HUB_COMMANDS = ("xread", "client|unblock")
"""What the web process's subscription hub sends per wake (shared/bridge/hub.py)."""


def command_calls(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """(calls, usec) so far of HUB_COMMANDS (INFO commandstats; every client of the server)."""
    stats = client.info("commandstats")
    out = {}
    for name in HUB_COMMANDS:
        v = stats.get(f"cmdstat_{name}") or {}
        out[name] = (int(v.get("calls", 0)), int(v.get("usec", 0)))
    return out


def hub_rates(
    c0: Mapping[str, tuple[int, int]], c1: Mapping[str, tuple[int, int]], seconds: float
) -> dict[str, tuple[float, float | None]]:
    """Per command: (calls/s, server µs per call) between two `command_calls` readings."""
    out: dict[str, tuple[float, float | None]] = {}
    for name in c1:
        calls = c1[name][0] - c0.get(name, (0, 0))[0]
        usec = c1[name][1] - c0.get(name, (0, 0))[1]
        out[name] = (calls / seconds, usec / calls if calls > 0 else None)
    return out


def idle_window(wpid: int, settings: Settings, seconds: float) -> tuple[float, str]:
    """The web process's CPU % over `seconds`, and what Redis did meanwhile (its CPU, the
    hub's XREAD and CLIENT UNBLOCK rates: the shared server's, other users count too)."""
    client = redis.Redis.from_url(settings.redis_url)
    try:
        rpid = redis_pid(client)
        c0, r0 = command_calls(client), proc_ticks(rpid) if rpid else None
        cpu = proc_cpu_pct([wpid], seconds)
        c1, r1 = command_calls(client), proc_ticks(rpid) if rpid else None
    finally:
        client.close()
    rates = hub_rates(c0, c1, seconds)
    redis_pct = None if r0 is None or r1 is None else 100 * (r1 - r0) / CLK_TCK / seconds
    parts = [f"redis-server CPU {fmt(redis_pct, '.0f')} %"]
    for name, (per_s, us) in rates.items():
        parts.append(f"{name.upper().replace('|', ' ')} {per_s:,.0f}/s ({fmt(us, ',.0f')} µs)")
    return cpu, ", ".join(parts)


def measure_streams(p: Procs, counts: Sequence[int]) -> list[Memory]:
    limit = raise_nofile(max(counts) + 1024)
    kids = p.cluster.process(p.web).children()  # gunicorn's one worker: the master's child
    wpid = kids[0] if kids else p.web
    threads = seeded_threads(p.settings.dsn, p.settings.local_user, max(counts))
    with (
        httpx.Client(base_url=p.url, timeout=60) as client,  # warm the stream path
        client.stream("GET", f"/threads/{threads[0]}/stream") as r,
    ):
        r.raise_for_status()
    time.sleep(1)
    holder = StreamHolder(p.url)
    out: list[Memory] = []
    try:
        before = rss_kib(wpid)
        opened = 0
        for n in sorted(counts):
            errors = holder.open([f"/threads/{tid}/stream" for tid in threads[opened:n]])
            opened = n
            time.sleep(SETTLE_S)
            reached = len(holder.held)
            cpu, hub = idle_window(wpid, p.settings, 10.0)
            note = hub if reached >= n else (
                f"{hub}; client soft RLIMIT_NOFILE {limit}; errors: "
                + ", ".join(f"{k} x{v}" for k, v in errors.most_common(3))
            )  # fmt: skip
            out.append(Memory("web RSS, idle thread streams", n, reached, before, rss_kib(wpid),
                              note, cpu))  # fmt: skip
            log(
                f"growth rss: {reached:,}/{n:,} idle streams, web RSS {rss_kib(wpid) / 1024:.1f} MiB"
            )
    finally:
        holder.close()
    return out


def running_count(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM runs WHERE status = 'running'").fetchone()
    return int(row[0]) if row else 0


def measure_inflight(p: Procs, counts: Sequence[int], args: argparse.Namespace) -> list[Memory]:
    threads = seeded_threads(p.settings.dsn, p.settings.local_user, max(counts))
    hold_tokens = args.hold_tokens
    body = {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": "wait"}]},
        "stream_mode": ["messages-tuple"],
        "config": {"configurable": {"tokens": hold_tokens, "token_delay_ms": IDLE_DELAY_MS}},
    }
    with httpx.Client(base_url=p.url, timeout=60) as client:  # warm-up: the graph is built
        warm = new_thread(client)
        stream_one(client, warm, turn_body("warm", 2, ["messages-tuple"]))
    time.sleep(2)
    before = rss_kib(p.worker)
    out: list[Memory] = []
    clients = [httpx.Client(base_url=p.url, timeout=120) for _ in range(20)]
    errors: Counter[str] = Counter()
    try:

        def create(i: int) -> None:
            try:
                clients[i % len(clients)].post(f"/threads/{threads[i]}/runs", json=body)
            except httpx.HTTPError as exc:
                errors[type(exc).__name__] += 1

        started = 0
        for n in sorted(counts):
            t0 = time.monotonic()
            with ThreadPoolExecutor(len(clients)) as pool:
                list(pool.map(create, range(started, n)))
            started = n
            created_s = time.monotonic() - t0
            deadline = time.monotonic() + args.inflight_wait
            reached = running_count(p.settings.dsn)
            while reached < n and time.monotonic() < deadline:
                time.sleep(2)
                reached = running_count(p.settings.dsn)
            time.sleep(SETTLE_S)
            reached = running_count(p.settings.dsn)
            cpu = proc_cpu_pct([p.worker], 10.0)
            after = rss_kib(p.worker)
            note = f"created in {created_s:.0f} s"
            if reached < n:
                note += (
                    f"; only {reached:,} running after {args.inflight_wait:.0f} s "
                    f"(the worker starts them slower than that)"
                )
            if errors:
                note += "; " + ", ".join(f"{k} x{v}" for k, v in errors.most_common(3))
            out.append(Memory("worker RSS, runs in flight", n, reached, before, after, note, cpu))
            log(f"growth rss: {reached:,}/{n:,} runs in flight, worker RSS {after / 1024:.1f} MiB")
    finally:
        for cl in clients:
            cl.close()
    return out


# --- main ----------------------------------------------------------------------------------------
@dataclass
class Results:
    curves: list[TurnCurve] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)


def parse_list(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.growth", description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=("turns", "runs", "rss", "all"), default="all")
    p.add_argument("--turns", type=int, default=500, help="turns of the one thread")
    p.add_argument("--window", type=int, default=10, help="turns averaged around each point")
    p.add_argument("--modes", default="full,delta", help="checkpoint modes of the turn curve")
    p.add_argument(
        "--no-summary",
        action="store_true",
        help="turn the summary middleware off (C1): the thread's history grows without bound",
    )
    p.add_argument(
        "--analyze-every",
        type=int,
        default=0,
        help="ANALYZE the database every this many turns (what autovacuum would do; 0: never, "
        "the tables keep the statistics of empty ones)",
    )
    p.add_argument(
        "--analyze-interval",
        type=float,
        default=None,
        help="THREADRUN_ANALYZE_INTERVAL_S of the processes (the reaper's statistics upkeep; "
        "0: off; default: the setting's default)",
    )
    p.add_argument(
        "--rows-window",
        type=int,
        default=20,
        help="turns of each window whose table reads are counted (turns 11-30 and the last; "
        "0: none)",
    )
    p.add_argument("--tokens", type=int, default=5, help="built-in model tokens per reply")
    p.add_argument("--stream-mode", default="messages-tuple", help="stream modes, comma-separated")
    p.add_argument("--sizes", default="0,50000,200000", help="finished runs in the database")
    p.add_argument("--batch", type=int, default=100, help="runs of the fixed batch")
    p.add_argument("--concurrency", type=int, default=10, help="client threads of the batch")
    p.add_argument("--passes", type=int, default=2, help="batches per database size")
    p.add_argument("--streams", default="1000,5000", help="idle thread streams to hold")
    p.add_argument("--inflight", default="1000,5000", help="runs in flight to hold")
    p.add_argument("--inflight-wait", type=float, default=120.0, help="s to reach each count")
    p.add_argument(
        "--hold-tokens", type=int, default=150, help="tokens (2 s each) of an in-flight run"
    )
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)
    try:
        args.size_list = sorted(parse_list(args.sizes))
        args.stream_list = parse_list(args.streams)
        args.inflight_list = parse_list(args.inflight)
    except ValueError as exc:
        p.error(f"--sizes/--streams/--inflight: integers separated by commas ({exc})")
    if args.turns < 1 or args.batch < 1 or args.passes < 1:
        p.error("--turns, --batch and --passes must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    parts = ("turns", "runs", "rss") if args.part == "all" else (args.part,)
    res = Results()

    def turn_curve(p: Procs, mode: str) -> TurnCurve:
        return measure_turns(p, mode, args)

    def body() -> None:
        if "turns" in parts:
            for mode in args.modes.split(","):
                env = {"THREADRUN_CHECKPOINT_MODE": mode}
                if args.no_summary:
                    env["THREADRUN_SUMMARY_ENABLED"] = "false"
                if args.analyze_interval is not None:
                    env["THREADRUN_ANALYZE_INTERVAL_S"] = str(args.analyze_interval)
                res.curves.append(
                    on_cluster(f"turns-{mode}", functools.partial(turn_curve, mode=mode), env)
                )
            print(f"1. per-turn cost, one thread, {args.turns} turns x {args.tokens} tokens "
                  f"({args.stream_mode}), means of {args.window}-turn windows; summary "
                  f"{'off' if args.no_summary else 'on'}; ANALYZE "
                  f"{f'every {args.analyze_every} turns' if args.analyze_every else 'never'} "
                  f"by the bench; statistics upkeep every "
                  f"{args.analyze_interval if args.analyze_interval is not None else Settings().analyze_interval_s:g} s")  # fmt: skip
            print()
            print(turns_table(res.curves, args.window))
            if any(c.rows for c in res.curves):
                print()
                print(rows_table(res.curves))
            for c in res.curves:
                print(
                    f"{c.mode}: {c.failed} failed turns; after the last turn the thread holds "
                    f"{fmt(c.messages, ',')} messages, {fmt(c.checkpoints, ',')} checkpoints of "
                    f"{fmt(None if c.checkpoint_bytes is None else c.checkpoint_bytes / 1024, ',.0f')} KiB"
                )
            print()
        if "runs" in parts:
            res.batches = on_cluster("runs", lambda p: measure_runs(p, args))
            print(f"2. per-run cost by finished runs in the database: {args.batch} runs x "
                  f"{args.tokens} tokens at C={args.concurrency}, {args.passes} passes (a / b)")  # fmt: skip
            print()
            print(runs_table(res.batches))
            print()
        if "rss" in parts:
            if args.stream_list:
                res.memory += on_cluster("streams", lambda p: measure_streams(p, args.stream_list))
            if args.inflight_list:
                slots = max(args.inflight_list)
                res.memory += on_cluster(
                    "inflight",
                    lambda p: measure_inflight(p, args.inflight_list, args),
                    {"THREADRUN_WORKER_CONCURRENCY": str(slots)},
                    concurrency=slots,
                )
            print("3. memory per idle stream / in-flight run")
            print()
            print(memory_table(res.memory))
        if args.json is not None:
            args.json.write_text(json.dumps(asdict(res), indent=2) + "\n")

    return run_bench("growth", body)


if __name__ == "__main__":
    sys.exit(main())
