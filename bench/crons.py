"""Cron firing lag: 1,000 crons due at the same tick, fired by two schedulers at once.

Run with `.venv/bin/python -m bench.crons [--n 1000]` (also part of `make bench`). It uses a
private database and Redis prefix (Sandbox), removed at the end.

Two firers (threads, each with its own pool and `CronManager`, as two scheduler processes
would have) poll every `--poll-ms` and fire what is due, exactly as the scheduler's tick
does (`CronManager.tick`: batches of `cron_batch_size` under FOR UPDATE SKIP LOCKED, the
firing row, the admission, the advance, then the dispatch to Redis). The lag of a firing is
its run's `created_at` minus the tick it fired for; the tick poll interval is excluded (the
firers are already polling when the tick comes), so the rows say what firing costs.

Baseline, measured in the same run the same way: two threads that only do the raw
`INSERT … ON CONFLICT DO NOTHING` of the firing row for each of the n crons at the tick
(one transaction per batch of the same size), lag = the insert's clock_timestamp() - tick.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import threading
import time
import uuid
from collections.abc import Callable

import redis

from bench.chaos import table
from shared.agent.graphs import GraphRegistry
from shared.assistants.manager import AssistantManager
from shared.assistants.store import AssistantStore
from shared.crons.manager import CronManager
from shared.crons.model import CronSpec
from shared.crons.store import CronStore
from shared.db import DictPool, make_pool
from shared.redis_keys import Keys
from shared.runs.manager import RunManager
from shared.runs.model import OnCompletion, RunRequest
from shared.runs.store import RunStore
from shared.runs.taskqueue import Dispatcher
from shared.settings import Settings
from shared.tools.testing import Sandbox

OWNER = "bench"


def manager(s: Settings, pool: DictPool) -> CronManager:
    assistants = AssistantManager(AssistantStore(pool), GraphRegistry.from_config(s.config))
    runs = RunManager(
        RunStore(pool),
        Dispatcher.of(s),
        redis.Redis.from_url(s.redis_url),
        Keys(s.redis_prefix),
        assistants=assistants,
    )
    return CronManager(CronStore(pool), runs, max_per_user=10**6, batch_size=s.cron_batch_size)


def spec() -> CronSpec:
    request = RunRequest(
        thread_id="",
        assistant_id="lead_agent",
        input={"messages": [{"role": "user", "content": "tick"}]},
        create_thread=True,
        on_completion=OnCompletion.KEEP,
    )
    return CronSpec("lead_agent", "* * * * *", request, {}, on_run_completed=OnCompletion.KEEP)


def q(xs: list[float], p: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(p) - 1] if len(xs) > 1 else xs[0]


def two_firers(fire: Callable[[int], None], until: Callable[[], bool]) -> float:
    """Run `fire(i)` in two threads in a loop until `until()`; the wall time."""
    t0 = time.perf_counter()

    def loop(i: int) -> None:
        while not until():
            fire(i)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def ours(s: Settings, n: int, poll_s: float) -> tuple[list[float], float]:
    pools = [make_pool(s, name=f"bench-cron-{i}", max_size=4) for i in range(2)]
    managers = [manager(s, p) for p in pools]
    managers[0]._runs._assistants.ensure_system()  # type: ignore[union-attr]
    ids = [managers[0].create(OWNER, spec()).cron_id for _ in range(n)]
    tick = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=2)
    with pools[0].connection() as conn:
        conn.execute("UPDATE crons SET next_run_at = %s", (tick,))
    while dt.datetime.now(dt.UTC) < tick:
        time.sleep(0.005)

    def fired_all() -> bool:
        with pools[0].connection() as conn:
            row = conn.execute("SELECT count(*) AS k FROM cron_firings").fetchone()
        return row is not None and int(row["k"]) >= n

    def fire(i: int) -> None:
        if managers[i].tick().fired == 0:
            time.sleep(poll_s)

    wall = two_firers(fire, fired_all)
    with pools[0].connection() as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM r.created_at - f.tick_at) * 1000 AS ms,"
            " (SELECT count(*) FROM runs) AS runs"
            " FROM cron_firings f JOIN runs r USING (run_id)"
        ).fetchall()
    assert len(rows) == n == int(rows[0]["runs"]), (len(rows), n)
    assert len(ids) == n
    for p in pools:
        p.close()
    return [float(r["ms"]) for r in rows], wall


def baseline(s: Settings, n: int, batch: int) -> tuple[list[float], float]:
    pool = make_pool(s, name="bench-cron-raw", max_size=4)
    ids = [str(uuid.uuid4()) for _ in range(n)]
    tick = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=2)
    lock = threading.Lock()
    todo = list(ids)
    lags: list[float] = []
    while dt.datetime.now(dt.UTC) < tick:
        time.sleep(0.005)

    def fire(_: int) -> None:
        with lock:
            mine, todo[:] = todo[:batch], todo[batch:]
        with pool.connection() as conn, conn.transaction():
            for cid in mine:
                row = conn.execute(
                    "INSERT INTO cron_firings (cron_id, tick_at, outcome) VALUES (%s, %s, 'raw')"
                    " ON CONFLICT DO NOTHING"
                    " RETURNING extract(epoch FROM clock_timestamp() - tick_at) * 1000 AS ms",
                    (cid, tick),
                ).fetchone()
                assert row is not None
                lags.append(float(row["ms"]))

    wall = two_firers(fire, lambda: not todo)
    pool.close()
    return lags, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--poll-ms", type=float, default=20)
    args = parser.parse_args()
    sandbox = Sandbox(Settings())
    try:
        s = sandbox.create()
        lag, wall = ours(s, args.n, args.poll_ms / 1000)
        with make_pool(s, name="bench-clean", max_size=1) as p, p.connection() as conn:
            conn.execute("DELETE FROM cron_firings")
        base, base_wall = baseline(s, args.n, s.cron_batch_size)
        head = [
            "firing",
            "lag p50 ms",
            "lag p99 ms",
            "lag max ms",
            "all fired in s",
            "p50 vs baseline",
        ]
        rows = [
            [
                "cron firing: firing row + admission + advance + dispatch",
                f"{q(lag, 50):.0f}",
                f"{q(lag, 99):.0f}",
                f"{max(lag):.0f}",
                f"{wall:.2f}",
                f"{q(lag, 50) / q(base, 50):.1f}x",
            ],
            [
                "baseline: raw INSERT … ON CONFLICT of the firing row",
                f"{q(base, 50):.0f}",
                f"{q(base, 99):.0f}",
                f"{max(base):.0f}",
                f"{base_wall:.2f}",
                "1.0x",
            ],
        ]
        print(
            f"crons: {args.n} crons due at one tick, two firers, batches of"
            f" {s.cron_batch_size}\n" + table(head, rows)
        )
    finally:
        sandbox.destroy()


if __name__ == "__main__":
    main()
