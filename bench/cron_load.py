"""Noisy neighbours: does one user's chat stay fast while 20 others fire crons at slow webhooks?

Run with `.venv/bin/python -m bench.cron_load [--users 20] [--crons 50] [--runs 60]
[--concurrency 10] [--slow-s 15] [--every-s 10] [--together]`. It starts real processes (a
web process; a runs worker and a background worker at a lower OS priority, as `make run`
does, or with `--together` one worker for both queues; a webhooks worker; the cron
scheduler) on a private database and Redis prefix (Sandbox), and a local receiver on
127.0.0.1 (THREADRUN_WEBHOOK_ALLOW), all removed at the end.

1. Quiet: user `chat` streams `--runs` runs of the built-in model (`messages-tuple`, 20
   tokens) from `--concurrency` client threads, and more until `--settle-s` have passed,
   each with a webhook to the receiver's fast path: TTFT (request to the first token event)
   and webhook latency (the run's `ended_at`, PostgreSQL's clock, to the receipt) per run.
2. Loaded: `--users` other users make `--crons` crons each, firing every `--every-s`
   seconds (a six-field schedule; THREADRUN_CRON_MIN_INTERVAL_S is lowered to it), each run
   with a webhook to a path that hangs `--slow-s` before answering. Once the first firings
   are in and `--settle-s` more have passed (two periods: every cron fired, the slow
   receiver holds deliveries), the same chat batch again, with more runs until it has
   lasted `--settle-s` too (every cron fires at the same second of its period: a batch
   shorter than a period may miss the burst).

The table gives p50/p90 of both phases and the loaded/quiet ratio of the p50s (and how
long the chat's runs waited for a worker slot, `started_at - created_at`); the
per-user run limits (THREADRUN_MAX_ACTIVE_RUNS), fair dispatch and the background queue
(shared/runs/priority.py, workers/background_share.py) and the webhook fairness gate
(shared/webhooks/fairness.py) are what should hold the ratio down. Below it, the firings by
outcome (`admitted`, `limited`, ...), the slow deliveries seen, and the load during the
loaded batch itself (firings and slow deliveries per second), so the load is on record.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx
import orjson
import psycopg

from bench.chaos import table
from bench.first_token import stream_timed
from bench.webhooks import Receiver
from bench.webhooks import q as percentile
from shared.runs.taskqueue import BACKGROUND_QUEUE, RUNS_QUEUE
from shared.settings import Settings
from shared.tools.testing import Cluster, Sandbox, cluster_env, wait_for

CHAT_TOKENS = 20


def chat_batch(
    base: str,
    key: str,
    rec: Receiver,
    phase: str,
    runs: int,
    concurrency: int,
    min_s: float = 0.0,
) -> tuple[list[float], list[float]]:
    """TTFTs (ms) and webhook latencies (ms) of `runs` streamed runs at `concurrency`, and
    more until `min_s` seconds have passed (the loaded batch spans whole cron periods:
    every cron fires at the same second of its period)."""
    client = httpx.Client(base_url=base, headers={"x-api-key": key}, timeout=120)

    def one(i: int) -> tuple[float, str]:
        path = f"/chat/{phase}/{i}"
        body = {
            "assistant_id": "lead_agent",
            "input": {"messages": [{"role": "user", "content": f"hello {phase} {i}"}]},
            "stream_mode": ["messages-tuple"],
            "config": {"configurable": {"tokens": CHAT_TOKENS, "token_delay_ms": 0}},
            "webhook": rec.url(path),
        }
        return stream_timed(client, body, f"chat run {i}").ttft_ms, path

    deadline = time.monotonic() + min_s
    counter = itertools.count()

    def client_thread() -> list[tuple[float, str]]:
        done = []
        while (i := next(counter)) < runs or time.monotonic() < deadline:
            done.append(one(i))
        return done

    try:
        with ThreadPoolExecutor(concurrency) as pool:
            threads = [pool.submit(client_thread) for _ in range(concurrency)]
            results = [r for t in threads for r in t.result()]
    finally:
        client.close()
    hooks: list[float] = []
    for _, path in results:
        wait_for(lambda p=path: p in rec.got, timeout=120, what=f"the webhook of {path}")
        at, raw = rec.got[path]
        ended = dt.datetime.fromisoformat(orjson.loads(raw)["ended_at"]).timestamp()
        hooks.append((at - ended) * 1000)
    return [t for t, _ in results], hooks


def make_crons(base: str, keys: list[str], crons: int, every_s: int, slow: Receiver) -> None:
    """`crons` crons per user key, every `every_s` seconds, webhooks to the slow path."""

    def for_user(key: str) -> None:
        with httpx.Client(base_url=base, headers={"x-api-key": key}, timeout=60) as c:
            for j in range(crons):
                c.post(
                    "/runs/crons",
                    json={
                        "assistant_id": "lead_agent",
                        "schedule": f"* * * * * */{every_s}",
                        "input": {"messages": [{"role": "user", "content": f"cron {j}"}]},
                        "config": {"configurable": {"tokens": 4}},
                        "webhook": slow.url(f"/slow/{key}/{j}"),
                    },
                ).raise_for_status()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(for_user, keys))


def firings(dsn: str) -> dict[str, int]:
    """Firings by outcome; one failed firing's error is printed (a bench that only fails
    measures nothing)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT outcome, count(*) FROM cron_firings GROUP BY 1").fetchall()
        error = conn.execute(
            "SELECT error FROM cron_firings WHERE outcome = 'failed' LIMIT 1"
        ).fetchone()
    if error is not None:
        print(f"bench.cron_load: a failed firing: {error[0]}", file=sys.stderr, flush=True)
    return {str(o): int(n) for o, n in rows}


def db_now(dsn: str) -> dt.datetime:
    """PostgreSQL's clock (the runs' timestamps are on it)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def queue_waits(dsn: str, since: dt.datetime) -> list[float]:
    """How long (ms) each of the chat user's runs created since `since` waited for a worker
    slot: its `started_at` minus its `created_at`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM r.started_at - r.created_at) * 1000 FROM runs r"
            " JOIN threads t USING (thread_id) WHERE t.owner = 'chat' AND r.created_at >= %s"
            " AND r.started_at IS NOT NULL",
            (since,),
        ).fetchall()
    return [float(w) for (w,) in rows]


def background_firings(dsn: str, since: dt.datetime, until: dt.datetime) -> int:
    """The firings recorded in [since, until) (each admitted one is a run: the limits keep
    at most `max_active_runs` of a user's waiting or running)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM cron_firings WHERE fired_at >= %s AND fired_at < %s",
            (since, until),
        ).fetchone()
    assert row is not None
    return int(row[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--users", type=int, default=20, help="users that fire crons")
    parser.add_argument("--crons", type=int, default=50, help="crons per such user")
    parser.add_argument("--runs", type=int, default=60, help="chat runs per phase")
    parser.add_argument("--concurrency", type=int, default=10, help="chat client threads")
    parser.add_argument("--slow-s", type=float, default=15.0, help="the slow receiver's hang")
    parser.add_argument("--every-s", type=int, default=10, help="cron period, seconds")
    parser.add_argument(
        "--together",
        action="store_true",
        help="one runs worker for both queues (THREADRUN_BACKGROUND_WORKERS=0) instead of a"
        " background worker of its own at THREADRUN_BACKGROUND_NICE",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=None,
        help="how long the crons fire before the loaded batch, and the least each batch lasts"
        " (default: two periods: every cron fired, the slow receiver holds deliveries)",
    )
    args = parser.parse_args()
    users = [f"u{i:02d}" for i in range(args.users)]
    api_keys = ",".join([f"key-{u}:{u}" for u in users] + ["key-chat:chat"])
    sandbox = Sandbox(Settings())
    rec = Receiver()
    # The slow receivers get an address of their own: a slow third-party endpoint is another
    # host than the chat user's (the delivery gate caps attempts per host).
    slow = Receiver(host="127.0.0.2", slow_s=args.slow_s)
    try:
        settings = sandbox.create()
        print(
            f"bench.cron_load: sandbox {sandbox.db_name} {sandbox.prefix}",
            file=sys.stderr,
            flush=True,
        )
        with TemporaryDirectory(prefix="bench-cron-load-") as tmp:
            env = cluster_env(
                settings,
                {
                    "THREADRUN_DATA_DIR": str(Path(tmp) / "data"),
                    "THREADRUN_API_KEYS": api_keys,
                    "THREADRUN_RUNS_PER_MINUTE": "100000",
                    "THREADRUN_WEBHOOK_ALLOW": "127.0.0.1,127.0.0.2",
                    "THREADRUN_WEBHOOK_SECRET": "bench",
                    "THREADRUN_CRON_MIN_INTERVAL_S": str(args.every_s),
                    "THREADRUN_CRON_TICK_S": "1",
                },
            )
            with Cluster(settings, env, Path(tmp)) as c:
                c.start_web()
                if args.together:
                    c.start_worker("runs")
                else:  # as `make run` starts them (shared/tools/supervisor.py)
                    c.start_worker("runs", queues=RUNS_QUEUE)
                    c.start_worker(
                        "background",
                        queues=BACKGROUND_QUEUE,
                        env={
                            "THREADRUN_PROCESS_NICE": str(settings.background_nice),
                            "THREADRUN_WORKER_BACKGROUND_SHARE": "1",
                        },
                    )
                c.start_webhooks_worker()
                # At the background priority unless --together (as `make run` starts it).
                nice = "0" if args.together else str(settings.background_nice)
                c.start_scheduler(env={"THREADRUN_PROCESS_NICE": nice})
                print("bench.cron_load: quiet phase", file=sys.stderr, flush=True)
                chat_batch(c.url, "key-chat", rec, "warm", 10, 5)
                since = db_now(settings.dsn)
                settle = args.every_s * 2 if args.settle_s is None else args.settle_s
                # As long as the loaded batch: the two p50s then come from as many runs.
                quiet = chat_batch(
                    c.url, "key-chat", rec, "quiet", args.runs, args.concurrency, settle
                )
                quiet_waits = queue_waits(settings.dsn, since)
                print("bench.cron_load: making crons", file=sys.stderr, flush=True)
                make_crons(c.url, [f"key-{u}" for u in users], args.crons, args.every_s, slow)
                wait_for(
                    lambda: sum(firings(settings.dsn).values()) > 0,
                    timeout=args.every_s * 3 + 30,
                    what="the first cron firings",
                )
                time.sleep(settle)
                print("bench.cron_load: loaded phase", file=sys.stderr, flush=True)
                since = db_now(settings.dsn)
                slow_before = slow.slow_seen
                loaded = chat_batch(
                    c.url, "key-chat", rec, "loaded", args.runs, args.concurrency, settle
                )
                loaded_waits = queue_waits(settings.dsn, since)
                until = db_now(settings.dsn)
                window = (until - since).total_seconds()
                fired_in = background_firings(settings.dsn, since, until)
                slow_in = slow.slow_seen - slow_before
                fired = firings(settings.dsn)
        rows = []
        for name, q, ld in (
            ("chat TTFT", quiet[0], loaded[0]),
            ("chat webhook", quiet[1], loaded[1]),
            ("chat queue wait", quiet_waits, loaded_waits),
        ):
            rows.append(
                [
                    name,
                    f"{statistics.median(q):.1f} / {percentile(q, 90):.1f}",
                    f"{statistics.median(ld):.1f} / {percentile(ld, 90):.1f}",
                    f"{statistics.median(ld) / statistics.median(q):.2f}x",
                ]
            )
        print(
            f"cron_load: {args.users} users x {args.crons} crons every {args.every_s} s, "
            f"{'one worker for both queues' if args.together else 'a background worker'} "
            f"(webhooks hang {args.slow_s:g} s), chat {args.runs} runs at C={args.concurrency}\n"
            + table(["ms", "quiet p50 / p90", "loaded p50 / p90", "loaded/quiet p50"], rows)
            + "\nfirings by outcome: "
            + ", ".join(f"{k} {v}" for k, v in sorted(fired.items()))
            + f"; slow webhook deliveries received: {slow.slow_seen}"
            + f"\nduring the loaded batch ({window:.1f} s, after {settle:g} s of firing):"
            f" {fired_in / window:.0f} firings/s, {slow_in / window:.1f} slow deliveries/s"
        )
    finally:
        rec.close()
        slow.close()
        sandbox.destroy()


if __name__ == "__main__":
    main()
