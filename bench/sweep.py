"""Thread expiry sweep throughput (P6): expired threads removed per second.

Run with `.venv/bin/python -m bench.sweep [--n 1000]` (also part of `make bench`). It uses a
private database and Redis prefix (Sandbox), removed at the end.

Each of the n threads has what a thread that ran has: one ended run with 6 journal rows,
4 checkpoints with 8 writes and 4 blobs, a head copy, one workspace file and 3 Redis keys
(seeded in bulk, SQL and pipelined Redis). Rows:

- the sweep (`ThreadSweeper.sweep`): the advisory lock, the candidate read, then per thread
  a transaction of its own (crons and thread locked, the inflight/webhook check, the
  checkpoints, the Redis keys, the workspace folder, the audit record, the row's cascade);
- baseline: a raw DELETE of the same rows, per thread in a transaction of its own (the
  checkpoint tables, then the thread row with its cascade), measured in the same run on
  a fresh seed; the ratio says what the sweep's safety costs over it;
- a single bulk DELETE of all of it in one transaction (what a sweep that held every lock
  at once would cost): for scale only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
import uuid

import redis

from bench.chaos import table
from shared import workspaces
from shared.db import DictPool, make_pool
from shared.redis_keys import Keys
from shared.retention.policy import SweepPolicy
from shared.retention.removal import ThreadRemover
from shared.retention.sweeper import ThreadSweeper
from shared.runs.store import ExpiryOutcome, RunStore
from shared.settings import Settings
from shared.tools.testing import Sandbox

OWNER = "bench"
LATER = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)

SEED_SQL = """
WITH t AS (
    INSERT INTO threads (thread_id, owner, ttl_strategy, ttl_minutes, expires_at)
    SELECT tid, %(owner)s, 'delete', 1, COALESCE(%(expires_at)s::timestamptz, now())
    FROM unnest(%(ids)s::uuid[]) AS tid
    RETURNING thread_id
), r AS (
    INSERT INTO runs (run_id, thread_id, assistant_id, graph_id, status, multitask_strategy,
                      ended_at)
    SELECT gen_random_uuid(), thread_id, 'lead_agent', 'lead_agent', 'success', 'enqueue', now()
    FROM t RETURNING run_id, thread_id
), e AS (
    INSERT INTO run_events (run_id, seq, thread_id, category, type, payload)
    SELECT run_id, g, thread_id, 'lifecycle', 'x', '{"k": "v"}' FROM r, generate_series(1, 6) g
), h AS (
    INSERT INTO thread_heads (thread_id, checkpoint_id) SELECT thread_id, 'c4' FROM t
), c AS (
    INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, type, checkpoint, metadata)
    SELECT thread_id::text, '', 'c' || g, 'msgpack', '{"v": 1}', '{}'
    FROM t, generate_series(1, 4) g
), w AS (
    INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx,
                                   channel, type, blob)
    SELECT thread_id::text, '', 'c' || g, 'task', i, 'messages', 'msgpack', '\\x00'::bytea
    FROM t, generate_series(1, 4) g, generate_series(0, 1) i
)
INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
SELECT thread_id::text, '', 'messages', g::text, 'msgpack', '\\x00'::bytea
FROM t, generate_series(1, 4) g
"""

RAW_DELETE_SQL = (
    "DELETE FROM checkpoints WHERE thread_id = %(t)s",
    "DELETE FROM checkpoint_writes WHERE thread_id = %(t)s",
    "DELETE FROM checkpoint_blobs WHERE thread_id = %(t)s",
    "DELETE FROM threads WHERE thread_id = %(t)s::uuid",
)
BULK_DELETE_SQL = (
    "DELETE FROM checkpoints WHERE thread_id = ANY(%(ids)s)",
    "DELETE FROM checkpoint_writes WHERE thread_id = ANY(%(ids)s)",
    "DELETE FROM checkpoint_blobs WHERE thread_id = ANY(%(ids)s)",
    "DELETE FROM threads WHERE thread_id = ANY(%(ids)s::uuid[])",
)


def seed(
    s: Settings,
    pool: DictPool,
    r: redis.Redis,
    n: int,
    *,
    owner: str = OWNER,
    expires_at: dt.datetime | None = None,
) -> list[str]:
    """n threads of `owner` with their rows, files and keys, expiring at `expires_at`
    (default: the database's now(), i.e. expired)."""
    ids = [str(uuid.uuid4()) for _ in range(n)]
    with pool.connection() as conn, conn.transaction():
        conn.execute(SEED_SQL, {"owner": owner, "ids": ids, "expires_at": expires_at})
    k = Keys(s.redis_prefix)
    pipe = r.pipeline(transaction=False)
    for tid in ids:
        folder = workspaces.thread_workspace(s.workspace_dir, owner, tid)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "artifact.txt").write_text("x")
        pipe.xadd(k.thread_runs(tid), {"r": "x"})
        pipe.set(k.result(tid), "{}")  # stands in for a run's keys: one key a run
        pipe.set(k.stream_meta(tid), "{}")
    pipe.execute()
    return ids


def left(pool: DictPool) -> int:
    with pool.connection() as conn:
        row = conn.execute("SELECT count(*) AS n FROM checkpoints").fetchone()
        row2 = conn.execute("SELECT count(*) AS n FROM threads").fetchone()
    assert row is not None and row2 is not None
    return int(row["n"]) + int(row2["n"])


def ours(s: Settings, pool: DictPool, r: redis.Redis, n: int) -> float:
    ids = seed(s, pool, r, n)
    remover = ThreadRemover(RunStore(pool), r, Keys(s.redis_prefix), s.workspace_dir)
    sweeper = ThreadSweeper(remover, SweepPolicy(300, n, 2.0, 90))
    t0 = time.perf_counter()
    report = sweeper.sweep(at=LATER)
    wall = time.perf_counter() - t0
    assert report.count(ExpiryOutcome.DELETED) == len(ids) and left(pool) == 0, report
    return wall


def raw(s: Settings, pool: DictPool, r: redis.Redis, n: int) -> float:
    ids = seed(s, pool, r, n)
    t0 = time.perf_counter()
    with pool.connection() as conn:
        for tid in ids:
            with conn.transaction():
                for sql in RAW_DELETE_SQL:
                    conn.execute(sql, {"t": tid})
    wall = time.perf_counter() - t0
    assert left(pool) == 0
    return wall


def bulk(s: Settings, pool: DictPool, r: redis.Redis, n: int) -> float:
    ids = seed(s, pool, r, n)
    t0 = time.perf_counter()
    with pool.connection() as conn, conn.transaction():
        for sql in BULK_DELETE_SQL:
            conn.execute(sql, {"ids": ids})
    wall = time.perf_counter() - t0
    assert left(pool) == 0
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    args = parser.parse_args()
    sandbox = Sandbox(Settings())
    try:
        s = sandbox.create()
        pool = make_pool(s, name="bench-sweep", max_size=4)
        r = redis.Redis.from_url(s.redis_url)
        sweep_s = ours(s, pool, r, args.n)
        raw_s = raw(s, pool, r, args.n)
        bulk_s = bulk(s, pool, r, args.n)
        pool.close()
        head = ["removal", "threads/s", "ms/thread", "vs baseline"]

        def row(name: str, wall: float) -> list[str]:
            return [
                name,
                f"{args.n / wall:,.0f}",
                f"{wall * 1000 / args.n:.2f}",
                f"{wall / raw_s:.1f}x",
            ]

        rows = [
            row("sweep: lock, check, checkpoints, keys, files, audit, cascade", sweep_s),
            row("baseline: raw DELETE of the same rows, a transaction per thread", raw_s),
            row("for scale: one bulk DELETE of all n threads", bulk_s),
        ]
        print(f"sweep: {args.n} expired threads, one sweep (limit {args.n})\n" + table(head, rows))
    finally:
        sandbox.destroy()


if __name__ == "__main__":
    main()
