"""CPU per run with the expiry sweep deleting a backlog, beside the same runs with nothing to
expire (P6), measured in the same run on the same cluster.

Run with `.venv/bin/python -m bench.sweep_cpu [--runs 150] [--concurrency 8] [--tokens 50]
[--backlog 4000] [--rounds 2] [--json PATH]` (not part of `make bench`: about 2 minutes). It
starts one web process, one runs worker and the scheduler (Celery beat with the cron and
sweep ticks) on a private database and Redis prefix (shared.tools.testing's Sandbox), with
a sweep every `--interval-s` seconds taking at most `--limit` threads
(`THREADRUN_THREAD_SWEEP_INTERVAL_MINUTES`, `THREADRUN_THREAD_SWEEP_LIMIT`). Each round has
two phases, in turn:

- without: `--runs` streamed runs of the built-in model (official langgraph-sdk, a new thread
  each, `messages-tuple` + `values`) from `--concurrency` client threads; the scheduler sweeps
  on its interval and finds nothing;
- with: the same runs while the sweep deletes a backlog of `--backlog` threads, seeded before
  the phase with bench/sweep.py's `seed` (what a thread that ran leaves: an ended run, 6 journal
  rows, 4 checkpoints with writes and blobs, a head copy, a workspace file, 3 Redis keys) with
  an expiry a day away, and made expired (one UPDATE) just before the first run.

For each phase: CPU seconds (user + system, /proc) per run of the web, the runs worker and
the scheduler (process trees), of the PostgreSQL backends of the sandbox database (sampled
from pg_stat_activity every 0.2 s, bench/system_cpu.py's BackendCpu: the sweep's own backends
count) and of the redis-server (shared with whatever else runs on this machine); the run's
latency (from the run's request to its last event) p50/p95; and in the with-phase the threads
the sweep removed per second of the phase (if the backlog ran out before the runs ended the
figure is a lower bound, and the table says so).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
import redis
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient

from bench import sweep
from bench.chaos import bench_cluster, log, table
from bench.internals import percentile
from bench.scale import sandboxed, tree_cpu_s
from bench.system_cpu import BENCH_ERRORS, CLK_TCK, BackendCpu, proc_ticks, redis_pid, run_bench
from shared.db import make_pool
from shared.settings import Settings
from shared.tools.testing import WaitTimeout, wait_for

BACKLOG_OWNER = "bench-backlog"
ROLES = ("web", "worker", "scheduler")
SEED_BATCH = 1000


# --- pure helpers (tests/unit/test_bench_tables.py) ---------------------------------------------
RATIO_FLOOR_MS = 0.05
"""A base below this (ms per run) is a few clock ticks over a whole phase: no ratio."""


def ratio(ours: float, base: float) -> str:
    """`ours / base` as a table cell ("-" when the base is too small to divide by)."""
    return f"{ours / base:.2f}x" if base >= RATIO_FLOOR_MS else "-"


@dataclass
class Phase:
    """One phase's figures (CPU in ms per run)."""

    label: str
    runs: int
    failed: int
    wall_s: float
    latencies_ms: list[float]
    cpu_ms: dict[str, float]  # web, worker, scheduler, postgres, redis (when measured)
    swept: int = 0
    backlog_left: int = 0

    @property
    def ours_ms(self) -> float:
        """CPU of threadrun's processes per run."""
        return sum(self.cpu_ms.get(role, 0.0) for role in ROLES)

    @property
    def total_ms(self) -> float:
        """CPU of everything measured per run."""
        return sum(self.cpu_ms.values())


def merge(phases: Sequence[Phase]) -> Phase:
    """The phases of every round as one: runs, latencies and CPU summed (CPU per run is the
    sum of CPU over the sum of runs)."""
    runs = sum(p.runs for p in phases)
    keys = sorted({k for p in phases for k in p.cpu_ms})
    cpu = {k: sum(p.cpu_ms.get(k, 0.0) * p.runs for p in phases) / runs for k in keys}
    return Phase(
        label=phases[0].label,
        runs=runs,
        failed=sum(p.failed for p in phases),
        wall_s=sum(p.wall_s for p in phases),
        latencies_ms=[x for p in phases for x in p.latencies_ms],
        cpu_ms=cpu,
        swept=sum(p.swept for p in phases),
        backlog_left=sum(p.backlog_left for p in phases),
    )


def report(without: Phase, with_sweep: Phase, backlog: int) -> str:
    """The tables: CPU per run and latency without / with the sweep and their ratio; the sweep."""

    def cells(name: str, a: float, b: float, fmt: str = ".1f") -> list[str]:
        return [name, format(a, fmt), format(b, fmt), ratio(b, a)]

    rows = [cells(f"CPU ms/run: {k}", without.cpu_ms[k], with_sweep.cpu_ms[k]) for k in ROLES]
    rows.append(cells("CPU ms/run: threadrun (web + worker + scheduler)", without.ours_ms,
                      with_sweep.ours_ms))  # fmt: skip
    for k in ("postgres", "redis"):
        if k in without.cpu_ms and k in with_sweep.cpu_ms:
            rows.append(cells(f"CPU ms/run: {k}", without.cpu_ms[k], with_sweep.cpu_ms[k]))
    rows.append(cells("CPU ms/run: all measured", without.total_ms, with_sweep.total_ms))
    for name, q in (("p50", 50), ("p95", 95)):
        rows.append(
            cells(
                f"run latency ms {name}",
                percentile(without.latencies_ms, q),
                percentile(with_sweep.latencies_ms, q),
            )
        )
    rows.append(cells("runs/s", without.runs / without.wall_s, with_sweep.runs / with_sweep.wall_s))
    main = table(("figure", "without sweep", "with sweep", "with/without"), rows)
    rate = with_sweep.swept / with_sweep.wall_s if with_sweep.wall_s > 0 else 0.0
    ran_out = with_sweep.backlog_left == 0
    extra = (with_sweep.total_ms - without.total_ms) * with_sweep.runs
    sweep_row = [
        f"{backlog:,} per round",
        f"{with_sweep.swept:,}",
        f"{rate:,.0f}" + (" (lower bound: the backlog ran out)" if ran_out else ""),
        f"{with_sweep.backlog_left:,}",
        f"{extra / with_sweep.swept:.1f}" if with_sweep.swept else "-",
    ]
    head = (
        "backlog",
        "threads swept during the runs",
        "threads/s",
        "left at the ends",
        "extra CPU ms (all measured) per swept thread",
    )
    swept = table(head, [sweep_row])
    failed = f"failed runs: {without.failed} without, {with_sweep.failed} with"
    return "\n".join([main, "", swept, "", failed])


# --- the cluster ------------------------------------------------------------------------------------
def run_input(i: int, tokens: int) -> dict[str, Any]:
    return {
        "input": {"messages": [{"role": "user", "content": f"sweep cpu {i}"}]},
        "stream_mode": ["messages-tuple", "values"],
        "config": {"configurable": {"tokens": tokens, "token_delay_ms": 0}},
    }


def drive(url: str, n: int, tokens: int, concurrency: int) -> tuple[list[float], int]:
    """Stream `n` runs (a new thread each) from `concurrency` client threads with the official
    SDK; (latency ms of each run, failed runs)."""
    local = threading.local()

    def client() -> SyncLangGraphClient:
        if not hasattr(local, "client"):
            local.client = get_sync_client(url=url, api_key=None, timeout=300)
        c: SyncLangGraphClient = local.client
        return c

    def one(i: int) -> tuple[float, bool]:
        c = client()
        tid = c.threads.create()["thread_id"]
        ok = False
        t0 = time.perf_counter()
        for part in c.runs.stream(tid, "lead_agent", **run_input(i, tokens)):
            ok = part.event != "error"
        return (time.perf_counter() - t0) * 1000, ok

    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(n)))
    return [ms for ms, _ in results], sum(1 for _, ok in results if not ok)


def backlog_left(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM threads WHERE owner = %s", (BACKLOG_OWNER,)
        ).fetchone()
    return int(row[0]) if row else 0


def seed_backlog(settings: Settings, n: int) -> None:
    """n threads of BACKLOG_OWNER that expire in a day (`expire_backlog` makes them due)."""
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    pool = make_pool(settings, name="bench-sweep-cpu", max_size=1)
    client = redis.Redis.from_url(settings.redis_url)
    try:
        for start in range(0, n, SEED_BATCH):
            count = min(SEED_BATCH, n - start)
            sweep.seed(settings, pool, client, count, owner=BACKLOG_OWNER, expires_at=later)
    finally:
        pool.close()
        client.close()


def expire_backlog(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE threads SET expires_at = now() - interval '1 second' WHERE owner = %s",
            (BACKLOG_OWNER,),
        )


def phase(
    label: str,
    url: str,
    roots: dict[str, list[int]],
    settings: Settings,
    args: argparse.Namespace,
    with_backlog: bool,
) -> Phase:
    dsn = settings.dsn
    if with_backlog:
        seed_backlog(settings, args.backlog)
    rclient = redis.Redis.from_url(settings.redis_url)
    rpid = redis_pid(rclient)
    rclient.close()
    with BackendCpu(dsn) as pg:
        base = pg.snapshot()
        cpu0 = {role: tree_cpu_s(pids) for role, pids in roots.items()}
        r0 = proc_ticks(rpid) if rpid else None
        if with_backlog:
            expire_backlog(dsn)
        left0 = backlog_left(dsn)
        t0 = time.monotonic()
        latencies, failed = drive(url, args.runs, args.tokens, args.concurrency)
        wall = time.monotonic() - t0
        left1 = backlog_left(dsn)
        cpu1 = {role: tree_cpu_s(pids) for role, pids in roots.items()}
        r1 = proc_ticks(rpid) if rpid else None
    per = 1000 / args.runs
    cpu = {role: (cpu1[role] - cpu0[role]) * per for role in roots}
    cpu["postgres"] = pg.seconds(base) * per
    if r0 is not None and r1 is not None:
        cpu["redis"] = (r1 - r0) / CLK_TCK * per
    log(
        f"sweep_cpu: {label}: {args.runs} runs in {wall:.1f} s, {failed} failed,"
        f" swept {left0 - left1}, left {left1}"
    )
    return Phase(label, args.runs, failed, wall, latencies, cpu, left0 - left1, left1)


def wait_swept(dsn: str, timeout_s: float) -> None:
    """Let the sweep finish what is left of a backlog before the next phase (bounded)."""
    with contextlib.suppress(WaitTimeout):
        wait_for(lambda: backlog_left(dsn) == 0, timeout_s, 0.5, what="the backlog swept")
    left = backlog_left(dsn)
    if left:
        with psycopg.connect(dsn, autocommit=True) as conn:  # the rest is not to be measured
            conn.execute("UPDATE threads SET expires_at = NULL WHERE owner = %s", (BACKLOG_OWNER,))
        log(f"sweep_cpu: {left} backlog threads left unexpired after {timeout_s:.0f} s")


def measure(args: argparse.Namespace) -> tuple[Phase, Phase]:
    base = Settings()
    workdir = Path(tempfile.mkdtemp(prefix="threadrun-sweep-cpu-"))
    with sandboxed(base) as (sandbox, settings):
        log(f"sweep_cpu: database {sandbox.db_name}, prefix {sandbox.prefix}, logs {workdir}")
        cluster = bench_cluster(settings, workdir)
        cluster.env["THREADRUN_THREAD_SWEEP_INTERVAL_MINUTES"] = str(args.interval_s / 60)
        cluster.env["THREADRUN_THREAD_SWEEP_LIMIT"] = str(args.limit)
        # the processes' data dir (workspaces) is the cluster's; the seed writes there too
        settings = settings.model_copy(update={"data_dir": Path(cluster.env["THREADRUN_DATA_DIR"])})
        try:
            url, worker, scheduler = cluster.side_by_side(
                cluster.start_web,
                lambda: cluster.start_worker("runs", base.worker_concurrency, timeout=90),
                cluster.start_scheduler,
            )
            web = next(p for p in cluster.procs if p.role == "web")
            roots = {"web": [web.pid], "worker": [worker.pid], "scheduler": [scheduler.pid]}
            drive(url, 10, args.tokens, 5)  # warm-up: imports, pools, prepared statements
            withouts: list[Phase] = []
            withs: list[Phase] = []
            for i in range(args.rounds):
                order = (False, True) if i % 2 == 0 else (True, False)
                for backlog in order:
                    label = "with sweep" if backlog else "without sweep"
                    result = phase(label, url, roots, settings, args, backlog)
                    (withs if backlog else withouts).append(result)
                    if backlog:
                        wait_swept(settings.dsn, 120)
            return merge(withouts), merge(withs)
        except BENCH_ERRORS:
            for p in cluster.procs:
                log(f"--- {p.name} ---\n{p.tail()}")
            raise
        finally:
            cluster.stop()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.sweep_cpu", description=__doc__.split("\n")[0]
    )
    p.add_argument("--runs", type=int, default=150, help="streamed runs per phase")
    p.add_argument("--concurrency", type=int, default=8, help="client threads")
    p.add_argument("--tokens", type=int, default=50, help="built-in model tokens per run")
    p.add_argument("--backlog", type=int, default=4000, help="expired threads per with-phase")
    p.add_argument("--rounds", type=int, default=2, help="without/with pairs (order alternates)")
    p.add_argument("--interval-s", type=float, default=1.0, help="seconds between sweeps")
    p.add_argument("--limit", type=int, default=500, help="threads one sweep takes at most")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure in a private sandbox, print the tables, always clean up."""
    args = parse_args(argv)

    def body() -> None:
        without, with_sweep = measure(args)
        print(
            f"sweep_cpu: {args.runs} runs x {args.tokens} tokens per phase at"
            f" C={args.concurrency}, {args.rounds} round(s); sweep every {args.interval_s:g} s,"
            f" limit {args.limit}; 1 web, 1 runs worker, 1 scheduler, {os.cpu_count()} CPUs"
        )
        print()
        print(report(without, with_sweep, args.backlog))
        if args.json is not None:
            data = {"without": asdict(without), "with": asdict(with_sweep)}
            args.json.write_text(json.dumps(data, indent=2) + "\n")

    return run_bench("sweep_cpu", body)


if __name__ == "__main__":
    sys.exit(main())
