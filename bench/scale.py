"""Scale-out benchmark: run throughput with 1, 2 and 3 runs workers on one machine.

Run with `.venv/bin/python -m bench.scale [--workers 1,2,3] [--runs 150] [--tokens 40]
[--json PATH]` (or `make scale-bench`). It starts two gunicorn web processes on a private
database `threadrun_scale_<hex>` and Redis prefix `trscale:<hex>:` (shared.tools.testing's
Sandbox), then for each worker count: starts that many Celery runs workers, warms
them up, admits `--runs` background runs (one per thread, alternating between the web
processes, from 16 client threads) and measures until the last one has ended. Then it stops
those workers. At the end it stops every process it started and drops exactly its database
and keys, also on Ctrl-C, SIGTERM or a failure.

runs/s = runs / (last ended_at - first created_at), server-side timestamps; events/s = the
events in those runs' Redis Streams / the same window. Beside each phase, in the same run, the
raw baselines: XADD pipelined 100 per round trip on one connection, and one-row INSERT
transactions on 8 connections. `cpu busy` is the whole machine (/proc/stat) during the
window, `ours` the share of it used by our web and worker processes, `cpu ms/run` their CPU
time per run.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis
from psycopg.rows import dict_row

from bench.chaos import bench_cluster, log, table
from bench.internals import _raise_interrupt, signals_ignored
from shared.redis_keys import Keys
from shared.settings import Settings
from shared.tools.testing import Cluster, Sandbox

CLIENTS = 16
WEBS = 2
BASELINE_S = 1.5
PG_CONNS = 8
XADD_BATCH = 100
CLK_TCK = os.sysconf("SC_CLK_TCK")
WORKER_NUMBERS = itertools.count(1)
"""Worker names stay unique across phases (each has its own log file)."""


# --- CPU accounting -----------------------------------------------------------------------------------
def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot (/proc/stat)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def tree_cpu_s(roots: Sequence[int]) -> float:
    """CPU seconds (user + system) of the processes `roots` and all their descendants."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                rest = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        parent[pid] = int(rest[1])
        ticks[pid] = int(rest[11]) + int(rest[12])
    wanted = set(roots)
    changed = True
    while changed:
        changed = False
        for pid, ppid in parent.items():
            if ppid in wanted and pid not in wanted:
                wanted.add(pid)
                changed = True
    return sum(ticks.get(p, 0) for p in wanted) / CLK_TCK


# --- baselines ----------------------------------------------------------------------------------------
def raw_xadd_rate(client: redis.Redis, prefix: str, seconds: float) -> float:
    """Events/s of XADD pipelined XADD_BATCH per round trip on one connection."""
    key = f"{prefix}bench:xadd"
    payload = {"event": "messages", "data": "x" * 200}
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pipe = client.pipeline(transaction=False)
        for _ in range(XADD_BATCH):
            pipe.xadd(key, payload, maxlen=1024, approximate=True)  # type: ignore[arg-type]
        pipe.execute()
        n += XADD_BATCH
    rate = n / (time.perf_counter() - t0)
    client.delete(key)
    return rate


def raw_insert_rate(dsn: str, seconds: float) -> float:
    """Committed one-row INSERT transactions/s from PG_CONNS connections at once."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (id bigserial PRIMARY KEY, body jsonb)")
    counts = [0] * PG_CONNS
    stop = time.perf_counter() + seconds

    def loop(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while time.perf_counter() < stop:
                conn.execute("INSERT INTO bench_raw (body) VALUES (%s::jsonb)", ('{"k": 1}',))
                counts[i] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(PG_CONNS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


# --- one phase ----------------------------------------------------------------------------------------
@dataclass
class Phase:
    """The figures of one worker count."""

    workers: int
    runs: int
    window_s: float
    runs_per_s: float
    admit_per_s: float
    events: int
    events_per_s: float
    cpu_busy: float
    cpu_ours: float
    cpu_ms_per_run: float
    xadd_per_s: float
    insert_per_s: float
    failed: int


def run_body(n: int, tokens: int) -> dict[str, Any]:
    return {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": f"scale {n}"}]},
        "stream_mode": ["messages-tuple", "values"],
        "config": {"configurable": {"tokens": tokens, "token_delay_ms": 0}},
    }


def admit(urls: list[str], n: int, tokens: int) -> list[str]:
    """Create `n` threads with one background run each, alternating web processes."""
    clients = [httpx.Client(base_url=u, timeout=60) for u in urls]
    try:

        def one(i: int) -> str:
            cl = clients[i % len(clients)]
            tid = cl.post("/threads", json={}).raise_for_status().json()["thread_id"]
            res = cl.post(f"/threads/{tid}/runs", json=run_body(i, tokens)).raise_for_status()
            return str(res.json()["run_id"])

        with ThreadPoolExecutor(CLIENTS) as pool:
            return list(pool.map(one, range(n)))
    finally:
        for cl in clients:
            cl.close()


def sql(dsn: str, query: str, params: Any = ()) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(query, params).fetchall()


def wait_done(dsn: str, run_ids: list[str], timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        left = sql(
            dsn,
            "SELECT count(*) AS n FROM runs WHERE run_id = ANY(%s::uuid[]) "
            "AND status IN ('pending', 'running')",
            (run_ids,),
        )[0]["n"]
        if left == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"runs still inflight after {timeout:.0f} s")


def measure(
    c: Cluster, workers: int, runs: int, tokens: int, concurrency: int, rclient: redis.Redis
) -> Phase:
    """Start `workers` runs workers, warm up, time `runs` runs, stop the workers."""
    s = c.settings
    names = [f"worker{next(WORKER_NUMBERS)}" for _ in range(workers)]
    with ThreadPoolExecutor(workers) as boot:
        procs = list(boot.map(lambda name: c.start_worker(name, concurrency, timeout=90), names))
    try:
        warm = admit(c.urls, 4 * workers, tokens)
        wait_done(s.dsn, warm, 120)
        xadd = raw_xadd_rate(rclient, s.redis_prefix, BASELINE_S)
        insert = raw_insert_rate(s.dsn, BASELINE_S)
        roots = [p.popen.pid for p in c.procs if p.alive()]
        cpu0, m0, t0 = tree_cpu_s(roots), machine_cpu(), time.monotonic()
        ids = admit(c.urls, runs, tokens)
        wait_done(s.dsn, ids, 300)
        cpu1, m1, t1 = tree_cpu_s(roots), machine_cpu(), time.monotonic()
        row = sql(
            s.dsn,
            "SELECT extract(epoch FROM max(ended_at) - min(created_at)) AS window_s, "
            "extract(epoch FROM max(created_at) - min(created_at)) AS admit_s, "
            "count(*) FILTER (WHERE status <> 'success') AS failed "
            "FROM runs WHERE run_id = ANY(%s::uuid[])",
            (ids,),
        )[0]
        keys = Keys(s.redis_prefix)
        pipe = rclient.pipeline(transaction=False)
        for rid in ids:
            pipe.xlen(keys.stream(rid))
        events = int(sum(pipe.execute()))
        window = float(row["window_s"])
        busy = (m1[0] - m0[0]) / max(1, m1[1] - m0[1])
        return Phase(
            workers=workers,
            runs=runs,
            window_s=round(window, 2),
            runs_per_s=runs / window,
            admit_per_s=runs / max(float(row["admit_s"]), 1e-3),
            events=events,
            events_per_s=events / window,
            cpu_busy=busy,
            cpu_ours=(cpu1 - cpu0) / ((t1 - t0) * len(os.sched_getaffinity(0))),
            cpu_ms_per_run=1000 * (cpu1 - cpu0) / runs,
            xadd_per_s=xadd,
            insert_per_s=insert,
            failed=int(row["failed"]),
        )
    finally:
        c.stop(procs)


# --- report ---------------------------------------------------------------------------------------------
def report(phases: list[Phase], cpus: int) -> str:
    base = phases[0]
    rows = [
        (
            str(p.workers),
            f"{p.runs_per_s:,.1f}",
            f"{p.runs_per_s / base.runs_per_s:.2f}x",
            f"{p.admit_per_s:,.0f}",
            f"{p.events_per_s:,.0f}",
            f"{p.events_per_s / base.events_per_s:.2f}x",
            f"{p.xadd_per_s:,.0f}",
            f"{p.events_per_s / p.xadd_per_s:.1%}",
            f"{p.insert_per_s:,.0f}",
            f"{p.insert_per_s / p.runs_per_s:,.0f}",
            f"{p.cpu_busy:.0%}",
            f"{p.cpu_ours:.0%}",
            f"{p.cpu_ms_per_run:,.0f}",
            str(p.failed),
        )
        for p in phases
    ]
    header = (
        "workers",
        "runs/s",
        "vs 1",
        "admitted/s",
        "events/s",
        "vs 1",
        "raw XADD/s",
        "ours/XADD",
        "raw INSERT tx/s",
        "INSERTs per our run",
        "cpu busy",
        "ours",
        "cpu ms/run",
        "failed",
    )
    out = [table(header, rows), ""]
    best = max(phases, key=lambda p: p.runs_per_s)
    flat = next(
        (p for prev, p in itertools.pairwise(phases) if p.runs_per_s < 1.1 * prev.runs_per_s),
        None,
    )
    if flat is None:
        out.append(f"Throughput still grows at {phases[-1].workers} workers.")
    else:
        out.append(
            f"Throughput flattens at {flat.workers} workers (best {best.runs_per_s:.1f} runs/s "
            f"with {best.workers})."
        )
    last = phases[-1]
    out.append(
        f"Why: everything (web, workers, Redis, PostgreSQL, this client and whatever else runs "
        f"here) shares {cpus} CPUs; the machine was {base.cpu_busy:.0%} busy with one worker "
        f"and {last.cpu_busy:.0%} with {last.workers}, our web and worker processes using "
        f"{base.cpu_ours:.0%} and {last.cpu_ours:.0%} of it (the rest: Redis, PostgreSQL, the "
        f"client, other work). A run costs ~{base.cpu_ms_per_run:.0f} ms "
        "of CPU in our web and worker processes, plus Redis and PostgreSQL time, so once the "
        "CPUs are saturated another worker process adds contention, not capacity. Redis and "
        f"PostgreSQL are not the limit: the runs' events are {last.events_per_s / last.xadd_per_s:.1%} "
        "of the raw XADD rate measured beside them. More workers pay off with more cores or "
        "machines."
    )
    return "\n".join(out)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    p.add_argument("--workers", default="1,2,3", help="worker counts, comma-separated")
    p.add_argument("--runs", type=int, default=150, help="timed runs per worker count")
    p.add_argument("--tokens", type=int, default=40, help="built-in model tokens per run")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


@contextlib.contextmanager
def sandboxed(base: Settings, kind: str = "scale") -> Iterator[tuple[Sandbox, Settings]]:
    """A private sandbox named by `kind` (`threadrun_<kind>_<hex>`), dropped at the end."""
    sandbox = Sandbox(base, kind)
    try:
        yield sandbox, sandbox.create()
    finally:
        with signals_ignored():
            deleted = sandbox.destroy()
            log(f"{kind}: dropped {sandbox.db_name}, deleted {deleted} keys under {sandbox.prefix}")


def main(argv: Sequence[str] | None = None) -> int:
    """Measure each worker count in a private sandbox, print the table, always clean up."""
    args = parse_args(argv)
    counts = [int(x) for x in args.workers.split(",") if x.strip()]
    if not counts or min(counts) < 1:
        raise SystemExit("--workers: positive integers, e.g. 1,2,3")
    base = Settings()
    workdir = Path(tempfile.mkdtemp(prefix="threadrun-scale-"))
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    started = time.time()
    cpus = len(os.sched_getaffinity(0))
    cluster: Cluster | None = None
    rc = 0
    try:
        with sandboxed(base) as (sandbox, settings):
            log(f"scale: database {sandbox.db_name}, prefix {sandbox.prefix}, logs {workdir}")
            rclient = redis.Redis.from_url(settings.redis_url)
            cluster = bench_cluster(settings, workdir)
            try:
                for _ in range(WEBS):  # the deployment's server model, one process each
                    cluster.start_web()
                phases = []
                for w in counts:
                    log(f"scale: {w} worker(s), {args.runs} runs of {args.tokens} tokens")
                    phases.append(
                        measure(
                            cluster, w, args.runs, args.tokens, base.worker_concurrency, rclient
                        )
                    )
                    log(f"scale:   {asdict(phases[-1])}")
            finally:
                with signals_ignored():
                    cluster.stop()
                rclient.close()
        print(
            f"threadrun scale-out: {WEBS} web processes ({base.web_worker_class}), "
            f"{args.runs} runs x {args.tokens} tokens "
            f"per worker count, worker concurrency {base.worker_concurrency}, {cpus} CPUs, "
            f"{time.time() - started:.0f} s"
        )
        print()
        print(report(phases, cpus))
        if args.json is not None:
            meta = {
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                "python": platform.python_version(),
                "cpus": cpus,
                "webs": WEBS,
                "tokens": args.tokens,
            }
            phase_rows = [asdict(p) for p in phases]
            args.json.write_text(json.dumps({"meta": meta, "phases": phase_rows}, indent=2) + "\n")
    except KeyboardInterrupt:
        log("scale: interrupted")
        rc = 130
    except (RuntimeError, subprocess.SubprocessError, httpx.HTTPError, psycopg.Error) as exc:
        if cluster is not None:
            for p in cluster.procs:
                log(f"--- {p.name} ---\n{p.tail()}")
        log(f"scale: failed: {exc!r}")
        rc = 1
    finally:
        signal.signal(signal.SIGTERM, old_term)
    return rc


if __name__ == "__main__":
    sys.exit(main())
