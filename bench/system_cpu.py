"""CPU per run of the whole system: our processes, PostgreSQL and Redis, beside raw baselines.

Run with `.venv/bin/python -m bench.system_cpu [--runs 200] [--concurrency 50] [--tokens 200]
[--json PATH]` (part of `make bench`). It starts two web processes and one runs worker (the
`make run` shape) on a private database `threadrun_scale_<hex>` and Redis prefix (shared.tools.testing's
Sandbox), warms up, then streams `--runs` runs of the built-in model (`messages-tuple` and
`values`, one thread each) from `--concurrency` client threads, reading every SSE event, and
measures the CPU time (user + system, /proc) spent meanwhile by:

- web: the web processes; worker: the runs worker (process trees);
- postgres: the backends of the sandbox database (sampled from pg_stat_activity every 0.2 s,
  so a backend that exits keeps its CPU up to its last sample);
- redis: the redis-server process (`INFO server` process_id, when it runs on this machine;
  it is shared, so whatever else uses it at the same time counts too).

Beside them, in the same run, the raw baselines, as the CPU each server spends on them: one
XADD of a 200-byte event pipelined 100 per round trip (Redis µs per XADD) and one committed
one-row INSERT transaction (the PostgreSQL backend's µs per INSERT). A run's Redis and
PostgreSQL CPU divided by them ("XADD-equivalents", "INSERT-equivalents" per run) does not move
with the machine's speed, so a regression in what a run asks of either server shows as a
larger number, and a busy machine shows as a larger raw baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import redis

from bench.chaos import bench_cluster, log, table
from bench.internals import _raise_interrupt, signals_ignored
from bench.scale import sandboxed, tree_cpu_s
from shared.settings import Settings
from shared.tools.testing import Cluster

CLK_TCK = os.sysconf("SC_CLK_TCK")
WEBS = 2
BASELINE_N = 20_000
"""Raw XADDs and INSERTs per baseline: enough CPU ticks (10 ms each) to resolve µs/op."""
XADD_BATCH = 100
PG_SAMPLE_S = 0.2
BENCH_ERRORS = (RuntimeError, subprocess.SubprocessError, httpx.HTTPError, psycopg.Error)
"""What ends a benchmark as failed (a service, a process or a request), not as a crash."""
T = TypeVar("T")


def proc_ticks(pid: int) -> int | None:
    """utime + stime of one process, in clock ticks (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            rest = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(rest[11]) + int(rest[12])


def redis_pid(client: redis.Redis) -> int | None:
    """The redis-server's pid when it runs on this machine (else None: not measured)."""
    pid = int(client.info("server").get("process_id", 0))
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return pid if "redis" in fh.read() else None
    except OSError:
        return None


class BackendCpu:
    """CPU ticks of the PostgreSQL backends of one database, sampled in a thread."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._last: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._own = self._conn.info.backend_pid

    def _sample(self) -> None:
        rows = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall()
        for (pid,) in rows:
            if pid == self._own:
                continue
            ticks = proc_ticks(pid)
            if ticks is None:
                continue
            self._last[pid] = ticks

    def _loop(self) -> None:
        while not self._stop.wait(PG_SAMPLE_S):
            self._sample()

    def __enter__(self) -> BackendCpu:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self._conn.close()

    def seconds(self, baseline: dict[int, int]) -> float:
        """CPU seconds since `baseline` (`snapshot`); a backend started later counts from 0."""
        total = sum(last - baseline.get(pid, 0) for pid, last in self._last.items())
        return total / CLK_TCK

    def snapshot(self) -> dict[int, int]:
        """The ticks of the backends seen so far (a baseline for `seconds`)."""
        return dict(self._last)


# --- baselines ----------------------------------------------------------------------------------------
def raw_xadd_us(client: redis.Redis, pid: int | None, prefix: str) -> float | None:
    """Redis CPU µs per XADD of a 200-byte event, pipelined XADD_BATCH per round trip."""
    if pid is None:
        return None
    key = f"{prefix}bench:xadd"
    payload = {"event": "messages", "data": "x" * 200}
    t0 = proc_ticks(pid) or 0
    for _ in range(BASELINE_N // XADD_BATCH):
        pipe = client.pipeline(transaction=False)
        for _ in range(XADD_BATCH):
            pipe.xadd(key, payload, maxlen=1024, approximate=True)  # type: ignore[arg-type]
        pipe.execute()
    used = ((proc_ticks(pid) or 0) - t0) / CLK_TCK
    client.delete(key)
    return 1e6 * used / BASELINE_N


def raw_insert_us(dsn: str) -> float:
    """PostgreSQL backend CPU µs per committed one-row INSERT transaction."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (id bigserial PRIMARY KEY, body jsonb)")
        backend = conn.info.backend_pid
        t0 = proc_ticks(backend) or 0
        for _ in range(BASELINE_N):
            conn.execute("INSERT INTO bench_raw (body) VALUES (%s::jsonb)", ('{"k": 1}',))
        used = ((proc_ticks(backend) or 0) - t0) / CLK_TCK
        conn.execute("DROP TABLE bench_raw")
    return 1e6 * used / BASELINE_N


# --- the runs -----------------------------------------------------------------------------------------
def run_body(n: int, tokens: int) -> dict[str, Any]:
    return {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": f"cpu {n}"}]},
        "stream_mode": ["messages-tuple", "values"],
        "config": {"configurable": {"tokens": tokens, "token_delay_ms": 0}},
    }


def stream_runs(
    urls: list[str],
    n: int,
    tokens: int,
    concurrency: int,
    body: Callable[[int], dict[str, Any]] | None = None,
) -> tuple[int, int]:
    """Stream `n` runs (one thread each) from `concurrency` client threads, alternating web
    processes; return (events, failed runs). `body(i)` is run i's request (default: the
    built-in model's `run_body`)."""
    make = body or (lambda i: run_body(i, tokens))
    clients = [httpx.Client(base_url=u, timeout=300) for u in urls]
    try:

        def one(i: int) -> tuple[int, bool]:
            cl = clients[i % len(clients)]
            tid = cl.post("/threads", json={}).raise_for_status().json()["thread_id"]
            events, ended_ok = 0, False
            with cl.stream("POST", f"/threads/{tid}/runs/stream", json=make(i)) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        events += 1
                        ended_ok = line != "event: error"
            return events, ended_ok

        with ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(one, range(n)))
    finally:
        for cl in clients:
            cl.close()
    return sum(e for e, _ in results), sum(1 for _, ok in results if not ok)


@dataclass
class Figures:
    """One measurement."""

    runs: int
    concurrency: int
    tokens: int
    wall_s: float
    runs_per_s: float
    events_per_run: float
    events_per_s: float
    failed: int
    web_ms: float
    worker_ms: float
    postgres_ms: float
    redis_ms: float | None
    total_ms: float
    xadd_us: float | None
    insert_us: float


def measure(urls: list[str], roots: dict[str, list[int]], settings: Settings, args: Any) -> Figures:
    rclient = redis.Redis.from_url(settings.redis_url)
    try:
        rpid = redis_pid(rclient)
        stream_runs(urls, 10, args.tokens, 5)  # warm-up: imports, pools, prepared statements
        xadd = raw_xadd_us(rclient, rpid, settings.redis_prefix)
        insert = raw_insert_us(settings.dsn)
        with BackendCpu(settings.dsn) as pg:
            base = pg.snapshot()
            web0, wk0 = tree_cpu_s(roots["web"]), tree_cpu_s(roots["worker"])
            r0 = proc_ticks(rpid) if rpid else None
            t0 = time.monotonic()
            events, failed = stream_runs(urls, args.runs, args.tokens, args.concurrency)
            wall = time.monotonic() - t0
            web1, wk1 = tree_cpu_s(roots["web"]), tree_cpu_s(roots["worker"])
            r1 = proc_ticks(rpid) if rpid else None
        pg_s = pg.seconds(base)
    finally:
        rclient.close()
    per = 1000 / args.runs
    redis_ms = None if r0 is None or r1 is None else (r1 - r0) / CLK_TCK * per
    web_ms, worker_ms, pg_ms = (web1 - web0) * per, (wk1 - wk0) * per, pg_s * per
    return Figures(
        runs=args.runs,
        concurrency=args.concurrency,
        tokens=args.tokens,
        wall_s=round(wall, 2),
        runs_per_s=args.runs / wall,
        events_per_run=events / args.runs,
        events_per_s=events / wall,
        failed=failed,
        web_ms=web_ms,
        worker_ms=worker_ms,
        postgres_ms=pg_ms,
        redis_ms=redis_ms,
        total_ms=web_ms + worker_ms + pg_ms + (redis_ms or 0.0),
        xadd_us=xadd,
        insert_us=insert,
    )


def report(f: Figures) -> str:
    def opt(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    xadd_eq = None if f.redis_ms is None or not f.xadd_us else 1000 * f.redis_ms / f.xadd_us
    insert_eq = 1000 * f.postgres_ms / f.insert_us if f.insert_us else None
    cpu = table(
        ("CPU ms/run", "web", "worker", "postgres", "redis", "all"),
        [
            (
                f"C={f.concurrency}",
                f"{f.web_ms:.1f}",
                f"{f.worker_ms:.1f}",
                f"{f.postgres_ms:.1f}",
                opt(f.redis_ms, ".1f"),
                f"{f.total_ms:.1f}",
            )
        ],
    )
    base = table(
        ("raw baseline (same run)", "server CPU µs/op", "our run costs, in ops"),
        [
            ("Redis XADD (pipelined)", opt(f.xadd_us, ".1f"), opt(xadd_eq, ",.0f")),
            ("PostgreSQL INSERT tx", opt(f.insert_us, ".1f"), opt(insert_eq, ",.0f")),
        ],
    )
    head = (
        f"{f.runs} runs x {f.tokens} tokens at C={f.concurrency}: {f.runs_per_s:.1f} runs/s, "
        f"{f.events_per_run:.0f} events/run, {f.events_per_s:,.0f} events/s, "
        f"{f.failed} failed, {f.wall_s:.1f} s"
    )
    return "\n".join([head, "", cpu, "", base])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.system_cpu", description=__doc__.split("\n")[0]
    )
    p.add_argument("--runs", type=int, default=200, help="timed streamed runs")
    p.add_argument("--concurrency", type=int, default=50, help="client threads")
    p.add_argument("--tokens", type=int, default=200, help="built-in model tokens per run")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def on_cluster(name: str, measure: Callable[[list[str], dict[str, list[int]], Settings], T]) -> T:
    """`measure(urls, roots, settings)` on `WEBS` web processes and one runs worker (the `make
    run` shape) on a private database and Redis prefix; `roots` holds the pids of the "web"
    and "worker" process trees. The processes' logs are printed if it fails; the cluster is
    stopped and the sandbox dropped either way."""
    base = Settings()
    workdir = Path(tempfile.mkdtemp(prefix=f"threadrun-{name}-"))
    with sandboxed(base) as (sandbox, settings):
        log(f"{name}: database {sandbox.db_name}, prefix {sandbox.prefix}, logs {workdir}")
        cluster = bench_cluster(settings, workdir)
        with logged_and_stopped(cluster):
            urls = [cluster.start_web() for _ in range(WEBS)]
            webs = [p.popen.pid for p in cluster.procs if p.alive()]
            worker = cluster.start_worker(name, base.worker_concurrency, timeout=90)
            return measure(urls, {"web": webs, "worker": [worker.popen.pid]}, settings)


@contextlib.contextmanager
def logged_and_stopped(
    cluster: Cluster, errors: tuple[type[BaseException], ...] = BENCH_ERRORS
) -> Iterator[Cluster]:
    """The body on `cluster`: the processes' logs are printed if it fails with one of
    `errors`; the cluster is stopped either way (signals held off while it stops)."""
    try:
        yield cluster
    except errors:
        for p in cluster.procs:
            log(f"--- {p.name} ---\n{p.tail()}")
        raise
    finally:
        with signals_ignored():
            cluster.stop()


def run_bench(name: str, body: Callable[[], None]) -> int:
    """Run a benchmark's `body` with SIGTERM as an interrupt; its exit code (130 when
    interrupted, 1 when a service or a process failed)."""
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        body()
    except KeyboardInterrupt:
        log(f"{name}: interrupted")
        return 130
    except BENCH_ERRORS as exc:
        log(f"{name}: failed: {exc!r}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, old_term)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Measure in a private sandbox, print the tables, always clean up."""
    args = parse_args(argv)

    def body() -> None:
        figures = on_cluster(
            "system_cpu", lambda urls, roots, settings: measure(urls, roots, settings, args)
        )
        print(
            f"threadrun system CPU per run: {WEBS} web processes, 1 runs worker, {os.cpu_count()} CPUs"
        )
        print()
        print(report(figures))
        if args.json is not None:
            args.json.write_text(json.dumps(asdict(figures), indent=2) + "\n")

    return run_bench("system_cpu", body)


if __name__ == "__main__":
    sys.exit(main())
