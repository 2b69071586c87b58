"""A capacity model from measured per-component costs: how much of each part serves a load.

Run with `.venv/bin/python -m bench.capacity [--runs 200] [--concurrency 50] [--tokens 200]
[--assistant ID --input JSON] [--rates 10,100,1000] [--utilisation 0.7] [--pg-cores 8]
[--json PATH]`. With `--assistant` / `--input` (and `THREADRUN_CONFIG` naming your
langgraph.json) it measures your own graph's runs; by default the built-in model's
comparison run (`--tokens` tokens, `messages-tuple` + `values`).

It starts the `make run` shape (bench.system_cpu.on_cluster: two web processes, one runs
worker, a private database and Redis prefix), warms up, streams `--runs` runs from
`--concurrency` client threads and measures per run:

- CPU ms of the web processes, the runs worker, the database's PostgreSQL backends and the
  redis-server (bench.system_cpu's counters), beside the raw XADD and INSERT baselines of the
  same run (so the ratios hold on another machine);
- Redis commands (INFO commandstats) and the bytes its stream keys hold (MEMORY USAGE of
  every `run:*` key the runs left, kept `stream_ttl_after_end_s` after the end). The
  redis-server's CPU and commands count every client of that server: on a shared one
  (other test runs), run this alone or read them as upper bounds;
- PostgreSQL transactions (pg_stat_database) and the database's growth in bytes;
- the run's execution time on the worker (runs.started_at to ended_at).

Then, for each target rate, the model (docs/operations.md, "Capacity"):

- cores of each component = rate x CPU s per run / utilisation;
- runs worker processes = in-flight runs (Little's law: rate x execution time) / the worker's
  slots (THREADRUN_WORKER_CONCURRENCY), at least cores;
- web: open streams = rate x client-observed run time; cores as above;
- PostgreSQL connections = web processes x db_pool_max + workers x (db_pool_max +
  checkpoint_savers), the pools' ceilings (docs/operations.md, "Scaling");
- Redis memory = rate x (execution time + stream_ttl_after_end_s) x stream bytes per run;
- PostgreSQL growth per day before any TTL sweep (docs/project.md `checkpointer.ttl`);
- the first bottleneck among the parts that do not scale out: one Redis primary runs its
  commands on one core (rate <= utilisation / Redis CPU s per run), one PostgreSQL primary
  has `--pg-cores` (rate <= utilisation x cores / PostgreSQL CPU s per run). Web and
  workers scale out, so they add cores, never a ceiling.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench.chaos import table
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
    run_body,
    stream_runs,
)
from shared.settings import Settings

MiB = 1024 * 1024


@dataclass
class Costs:
    """What one run costs each component (measured)."""

    runs: int
    concurrency: int
    runs_per_s: float
    events_per_run: float
    failed: int
    client_run_s: float
    """Mean time a client waited for its run, start to end (concurrency / throughput)."""
    exec_s: float
    """Mean execution time on the worker (started_at to ended_at)."""
    web_ms: float
    worker_ms: float
    postgres_ms: float
    redis_ms: float | None
    redis_commands: float
    stream_bytes: float
    pg_xacts: float
    pg_bytes: float
    xadd_us: float | None
    insert_us: float
    worker_slots: int
    db_pool_max: int
    checkpoint_savers: int
    stream_ttl_s: int


def redis_commands(client: redis.Redis) -> int:
    """Commands the Redis server has run so far (all clients: the sandbox is the load)."""
    stats = client.info("commandstats")
    return sum(int(v.get("calls", 0)) for v in stats.values() if isinstance(v, dict))


def stream_bytes(client: redis.Redis, prefix: str) -> int:
    """Bytes held by the runs' keys (streams, their meta, results) under `prefix`."""
    total = 0
    for key in client.scan_iter(match=f"{prefix}run:*", count=1000):
        total += int(client.memory_usage(key) or 0)
    return total


def pg_figures(dsn: str) -> tuple[int, int]:
    """(committed transactions, database bytes) of the sandbox database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit, pg_database_size(current_database()) FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def mean_exec_s(dsn: str, since: float) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT avg(extract(epoch FROM ended_at - started_at)) FROM runs "
            "WHERE started_at >= to_timestamp(%s) AND ended_at IS NOT NULL",
            (since,),
        ).fetchone()
    return float(row[0]) if row and row[0] is not None else 0.0


def body_factory(args: argparse.Namespace) -> Any:
    """Run i's request: the user's assistant and input, or the built-in comparison run."""
    if args.assistant is None:
        return lambda i: run_body(i, args.tokens)
    payload = json.loads(args.input) if args.input else {}
    return lambda i: {
        "assistant_id": args.assistant,
        "input": payload,
        "stream_mode": ["messages-tuple", "values"],
    }


def measure(
    urls: list[str], roots: dict[str, list[int]], settings: Settings, args: argparse.Namespace
) -> Costs:
    body = body_factory(args)
    rclient = redis.Redis.from_url(settings.redis_url)
    try:
        rpid = redis_pid(rclient)
        stream_runs(urls, 10, args.tokens, 5, body)  # warm-up
        xadd = raw_xadd_us(rclient, rpid, settings.redis_prefix)
        insert = raw_insert_us(settings.dsn)
        bytes0 = stream_bytes(rclient, settings.redis_prefix)
        xacts0, size0 = pg_figures(settings.dsn)
        with BackendCpu(settings.dsn) as pg:
            base = pg.snapshot()
            web0, wk0 = tree_cpu_s(roots["web"]), tree_cpu_s(roots["worker"])
            r0 = proc_ticks(rpid) if rpid else None
            cmds0 = redis_commands(rclient)
            started = time.time()
            t0 = time.monotonic()
            events, failed = stream_runs(urls, args.runs, args.tokens, args.concurrency, body)
            wall = time.monotonic() - t0
            cmds1 = redis_commands(rclient)
            web1, wk1 = tree_cpu_s(roots["web"]), tree_cpu_s(roots["worker"])
            r1 = proc_ticks(rpid) if rpid else None
        pg_s = pg.seconds(base)
        xacts1, size1 = pg_figures(settings.dsn)
        bytes1 = stream_bytes(rclient, settings.redis_prefix)
        exec_s = mean_exec_s(settings.dsn, started)
    finally:
        rclient.close()
    n = args.runs
    per = 1000 / n
    return Costs(
        runs=n,
        concurrency=args.concurrency,
        runs_per_s=n / wall,
        events_per_run=events / n,
        failed=failed,
        client_run_s=args.concurrency * wall / n,
        exec_s=exec_s,
        web_ms=(web1 - web0) * per,
        worker_ms=(wk1 - wk0) * per,
        postgres_ms=pg_s * per,
        redis_ms=None if r0 is None or r1 is None else (r1 - r0) / CLK_TCK * per,
        redis_commands=(cmds1 - cmds0) / n,
        stream_bytes=max(0, bytes1 - bytes0) / n,
        pg_xacts=(xacts1 - xacts0) / n,
        pg_bytes=max(0, size1 - size0) / n,
        xadd_us=xadd,
        insert_us=insert,
        worker_slots=settings.worker_concurrency,
        db_pool_max=settings.db_pool_max,
        checkpoint_savers=settings.checkpoint_savers,
        stream_ttl_s=settings.stream_ttl_after_end_s,
    )


@dataclass
class Plan:
    """What one target rate needs."""

    rate: float
    web_cores: float
    web_processes: int
    open_streams: float
    worker_cores: float
    workers: int
    inflight_runs: float
    postgres_cores: float
    postgres_connections: int
    postgres_xacts_per_s: float
    postgres_growth_gib_per_day: float
    redis_cores: float | None
    redis_commands_per_s: float
    redis_memory_mib: float


def plan(c: Costs, rate: float, utilisation: float) -> Plan:
    """The model of the module docstring, at `rate` runs/s."""

    def cores(ms: float) -> float:
        return rate * ms / 1000 / utilisation

    web_cores = cores(c.web_ms)
    web_processes = max(1, math.ceil(web_cores))  # one gevent process uses one core
    inflight = rate * c.exec_s
    worker_cores = cores(c.worker_ms)
    workers = max(1, math.ceil(inflight / c.worker_slots), math.ceil(worker_cores))
    return Plan(
        rate=rate,
        web_cores=web_cores,
        web_processes=web_processes,
        open_streams=rate * c.client_run_s,
        worker_cores=worker_cores,
        workers=workers,
        inflight_runs=inflight,
        postgres_cores=cores(c.postgres_ms),
        postgres_connections=(
            web_processes * c.db_pool_max + workers * (c.db_pool_max + c.checkpoint_savers)
        ),
        postgres_xacts_per_s=rate * c.pg_xacts,
        postgres_growth_gib_per_day=rate * c.pg_bytes * 86_400 / 1024**3,
        redis_cores=None if c.redis_ms is None else cores(c.redis_ms),
        redis_commands_per_s=rate * c.redis_commands,
        redis_memory_mib=rate * (c.exec_s + c.stream_ttl_s) * c.stream_bytes / MiB,
    )


def ceilings(c: Costs, utilisation: float, pg_cores: int) -> list[tuple[str, float]]:
    """The rates at which the parts that do not scale out are full, lowest first."""
    out: list[tuple[str, float]] = []
    if c.redis_ms:
        out.append(
            ("one Redis primary (one core runs its commands)", utilisation * 1000 / c.redis_ms)
        )
    if c.postgres_ms:
        out.append(
            (
                f"one PostgreSQL primary ({pg_cores} cores)",
                utilisation * pg_cores * 1000 / c.postgres_ms,
            )
        )
    return sorted(out, key=lambda item: item[1])


def report(c: Costs, rates: Sequence[float], utilisation: float, pg_cores: int) -> str:
    def opt(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    head = (
        f"measured: {c.runs} runs at C={c.concurrency}, {c.runs_per_s:.1f} runs/s, "
        f"{c.events_per_run:.0f} events/run, {c.failed} failed; execution {c.exec_s * 1000:.0f} ms, "
        f"client-observed {c.client_run_s * 1000:.0f} ms per run"
    )
    xadd_eq = None if c.redis_ms is None or not c.xadd_us else 1000 * c.redis_ms / c.xadd_us
    insert_eq = 1000 * c.postgres_ms / c.insert_us if c.insert_us else None
    costs = table(
        ("per run", "web", "worker", "postgres", "redis"),
        [
            (
                "CPU ms",
                f"{c.web_ms:.1f}",
                f"{c.worker_ms:.1f}",
                f"{c.postgres_ms:.1f}",
                opt(c.redis_ms, ".1f"),
            ),
            (
                "in raw ops (same run)",
                "-",
                "-",
                f"{opt(insert_eq, ',.0f')} INSERTs",
                f"{opt(xadd_eq, ',.0f')} XADDs",
            ),
            (
                "round trips / commands",
                "-",
                "-",
                f"{c.pg_xacts:.1f} tx",
                f"{c.redis_commands:.0f} cmds",
            ),
            (
                "bytes kept",
                "-",
                "-",
                f"{c.pg_bytes / 1024:.1f} KiB",
                f"{c.stream_bytes / 1024:.1f} KiB",
            ),
        ],
    )
    plans = [plan(c, r, utilisation) for r in rates]
    model = table(
        ("runs/s", *[f"{p.rate:g}" for p in plans]),
        [
            ("web cores (processes)", *[f"{p.web_cores:.1f} ({p.web_processes})" for p in plans]),
            ("open streams", *[f"{p.open_streams:,.0f}" for p in plans]),
            ("worker cores", *[f"{p.worker_cores:.1f}" for p in plans]),
            ("in-flight runs (workers)", *[f"{p.inflight_runs:,.0f} ({p.workers})" for p in plans]),
            ("PostgreSQL cores", *[f"{p.postgres_cores:.1f}" for p in plans]),
            ("PostgreSQL connections", *[f"{p.postgres_connections:,}" for p in plans]),
            ("PostgreSQL tx/s", *[f"{p.postgres_xacts_per_s:,.0f}" for p in plans]),
            (
                "PostgreSQL growth GiB/day",
                *[f"{p.postgres_growth_gib_per_day:,.1f}" for p in plans],
            ),
            ("Redis cores", *[opt(p.redis_cores, ".2f") for p in plans]),
            ("Redis commands/s", *[f"{p.redis_commands_per_s:,.0f}" for p in plans]),
            ("Redis memory MiB", *[f"{p.redis_memory_mib:,.0f}" for p in plans]),
        ],
    )
    limits = ceilings(c, utilisation, pg_cores)
    lines = [head, "", costs, "", f"model at {utilisation:.0%} utilisation:", "", model, ""]
    if limits:
        first, at = limits[0]
        lines.append(f"first bottleneck: {first} at about {at:,.0f} runs/s")
        lines += [f"  then: {name} at about {rate:,.0f} runs/s" for name, rate in limits[1:]]
        over = [r for r in rates if r > at]
        if over:
            lines.append(
                f"  {', '.join(f'{r:g}' for r in over)} runs/s need more than {first.split(' (')[0]}"
                " (Redis: shard runs over primaries; PostgreSQL: a bigger primary or fewer bytes per run)"
            )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=200, help="timed streamed runs")
    p.add_argument("--concurrency", type=int, default=50, help="client threads")
    p.add_argument("--tokens", type=int, default=200, help="built-in model tokens per run")
    p.add_argument("--assistant", default=None, help="measure this assistant or graph id instead")
    p.add_argument("--input", default=None, help="its run input, as JSON")
    p.add_argument("--rates", default="10,100,1000", help="target runs/s, comma-separated")
    p.add_argument("--utilisation", type=float, default=0.7, help="target CPU utilisation")
    p.add_argument("--pg-cores", type=int, default=8, help="cores of the PostgreSQL primary")
    p.add_argument("--json", type=Path, default=None, help="also write the costs here")
    args = p.parse_args(argv)
    try:
        args.rate_list = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        p.error(f"--rates must be numbers separated by commas, got {args.rates!r}")
    if not 0 < args.utilisation <= 1:
        p.error("--utilisation must be in (0, 1]")
    if args.input is not None:
        try:
            json.loads(args.input)
        except ValueError as exc:
            p.error(f"--input is not JSON: {exc}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def body() -> None:
        costs = on_cluster("capacity", lambda urls, roots, s: measure(urls, roots, s, args))
        print(
            f"threadrun capacity model: {WEBS} web processes, 1 runs worker, {os.cpu_count()} CPUs"
        )
        print()
        print(report(costs, args.rate_list, args.utilisation, args.pg_cores))
        if args.json is not None:
            args.json.write_text(json.dumps(asdict(costs), indent=2) + "\n")

    return run_bench("capacity", body)


if __name__ == "__main__":
    sys.exit(main())
