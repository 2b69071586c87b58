"""Time to the first event and the first token of a streamed run at C=1, beside raw round trips.

Run with `.venv/bin/python -m bench.first_token [--runs 100] [--tokens 200] [--json PATH]`
(part of `make bench`). It starts two web processes and one runs worker (the `make run` shape)
on a private database and Redis prefix (shared.tools.testing's Sandbox), warms up, then creates
`--runs` runs one after another, each on a new thread, with `POST /threads/{id}/runs/stream`
(the built-in model, `messages-tuple` and `values`), alternating the web processes, and times
from the request's send to the first SSE event (TTFE) and to the first `messages` event, the
model's first token (TTFT).

A run's first token waits on a chain of serial steps across processes (admission in
PostgreSQL, the Celery message through Redis, the claim, the lease, the graph's start, the
publish, the web's read: docs/performance.md, "The first token's path"), so beside it, in the
same run, the bench measures the raw round trips that chain is made of: a Redis PING and a
PostgreSQL `SELECT 1` on an open connection, and a committed one-row INSERT. TTFT divided by
them ("round-trip equivalents") moves little with the machine's speed: a change that puts
another step on the path shows there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis

from bench.chaos import table
from bench.system_cpu import WEBS, on_cluster, run_bench
from shared.settings import Settings

BASELINE_N = 2000
WARMUP = 20


def run_body(n: int, tokens: int) -> dict[str, Any]:
    return {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": f"first token {n}"}]},
        "stream_mode": ["messages-tuple", "values"],
        "config": {"configurable": {"tokens": tokens, "token_delay_ms": 0}},
    }


@dataclass(frozen=True)
class Timed:
    """One streamed run as its client saw it: events read, time to the first event and to
    the first token (`messages`), in ms."""

    events: int
    ttfe_ms: float
    ttft_ms: float


def stream_timed(client: httpx.Client, body: dict[str, Any], what: str) -> Timed:
    """Stream `body` as a run on a new thread, read to its end, timed from the request; a
    RuntimeError naming `what` for an `error` event or a run that streamed no token."""
    tid = client.post("/threads", json={}).raise_for_status().json()["thread_id"]
    events, ttfe, ttft = 0, None, None
    t0 = time.perf_counter()
    with client.stream("POST", f"/threads/{tid}/runs/stream", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("event: "):
                continue
            events += 1
            now = (time.perf_counter() - t0) * 1000
            ttfe = now if ttfe is None else ttfe
            if ttft is None and line == "event: messages":
                ttft = now
            if line == "event: error":
                raise RuntimeError(f"{what} ended with an error event")
    if ttfe is None or ttft is None:
        raise RuntimeError(f"{what}: no event or no token streamed")
    return Timed(events, ttfe, ttft)


def one_run(client: httpx.Client, n: int, tokens: int) -> tuple[float, float]:
    """(TTFE, TTFT) of one streamed run in ms; the stream is read to its end."""
    timed = stream_timed(client, run_body(n, tokens), f"run {n}")
    return timed.ttfe_ms, timed.ttft_ms


def median_us(fn: Callable[[], object], n: int = BASELINE_N) -> float:
    """The median wall µs of `fn()` over `n` calls."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


@dataclass
class Figures:
    """One measurement (ms, µs for the raw round trips)."""

    runs: int
    tokens: int
    ttfe_p50: float
    ttfe_p90: float
    ttft_p50: float
    ttft_p90: float
    redis_ping_us: float
    pg_select_us: float
    pg_insert_us: float


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(urls: list[str], settings: Settings, runs: int, tokens: int) -> Figures:
    clients = [httpx.Client(base_url=u, timeout=120) for u in urls]
    rclient = redis.Redis.from_url(settings.redis_url)
    try:
        for i in range(WARMUP):
            one_run(clients[i % len(clients)], i, tokens)
        got = [one_run(clients[i % len(clients)], i, tokens) for i in range(runs)]
        ping = median_us(rclient.ping)
        with psycopg.connect(settings.dsn, autocommit=True) as conn:
            select = median_us(lambda: conn.execute("SELECT 1").fetchone())
            # A logged table: a temporary one is not WAL-logged, so its commit waits on nothing.
            conn.execute("CREATE TABLE bench_first_token (id bigserial PRIMARY KEY, body jsonb)")
            try:
                insert = median_us(
                    lambda: conn.execute("INSERT INTO bench_first_token (body) VALUES ('{}')"),
                    n=500,
                )
            finally:
                conn.execute("DROP TABLE bench_first_token")
    finally:
        rclient.close()
        for c in clients:
            c.close()
    ttfe, ttft = [g[0] for g in got], [g[1] for g in got]
    return Figures(
        runs=runs,
        tokens=tokens,
        ttfe_p50=pct(ttfe, 0.5),
        ttfe_p90=pct(ttfe, 0.9),
        ttft_p50=pct(ttft, 0.5),
        ttft_p90=pct(ttft, 0.9),
        redis_ping_us=ping,
        pg_select_us=select,
        pg_insert_us=insert,
    )


def report(f: Figures) -> str:
    times = table(
        ("C=1", "p50 ms", "p90 ms", "p50 in Redis PINGs", "p50 in PostgreSQL SELECT 1s"),
        [
            (
                name,
                f"{p50:.1f}",
                f"{p90:.1f}",
                f"{1000 * p50 / f.redis_ping_us:.0f}",
                f"{1000 * p50 / f.pg_select_us:.0f}",
            )
            for name, p50, p90 in (
                ("first event (TTFE)", f.ttfe_p50, f.ttfe_p90),
                ("first token (TTFT)", f.ttft_p50, f.ttft_p90),
            )
        ],
    )
    base = table(
        ("raw round trip (same run)", "median µs"),
        [
            ("Redis PING", f"{f.redis_ping_us:.0f}"),
            ("PostgreSQL SELECT 1", f"{f.pg_select_us:.0f}"),
            ("PostgreSQL one-row INSERT, committed", f"{f.pg_insert_us:.0f}"),
        ],
    )
    head = f"{f.runs} streamed runs one after another, {f.tokens} tokens each, each on a new thread"
    return "\n".join([head, "", times, "", base])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.first_token", description=__doc__.split("\n")[0]
    )
    p.add_argument("--runs", type=int, default=100, help="timed streamed runs")
    p.add_argument("--tokens", type=int, default=200, help="built-in model tokens per run")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure in a private sandbox, print the tables, always clean up."""
    args = parse_args(argv)
    if args.runs < 1:
        raise SystemExit("--runs: at least 1")

    def body() -> None:
        figures = on_cluster(
            "first_token",
            lambda urls, _roots, settings: measure(urls, settings, args.runs, args.tokens),
        )
        print(f"threadrun first token: {WEBS} web processes, 1 runs worker, {os.cpu_count()} CPUs")
        print()
        print(report(figures))
        if args.json is not None:
            args.json.write_text(json.dumps(asdict(figures), indent=2) + "\n")

    return run_bench("first_token", body)


if __name__ == "__main__":
    raise SystemExit(main())
