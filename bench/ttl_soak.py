"""Thread expiry under load: PostgreSQL stops growing once threads expire as fast as they come.

Run with `.venv/bin/python -m bench.ttl_soak [--runs 10000] [--rate 20] [--ttl 2]
[--sample 15]` (not part of `make bench`: it takes `runs / rate + ttl + 2` minutes). It
starts one web process, one runs worker and the scheduler on a private database and Redis
prefix, serving the lead agent from a langgraph.json with `checkpointer.ttl`
(`default_ttl` = `--ttl` minutes, a sweep every minute), then starts `--rate` runs a second,
each on a new thread (`if_not_exists=create`, so each thread gets the default TTL) and waits
for every one, and every `--sample` seconds prints the live rows and the on-disk size of the
tables a thread's data lives in. Without expiry both grow with every run; with it the rows
level off at about `rate x (ttl + sweep interval)` threads' worth and the size with them
(autovacuum lets PostgreSQL reuse the space of deleted rows). The raw baseline printed
beside it is the size of those tables right after the migrations (the empty schema).

A server with autovacuum off (`SHOW autovacuum`) never reuses that space, whatever deletes
it: there the bench runs a plain `VACUUM` of the tables at each sample, what autovacuum
would do, and says so (`--no-vacuum` to see the growth without it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg

from bench.chaos import bench_cluster, log, table
from bench.scale import sandboxed
from bench.system_cpu import run_bench
from shared.settings import PROJECT_ROOT, Settings

TABLES = (
    "threads",
    "runs",
    "run_events",
    "thread_heads",
    "checkpoints",
    "checkpoint_writes",
    "checkpoint_blobs",
    "webhook_deliveries",
)
"""Where a thread's data lives (checkpoints are LangGraph's tables)."""


def project(folder: Path, ttl_minutes: float) -> Path:
    """The lead agent with a default thread TTL and a sweep every minute."""
    lead = PROJECT_ROOT / "shared" / "agent" / "lead_agent.py"
    config = {
        "graphs": {"lead_agent": f"{lead}:graph"},
        "checkpointer": {"ttl": {"default_ttl": ttl_minutes, "sweep_interval_minutes": 1}},
    }
    path = folder / "langgraph.json"
    path.write_text(json.dumps(config))
    return path


def sizes(dsn: str) -> tuple[int, int]:
    """(live rows, bytes on disk) of TABLES."""
    rows = total = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in TABLES:
            found = conn.execute(
                "SELECT n_live_tup, pg_total_relation_size(relid) FROM pg_stat_user_tables"
                " WHERE relname = %s",
                (name,),
            ).fetchone()
            if found is not None:
                rows += int(found[0])
                total += int(found[1])
    return rows, total


def soak(url: str, dsn: str, args: argparse.Namespace) -> tuple[list[list[str]], bool]:
    """Run the load, sample the sizes; the table rows, and whether the bench vacuumed."""
    body = {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": "hello"}]},
        "config": {"configurable": {"tokens": 20}},
        "if_not_exists": "create",
    }
    done = failed = 0
    lock = threading.Lock()
    client = httpx.Client(base_url=url, timeout=120)

    def one(_: int) -> None:
        nonlocal done, failed
        res = client.post(f"/threads/{uuid.uuid4()}/runs/wait", json=body)
        with lock:
            done += 1
            failed += res.status_code != 200

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    vacuum = bool(row and row[0] == "off" and args.vacuum)
    if vacuum:
        log("ttl_soak: autovacuum is off on this server: VACUUM at each sample")
    base_rows, base_bytes = sizes(dsn)
    rows: list[list[str]] = [["0", "0", str(base_rows), f"{base_bytes / 1e6:.1f}", "schema"]]
    started = time.monotonic()
    next_sample = started + args.sample
    with ThreadPoolExecutor(max(4, args.rate * 2)) as pool:
        for i in range(args.runs):
            pool.submit(one, i)
            due = started + (i + 1) / args.rate
            while time.monotonic() < due:
                time.sleep(min(0.05, max(0.0, due - time.monotonic())))
                if time.monotonic() >= next_sample:
                    next_sample += args.sample
                    rows.append(sample(dsn, started, done, vacuum))
        # the runs end, then the last threads expire: a few more samples
        tail_until = time.monotonic() + (args.ttl + 2) * 60
        while time.monotonic() < tail_until:
            time.sleep(args.sample)
            rows.append(sample(dsn, started, done, vacuum))
    client.close()
    log(f"ttl_soak: {done} runs, {failed} not 200")
    return rows, vacuum


def sample(dsn: str, started: float, done: int, vacuum: bool) -> list[str]:
    if vacuum:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"VACUUM {', '.join(TABLES)}")
    live, total = sizes(dsn)
    row = [f"{time.monotonic() - started:.0f}", str(done), str(live), f"{total / 1e6:.1f}", ""]
    log(f"ttl_soak: t={row[0]}s runs={row[1]} live rows={row[2]} MB={row[3]}")
    return row


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.ttl_soak", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--rate", type=int, default=20, help="runs started per second")
    p.add_argument("--ttl", type=float, default=2.0, help="checkpointer.ttl.default_ttl, minutes")
    p.add_argument("--sample", type=float, default=15.0, help="seconds between samples")
    p.add_argument(
        "--no-vacuum",
        dest="vacuum",
        action="store_false",
        help="never VACUUM, even where autovacuum is off",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def body() -> None:
        workdir = Path(tempfile.mkdtemp(prefix="threadrun-ttl-soak-"))
        config = project(workdir, args.ttl)
        with sandboxed(Settings()) as (sandbox, settings):
            settings = settings.model_copy(update={"config": config})
            cluster = bench_cluster(settings, workdir)
            cluster.env["THREADRUN_CONFIG"] = str(config)
            try:
                url = cluster.start_web()
                cluster.start_worker("runs", settings.worker_concurrency, timeout=90)
                cluster.start_scheduler()
                rows, vacuumed = soak(url, settings.database_url.get_secret_value(), args)
            finally:
                cluster.stop()
        head = ["t (s)", "runs done", "live rows", "MB on disk", ""]
        print(
            f"ttl_soak: {args.runs} runs at {args.rate}/s, default_ttl {args.ttl} min,"
            " sweep every 1 min"
            + (", VACUUM at each sample (autovacuum is off on this server)" if vacuumed else "")
            + "\n"
            + table(head, rows)
        )

    return run_bench("ttl_soak", body)


if __name__ == "__main__":
    sys.exit(main())
