"""CPU per run and time to the first token under each `durability` mode, beside raw baselines.

Run with `.venv/bin/python -m bench.durability [--runs 200] [--concurrency 50] [--tokens 200]
[--ttft-runs 30] [--passes 2] [--json PATH]`. It starts two web processes and one runs worker
(the `make run` shape, bench/system_cpu.py's `on_cluster`) on a private database and Redis
prefix, warms up, then, for each pass and each mode in turn (`sync`, `async`, `exit`; the
order reversed every other pass, so a machine growing busier does not favour one mode):

- streams `--runs` runs of the built-in model (`messages-tuple` and `values`, one thread each)
  from `--concurrency` client threads and sums the CPU of the web and worker process trees,
  the sandbox database's PostgreSQL backends and the redis-server (bench/system_cpu.py);
- streams `--ttft-runs` runs one after another and times the first `messages` event (TTFT).

Beside them, in the same run, the raw baselines: the PostgreSQL backend's CPU per committed
one-row INSERT and the Redis CPU per pipelined XADD (a run's CPU in "INSERT-equivalents"
does not move with the machine's speed), and a PostgreSQL `SELECT 1` round trip (TTFT in
round trips). The `vs async` columns divide by LangGraph's default mode measured in the same
pass. docs/guarantees.md says what a crash loses under each mode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis

from bench.chaos import table
from bench.first_token import median_us, pct, stream_timed
from bench.scale import tree_cpu_s
from bench.system_cpu import (
    CLK_TCK,
    WEBS,
    BackendCpu,
    on_cluster,
    proc_ticks,
    raw_insert_us,
    raw_xadd_us,
    redis_pid,
    run_bench,
)
from shared.settings import Settings

MODES = ("sync", "async", "exit")
DEFAULT = "async"
WARMUP = 10


def run_body(n: int, tokens: int, durability: str) -> dict[str, Any]:
    return {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": f"durability {n}"}]},
        "stream_mode": ["messages-tuple", "values"],
        "config": {"configurable": {"tokens": tokens, "token_delay_ms": 0}},
        "durability": durability,
    }


def one_run(client: httpx.Client, n: int, tokens: int, durability: str) -> tuple[int, float]:
    """(events, TTFT ms) of one streamed run on a new thread, read to its end."""
    timed = stream_timed(client, run_body(n, tokens, durability), f"run {n} ({durability})")
    return timed.events, timed.ttft_ms


@dataclass
class Mode:
    """One mode's figures in one pass (CPU ms per run; TTFT ms)."""

    durability: str
    web_ms: float
    worker_ms: float
    postgres_ms: float
    redis_ms: float | None
    total_ms: float
    events_per_run: float
    ttft_p50: float


@dataclass
class Figures:
    """The whole measurement."""

    runs: int
    concurrency: int
    tokens: int
    ttft_runs: int
    insert_us: float
    xadd_us: float | None
    pg_select_us: float
    passes: list[list[Mode]] = field(default_factory=list)


def cpu_pass(
    clients: list[httpx.Client],
    roots: dict[str, list[int]],
    pg: BackendCpu,
    rpid: int | None,
    args: Any,
    durability: str,
) -> Mode:
    """CPU per run of `args.runs` runs at C=`args.concurrency`, then TTFT at C=1."""
    base = pg.snapshot()
    web0, wk0 = tree_cpu_s(roots["web"]), tree_cpu_s(roots["worker"])
    r0 = proc_ticks(rpid) if rpid else None
    with ThreadPoolExecutor(args.concurrency) as pool:
        got = list(
            pool.map(
                lambda i: one_run(clients[i % len(clients)], i, args.tokens, durability),
                range(args.runs),
            )
        )
    web1, wk1 = tree_cpu_s(roots["web"]), tree_cpu_s(roots["worker"])
    r1 = proc_ticks(rpid) if rpid else None
    pg_ms = pg.seconds(base) * 1000 / args.runs
    per = 1000 / args.runs
    redis_ms = None if r0 is None or r1 is None else (r1 - r0) / CLK_TCK * per
    web_ms, worker_ms = (web1 - web0) * per, (wk1 - wk0) * per
    ttfts = [
        one_run(clients[i % len(clients)], i, args.tokens, durability)[1]
        for i in range(args.ttft_runs)
    ]
    return Mode(
        durability=durability,
        web_ms=web_ms,
        worker_ms=worker_ms,
        postgres_ms=pg_ms,
        redis_ms=redis_ms,
        total_ms=web_ms + worker_ms + pg_ms + (redis_ms or 0.0),
        events_per_run=sum(e for e, _ in got) / args.runs,
        ttft_p50=pct(ttfts, 0.5),
    )


def measure(urls: list[str], roots: dict[str, list[int]], settings: Settings, args: Any) -> Figures:
    clients = [httpx.Client(base_url=u, timeout=300) for u in urls]
    rclient = redis.Redis.from_url(settings.redis_url)
    try:
        rpid = redis_pid(rclient)
        for mode in MODES:  # warm-up: imports, pools, prepared statements
            for i in range(WARMUP):
                one_run(clients[i % len(clients)], i, args.tokens, mode)
        with psycopg.connect(settings.dsn, autocommit=True) as conn:
            select = median_us(lambda: conn.execute("SELECT 1").fetchone())
        figures = Figures(
            runs=args.runs,
            concurrency=args.concurrency,
            tokens=args.tokens,
            ttft_runs=args.ttft_runs,
            insert_us=raw_insert_us(settings.dsn),
            xadd_us=raw_xadd_us(rclient, rpid, settings.redis_prefix),
            pg_select_us=select,
        )
        with BackendCpu(settings.dsn) as pg:
            for n in range(args.passes):
                order = MODES if n % 2 == 0 else tuple(reversed(MODES))
                by_mode = {m: cpu_pass(clients, roots, pg, rpid, args, m) for m in order}
                figures.passes.append([by_mode[m] for m in MODES])
    finally:
        rclient.close()
        for c in clients:
            c.close()
    return figures


def report(f: Figures) -> str:
    rows = []
    for n, modes in enumerate(f.passes, 1):
        default = next(m for m in modes if m.durability == DEFAULT)
        for m in modes:
            rows.append(
                (
                    f"{n}",
                    m.durability,
                    f"{m.web_ms:.1f}",
                    f"{m.worker_ms:.1f}",
                    f"{m.postgres_ms:.1f}",
                    "-" if m.redis_ms is None else f"{m.redis_ms:.1f}",
                    f"{m.total_ms:.1f}",
                    f"{m.total_ms / default.total_ms:.2f}x",
                    f"{1000 * m.total_ms / f.insert_us:,.0f}",
                    f"{m.ttft_p50:.1f}",
                    f"{m.ttft_p50 / default.ttft_p50:.2f}x",
                    f"{1000 * m.ttft_p50 / f.pg_select_us:.0f}",
                )
            )
    header = (
        "pass", "durability", "web", "worker", "postgres", "redis", "CPU ms/run",
        "vs async", "in INSERTs", "TTFT p50 ms", "vs async", "in SELECT 1s",
    )  # fmt: skip
    base = table(
        ("raw baseline (same run)", "µs"),
        [
            ("PostgreSQL INSERT tx, backend CPU", f"{f.insert_us:.1f}"),
            (
                "Redis XADD (pipelined), server CPU",
                "-" if f.xadd_us is None else f"{f.xadd_us:.1f}",
            ),
            ("PostgreSQL SELECT 1, round trip", f"{f.pg_select_us:.0f}"),
        ],
    )
    events = statistics.median(m.events_per_run for p in f.passes for m in p)
    head = (
        f"{f.runs} runs x {f.tokens} tokens at C={f.concurrency} ({events:.0f} events/run) for CPU, "
        f"{f.ttft_runs} runs at C=1 for TTFT, per mode and pass"
    )
    return "\n".join([head, "", table(header, rows), "", base])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.durability", description=__doc__.split("\n")[0]
    )
    p.add_argument("--runs", type=int, default=200, help="streamed runs per mode for CPU")
    p.add_argument("--concurrency", type=int, default=50, help="client threads for CPU")
    p.add_argument("--tokens", type=int, default=200, help="built-in model tokens per run")
    p.add_argument("--ttft-runs", type=int, default=30, help="runs one after another for TTFT")
    p.add_argument("--passes", type=int, default=2, help="interleaved passes over the modes")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure in a private sandbox, print the tables, always clean up."""
    args = parse_args(argv)
    if min(args.runs, args.concurrency, args.ttft_runs, args.passes) < 1:
        raise SystemExit("--runs, --concurrency, --ttft-runs, --passes: at least 1")

    def body() -> None:
        figures = on_cluster(
            "durability", lambda urls, roots, settings: measure(urls, roots, settings, args)
        )
        print(
            f"threadrun durability modes: {WEBS} web processes, 1 runs worker, {os.cpu_count()} CPUs"
        )
        print()
        print(report(figures))
        if args.json is not None:
            args.json.write_text(json.dumps(asdict(figures), indent=2) + "\n")

    return run_bench("durability", body)


if __name__ == "__main__":
    raise SystemExit(main())
