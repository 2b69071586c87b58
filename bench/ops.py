"""Cost of observability: task events on dispatch, the metric hooks, a /metrics scrape and
the ops overview, each beside a raw baseline measured in the same run.

    .venv/bin/python -m bench.ops --n 200

Private database and Redis prefix as in bench/internals.py (removed at the end). No worker
is running, so the Celery `inspect` broadcast of the scrape waits its whole timeout; the
table shows the scrape with the worker answers cached (as between two scrapes within
`ops_inspect_cache_s`) and the broadcast on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import redis

from bench.internals import Row, Sandbox, Stats, format_table, interleave
from shared import metrics
from shared.db import make_pool
from shared.ops.collector import OpsCollector
from shared.ops.store import OpsStore
from shared.redis_keys import Keys
from shared.runs.taskqueue import RUNS_QUEUE, Dispatcher, make_celery
from shared.settings import Settings


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


async def run(settings: Settings, n: int) -> list[Row]:
    """Every stage; returns the table rows."""
    client = redis.Redis.from_url(settings.redis_url)
    pool = make_pool(settings, name="bench-ops", max_size=4)
    rows: list[Row] = []
    on = make_celery(settings.model_copy(update={"task_events": True}))
    off = make_celery(settings.model_copy(update={"task_events": False}))
    d_on, d_off = Dispatcher.of(settings, client, on), Dispatcher.of(settings, client, off)
    queue_key = Keys(settings.redis_prefix).celery_queue(RUNS_QUEUE)
    raw_key = f"{settings.redis_prefix}bench:lpush"
    d_on.dispatch_run(str(uuid.uuid4()))
    payload = client.lindex(queue_key, 0) or b"x" * 950

    async def events_on(_: int) -> float:
        t0 = time.perf_counter()
        d_on.dispatch_run(str(uuid.uuid4()))
        return _ms(t0)

    async def events_off(_: int) -> float:
        t0 = time.perf_counter()
        d_off.dispatch_run(str(uuid.uuid4()))
        return _ms(t0)

    async def lpush(_: int) -> float:
        t0 = time.perf_counter()
        client.lpush(raw_key, payload)
        return _ms(t0)

    s_on, s_off, s_raw = await interleave(n, [events_on, events_off, lpush])
    base = f"LPUSH {len(payload)} B"
    rows.append(Row("dispatch, task events on", Stats.of(s_on), base, Stats.of(s_raw)))
    rows.append(Row("dispatch, task events off", Stats.of(s_off), base, Stats.of(s_raw)))
    client.delete(queue_key, raw_key)

    async def hook(_: int) -> float:
        t0 = time.perf_counter()
        metrics.run_started()
        metrics.fenced_write("stream")
        return _ms(t0)

    async def incr(_: int) -> float:
        t0 = time.perf_counter()
        client.incr(raw_key)
        return _ms(t0)

    s_hook, s_incr = await interleave(n, [hook, incr])
    rows.append(Row("2 metric hooks (mmap)", Stats.of(s_hook), "INCR", Stats.of(s_incr)))

    collector = OpsCollector(settings, OpsStore(pool), client, on)
    t0 = time.perf_counter()
    collector.inspector.workers()  # nobody answers: the full timeout
    inspect_ms = _ms(t0)
    collector.inspector._cache_s = 3600.0  # keep that (empty) answer for the timed rows

    async def scrape(_: int) -> float:
        t0 = time.perf_counter()
        metrics.render(metrics.OpsGauges(collector.figures))
        return _ms(t0)

    async def overview(_: int) -> float:
        t0 = time.perf_counter()
        collector.overview()
        return _ms(t0)

    async def raw_round_trips(_: int) -> float:
        t0 = time.perf_counter()
        client.ping()
        with pool.connection() as conn:
            conn.execute("SELECT 1")
        return _ms(t0)

    s_scrape, s_over, s_rt = await interleave(n, [scrape, overview, raw_round_trips])
    rt = "PING + SELECT 1"
    rows.append(Row("/metrics (inspect cached)", Stats.of(s_scrape), rt, Stats.of(s_rt)))
    rows.append(Row("ops overview (cached)", Stats.of(s_over), rt, Stats.of(s_rt)))
    rows.append(Row("inspect broadcast, 0 workers", Stats.of([inspect_ms]), rt, Stats.of(s_rt)))
    client.delete(raw_key)
    on.close()
    off.close()
    pool.close()
    client.close()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run in a sandbox, print the table, clean up."""
    p = argparse.ArgumentParser(prog="python -m bench.ops", description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200, help="timed iterations per stage")
    args = p.parse_args(argv)
    sandbox = Sandbox(Settings())
    try:
        settings = sandbox.create()
        with tempfile.TemporaryDirectory() as tmp:
            metrics.configure(settings.model_copy(update={"metrics_dir": Path(tmp)}))
            rows = asyncio.run(run(settings, args.n))
        print(f"threadrun observability costs, n={args.n}, times in ms")
        print(format_table(rows))
    finally:
        sandbox.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
