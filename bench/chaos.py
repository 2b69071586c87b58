"""Chaos benchmark: how long a run is dead after its owner is killed, and admission under contention.

Run with `.venv/bin/python -m bench.chaos [--repeats 3] [--clients 16] [--creates 300]
[--rounds 2] [--json PATH]`. It starts a private cluster (one gunicorn web process and two
Celery runs workers) with the DEFAULT lease settings on a database `threadrun_chaos_<hex>`
(created and migrated on the server of THREADRUN_DATABASE_URL) and the Redis key prefix
`trchaos:<hex>:` on THREADRUN_REDIS_URL, and at the end stops every process it started, drops
exactly that database and deletes exactly those keys, also on Ctrl-C, SIGTERM or a failure.

1. Recovery (L4, L5): a slow run streams; its owner is killed with SIGKILL; we time the kill
   to the first event of the resumed attempt (the `metadata` event with attempt 2) as an SSE
   client receives it, and split that time with the lease's remaining TTL at the kill and the
   run's lifecycle events (requeued, claimed). Repeated `--repeats` times; a replacement worker
   is started after each repeat (not timed).
2. Admission: POST /threads/{id}/runs over HTTP from `--clients` concurrent clients, on ONE
   thread (enqueue: every run queues behind the first) and on MANY threads (one run each),
   beside a raw `INSERT INTO runs` from as many concurrent connections, measured in the same
   run, interleaved in `--rounds` rounds. The workers are stopped for this phase so that run
   execution does not compete with admission for the CPUs (the dispatch messages stay queued
   in Redis under our prefix until the cleanup).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis
from psycopg.rows import dict_row

from bench.internals import _raise_interrupt, percentile, signals_ignored
from shared.redis_keys import Keys
from shared.settings import Settings
from shared.tools.testing import Cluster, Sandbox, cluster_env, iter_sse, open_stream, wait_for

LEASE_ENV = (
    "THREADRUN_LEASE_TTL_S",
    "THREADRUN_LEASE_RENEW_S",
    "THREADRUN_REAPER_INTERVAL_S",
    "THREADRUN_DISPATCH_STALE_S",
    "THREADRUN_CANCEL_POLL_S",
    "THREADRUN_MAX_ATTEMPTS",
)
SLOW_TOKENS = 2000
SLOW_DELAY_MS = 20
"""The victim run: 40 s of tokens, far longer than one recovery; cancelled once measured."""

RAW_INSERT_RUN_SQL = """
INSERT INTO runs (run_id, thread_id, assistant_id, graph_id, status, input, config, kwargs,
                  multitask_strategy)
VALUES (%(run_id)s, %(thread_id)s, 'lead_agent', 'lead_agent', 'pending', %(input)s,
        '{}'::jsonb, '{}'::jsonb, 'enqueue')
"""
INSERT_THREADS_SQL = """
INSERT INTO threads (thread_id, owner) SELECT gen_random_uuid(), %(owner)s FROM generate_series(1, %(n)s)
RETURNING thread_id::text
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the cluster ----------------------------------------------------------------------------------
def bench_cluster(settings: Settings, workdir: Path) -> Cluster:
    """Web and runs-worker processes on the sandbox, with the default lease settings (whatever
    the environment says) and no API keys; every process ours to stop."""
    extra = {"THREADRUN_DATA_DIR": str(workdir / "data"), "THREADRUN_API_KEYS": ""}
    return Cluster(settings, cluster_env(settings, extra, without=LEASE_ENV), workdir)


# --- helpers ----------------------------------------------------------------------------------------
def sql(dsn: str, query: str, params: Any = ()) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(query, params).fetchall()


def run_body(text: str, tokens: int, delay_ms: float = 0, **extra: Any) -> dict[str, Any]:
    return {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": text}]},
        "stream_mode": ["messages-tuple"],
        "config": {"configurable": {"tokens": tokens, "token_delay_ms": delay_ms}},
        **extra,
    }


@dataclass
class Seen:
    """One SSE event as the follower received it."""

    mono: float
    wall: float
    id: str
    event: str
    data: str


class Follower(threading.Thread):
    """Reads a run's SSE stream from the start and timestamps every event on receipt."""

    def __init__(self, url: str, tid: str, run_id: str) -> None:
        super().__init__(name=f"follow-{run_id[:8]}", daemon=True)
        self.url, self.tid, self.run_id = url, tid, run_id
        self.events: queue.SimpleQueue[Seen | None] = queue.SimpleQueue()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with (
                httpx.Client(base_url=self.url, timeout=120) as client,
                open_stream(client, self.tid, self.run_id) as res,
            ):
                for e in iter_sse(res.iter_lines()):
                    self.events.put(Seen(time.monotonic(), time.time(), e.id, e.event, e.text))
                    if e.event in ("end", "gap"):
                        break
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            self.error = exc
        finally:
            self.events.put(None)

    def until(self, accept: Callable[[Seen], bool], timeout: float) -> Seen:
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"no matching event within {timeout} s (run {self.run_id})")
            try:
                item = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if item is None:
                raise RuntimeError(f"stream of run {self.run_id} ended first ({self.error!r})")
            if accept(item):
                return item


def _attempt(seen: Seen) -> int | None:
    if seen.event != "metadata":
        return None
    return int(json.loads(seen.data).get("attempt", 0))


# --- 1. recovery after kill -9 ----------------------------------------------------------------------
@dataclass
class Recovery:
    """One kill and what followed (seconds unless named _ms)."""

    repeat: int
    lease_left_at_kill_s: float
    kill_to_requeued_s: float
    requeued_to_claimed_ms: float
    claimed_to_first_event_ms: float
    kill_to_first_event_s: float
    killed_was_reaper_leader: bool


def _lifecycle_times(dsn: str, run_id: str) -> dict[str, float]:
    rows = sql(
        dsn,
        "SELECT type, payload, extract(epoch FROM created_at)::float8 AS t FROM run_events "
        "WHERE run_id = %s ORDER BY seq",
        (run_id,),
    )
    out: dict[str, float] = {}
    for r in rows:
        if r["type"] == "requeued" and "requeued" not in out:
            out["requeued"] = r["t"]
        if r["type"] == "claimed" and r["payload"].get("attempt") == 2:
            out["claimed2"] = r["t"]
    return out


def measure_recovery(c: Cluster, repeat: int) -> Recovery:
    """Start a slow run, kill -9 its owner, time the kill to attempt 2's first event."""
    dsn = c.settings.dsn
    keys = Keys(c.settings.redis_prefix)
    rclient = redis.Redis.from_url(c.settings.redis_url)
    try:
        with httpx.Client(base_url=c.url, timeout=30) as client:
            tid = client.post("/threads", json={}).json()["thread_id"]
            res = client.post(
                f"/threads/{tid}/runs",
                json=run_body(f"victim {repeat}", SLOW_TOKENS, SLOW_DELAY_MS),
            )
            res.raise_for_status()
            run_id = res.json()["run_id"]
            follower = Follower(c.url, tid, run_id)
            follower.start()
            follower.until(lambda s: s.event == "messages", 30)
            time.sleep(1.0)  # a second of tokens: well inside the run
            owner = sql(dsn, "SELECT owner FROM runs WHERE run_id = %s", (run_id,))[0]["owner"]
            pid = int(owner.split(":")[1])
            victim = c.process(pid)
            leader = rclient.get(keys.reaper_leader())
            was_leader = leader is not None and leader.decode() == owner
            pttl_ms = int(rclient.pttl(keys.lease(run_id)))
            t_kill_mono, t_kill_wall = time.monotonic(), time.time()
            os.kill(pid, signal.SIGKILL)
            victim.popen.wait(timeout=10)
            first = follower.until(lambda s: _attempt(s) == 2, 90)
            kill_to_first = first.mono - t_kill_mono
            times = wait_for(
                lambda: (lambda t: t if len(t) == 2 else None)(_lifecycle_times(dsn, run_id)),
                10,
                0.05,
                what="the lifecycle events",
            )
            first_id_wall = int(first.id.split("-")[0]) / 1000.0
            rec = Recovery(
                repeat=repeat,
                lease_left_at_kill_s=pttl_ms / 1000.0,
                kill_to_requeued_s=times["requeued"] - t_kill_wall,
                requeued_to_claimed_ms=(times["claimed2"] - times["requeued"]) * 1000.0,
                claimed_to_first_event_ms=(first_id_wall - times["claimed2"]) * 1000.0,
                kill_to_first_event_s=kill_to_first,
                killed_was_reaper_leader=was_leader,
            )
            client.post(
                f"/threads/{tid}/runs/{run_id}/cancel",
                params={"action": "interrupt", "wait": 1},
                timeout=60,
            )
            follower.join(timeout=30)
            return rec
    finally:
        rclient.close()


# --- 2. admission under contention ------------------------------------------------------------------
@dataclass
class Phase:
    """One measured burst: `n` operations from `clients` concurrent clients."""

    name: str
    n: int = 0
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    failures: int = 0

    @property
    def rate(self) -> float:
        return self.n / self.wall_s if self.wall_s else 0.0

    def add(self, other: Phase) -> None:
        self.n += other.n
        self.wall_s += other.wall_s
        self.latencies_ms.extend(other.latencies_ms)
        self.failures += other.failures


def burst(
    name: str, clients: int, items: list[Any], make: Callable[[], Any], op: Callable[..., bool]
) -> Phase:
    """`clients` threads, each with its own connection from `make()`, run `op(conn, item)` over
    `items` (shared queue) after a common start; wall time from the start to the last reply."""
    work: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for it in items:
        work.put(it)
    conns = [make() for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)
    lat: list[list[float]] = [[] for _ in range(clients)]
    failed = [0] * clients

    def worker(i: int) -> None:
        barrier.wait()
        while True:
            try:
                it = work.get_nowait()
            except queue.Empty:
                return
            t0 = time.perf_counter()
            ok = op(conns[i], it)
            lat[i].append((time.perf_counter() - t0) * 1000.0)
            if not ok:
                failed[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    finally:
        for conn in conns:
            conn.close()
    return Phase(name, len(items), wall, [x for xs in lat for x in xs], sum(failed))


def measure_admission(c: Cluster, *, clients: int, creates: int, rounds: int) -> dict[str, Phase]:
    dsn = c.settings.dsn
    owner = c.settings.local_user
    with httpx.Client(base_url=c.url, timeout=30) as client:
        one_tid = client.post("/threads", json={}).json()["thread_id"]
    total: dict[str, Phase] = {
        k: Phase(k) for k in ("http_one", "http_many", "raw_insert", "raw_lock_insert")
    }
    body_one = run_body("a", 1, multitask_strategy="enqueue")

    def http() -> httpx.Client:
        return httpx.Client(
            base_url=c.url, timeout=60, limits=httpx.Limits(max_keepalive_connections=1)
        )

    def post(tid: str) -> Callable[[httpx.Client, Any], bool]:
        def op(cl: httpx.Client, it: Any) -> bool:
            return cl.post(f"/threads/{tid or it}/runs", json=body_one).status_code == 200

        return op

    def pg() -> psycopg.Connection[Any]:
        return psycopg.connect(dsn, autocommit=True)

    def raw_insert(conn: psycopg.Connection[Any], tid: str) -> bool:
        conn.execute(
            RAW_INSERT_RUN_SQL,
            {"run_id": str(uuid.uuid4()), "thread_id": tid, "input": json.dumps({"x": 1})},
        )
        return True

    def raw_lock_insert(conn: psycopg.Connection[Any], tid: str) -> bool:
        with conn.transaction():
            conn.execute("SELECT 1 FROM threads WHERE thread_id = %s FOR UPDATE", (tid,))
            raw_insert(conn, tid)
        return True

    for r in range(rounds):
        many = [
            row["thread_id"] for row in sql(dsn, INSERT_THREADS_SQL, {"owner": owner, "n": creates})
        ]
        raw_tids = [
            row["thread_id"] for row in sql(dsn, INSERT_THREADS_SQL, {"owner": owner, "n": creates})
        ]
        log(f"chaos: admission round {r + 1}/{rounds}")
        total["raw_insert"].add(burst("raw_insert", clients, raw_tids, pg, raw_insert))
        total["http_one"].add(burst("http_one", clients, [""] * creates, http, post(one_tid)))
        total["raw_lock_insert"].add(
            burst("raw_lock_insert", clients, [one_tid] * creates, pg, raw_lock_insert)
        )
        total["http_many"].add(burst("http_many", clients, many, http, post("")))
    return total


# --- report -----------------------------------------------------------------------------------------
def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(vals: Sequence[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def recovery_tables(recs: list[Recovery], s: Settings) -> str:
    rows = [
        [
            str(r.repeat),
            f"{r.lease_left_at_kill_s:.2f}",
            f"{r.kill_to_requeued_s:.2f}",
            f"{r.requeued_to_claimed_ms:.0f}",
            f"{r.claimed_to_first_event_ms:.0f}",
            f"{r.kill_to_first_event_s:.2f}",
            "yes" if r.killed_was_reaper_leader else "no",
        ]
        for r in recs
    ]
    detail = table(
        [
            "repeat",
            "lease left at kill s",
            "kill -> requeued s",
            "requeued -> claimed ms",
            "claimed -> 1st event ms",
            "kill -> 1st event of attempt 2 s",
            "killed the reaper leader",
        ],
        rows,
    )
    total = [r.kill_to_first_event_s for r in recs]
    bound = s.lease_ttl_s + s.reaper_interval_s
    summary = table(
        ["kill -> first event of attempt 2", "p50 s", "max s", "bound s (TTL + reaper interval)"],
        [["", f"{percentile(total, 50):.2f}", f"{max(total):.2f}", f"{bound:.1f} + dispatch"]],
    )
    return detail + "\n\n" + summary


def admission_table(ph: dict[str, Phase], clients: int) -> str:
    base = ph["raw_insert"].rate

    def row(label: str, p: Phase, baseline: str) -> list[str]:
        return [
            label,
            str(p.n),
            f"{p.rate:,.0f}",
            f"{percentile(p.latencies_ms, 50):.1f}",
            f"{percentile(p.latencies_ms, 99):.1f}",
            str(p.failures),
            baseline,
            f"{base / p.rate:.1f}x" if p.rate else "-",
        ]

    return table(
        [
            f"creates, {clients} clients",
            "n",
            "per s",
            "p50 ms",
            "p99 ms",
            "failed",
            "baseline",
            "raw INSERT / this",
        ],
        [
            row("HTTP, ONE thread (enqueue)", ph["http_one"], f"{base:,.0f}/s raw INSERT"),
            row("HTTP, MANY threads (one each)", ph["http_many"], f"{base:,.0f}/s raw INSERT"),
            row("raw lock thread row + INSERT, ONE thread", ph["raw_lock_insert"], "-"),
            row("raw INSERT INTO runs (baseline)", ph["raw_insert"], "-"),
        ],
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="kills to time (default 3)")
    p.add_argument("--clients", type=int, default=16, help="concurrent admission clients")
    p.add_argument("--creates", type=int, default=300, help="creates per phase and round")
    p.add_argument("--rounds", type=int, default=2, help="interleaved admission rounds")
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    p.add_argument("--json", type=Path, default=None, help="also write every figure here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both measurements in a private sandbox, print the tables, always clean up."""
    args = parse_args(argv)
    base = Settings()
    sandbox = Sandbox(base, "chaos")
    workdir = Path(tempfile.mkdtemp(prefix="threadrun-chaos-"))
    cluster: Cluster | None = None
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    started = time.time()
    rc = 0
    try:
        log(f"chaos: database {sandbox.db_name}, redis prefix {sandbox.prefix}, logs {workdir}")
        settings = sandbox.create()
        defaults = Settings.model_construct()  # the class defaults, which the children run with
        for name in LEASE_ENV:
            if name in os.environ:
                log(f"chaos: ignoring {name} from the environment (defaults are measured)")
        cluster = bench_cluster(settings, workdir)
        cluster.start_web()
        cluster.start_worker("worker1")
        cluster.start_worker("worker2")
        recs: list[Recovery] = []
        for i in range(1, args.repeats + 1):
            log(f"chaos: kill -9 {i}/{args.repeats}")
            recs.append(measure_recovery(cluster, i))
            log(f"chaos:   {asdict(recs[-1])}")
            cluster.start_worker(f"worker{i + 2}")  # back to two workers (not timed)
        cluster.stop(cluster.workers())
        phases = measure_admission(
            cluster, clients=args.clients, creates=args.creates, rounds=args.rounds
        )
        cpus = len(os.sched_getaffinity(0))
        print(
            f"threadrun chaos: lease TTL {defaults.lease_ttl_s:g} s, renew "
            f"{defaults.lease_renew_s:g} s, reaper {defaults.reaper_interval_s:g} s, "
            f"{cpus} cpus, {time.time() - started:.0f} s"
        )
        print()
        print(recovery_tables(recs, defaults))
        print()
        print(admission_table(phases, args.clients))
        if args.json is not None:
            report = {
                "meta": {
                    "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                    "elapsed_s": round(time.time() - started, 1),
                    "python": platform.python_version(),
                    "cpus": cpus,
                    "lease_ttl_s": defaults.lease_ttl_s,
                    "lease_renew_s": defaults.lease_renew_s,
                    "reaper_interval_s": defaults.reaper_interval_s,
                    "clients": args.clients,
                    "creates": args.creates,
                    "rounds": args.rounds,
                },
                "recovery": [asdict(r) for r in recs],
                "recovery_p50_s": percentile([r.kill_to_first_event_s for r in recs], 50),
                "recovery_max_s": max(r.kill_to_first_event_s for r in recs),
                "admission": {
                    k: {
                        "n": p.n,
                        "wall_s": p.wall_s,
                        "per_s": p.rate,
                        "p50_ms": percentile(p.latencies_ms, 50),
                        "p99_ms": percentile(p.latencies_ms, 99),
                        "failed": p.failures,
                    }
                    for k, p in phases.items()
                },
            }
            args.json.write_text(json.dumps(report, indent=2) + "\n")
            log(f"chaos: wrote {args.json}")
    except KeyboardInterrupt:
        log("chaos: interrupted")
        rc = 130
    except Exception as exc:  # noqa: BLE001 - report, then clean up
        log(f"chaos: failed: {exc!r}")
        if cluster is not None:
            for p in cluster.procs:
                log(f"--- {p.name} ---\n{p.tail()}")
        rc = 1
    finally:
        with signals_ignored():
            if cluster is not None:
                cluster.stop()
            try:
                deleted = sandbox.destroy()
                log(
                    f"chaos: dropped {sandbox.db_name}, deleted {deleted} keys under {sandbox.prefix}"
                )
            except Exception as exc:  # noqa: BLE001 - say exactly what is left behind
                log(f"chaos: CLEANUP FAILED ({exc}); drop {sandbox.db_name} and {sandbox.prefix}*")
                rc = rc or 1
            if args.keep_logs:
                log(f"chaos: logs kept in {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
        signal.signal(signal.SIGTERM, old_term)
    return rc


if __name__ == "__main__":
    sys.exit(main())
