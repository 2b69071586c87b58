"""The thread streaming protocol (`client.threads.stream`, app/protocols/thread_stream/) beside
the REST run stream on the same runs, and under load with dropped connections.

    .venv/bin/python -m bench.thread_stream [--runs 60] [--tokens 100] [--streams 500] [--c 50]

On two web processes and one runs worker (the `make run` shape, a private sandbox):

1. Latency, C=1: `--runs` runs of the built-in model (`--tokens` tokens) started with
   `POST /threads/{id}/runs/stream` (stream modes `messages-tuple`, `values`), and as many
   with the protocol's `run.start` + `POST /threads/{id}/stream/events` (channels
   `messages`, `values`, `lifecycle`): the time to the first token, and the events/s of the
   whole stream, with a Redis PING and a PostgreSQL `SELECT 1` measured in the same run as
   the raw baseline.
2. Load: `--streams` protocol streams at concurrency `--c`, each its own run; one in three
   is dropped after a third of its events and reopened, on the other web process, with
   `since` = the last seq it got. Each stream's events are then compared with one
   uninterrupted read of the same run: duplicated and lost events are counted (both must
   be 0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import redis

from bench.chaos import table
from bench.first_token import median_us, pct
from bench.system_cpu import on_cluster, run_bench
from shared.settings import Settings

WARMUP = 10
CHANNELS = ["messages", "values", "lifecycle"]


def human(n: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"bench {n}"}]}


def knobs(tokens: int, delay_ms: float = 0) -> dict[str, Any]:
    return {"configurable": {"tokens": tokens, "token_delay_ms": delay_ms}}


def rest_run(client: httpx.Client, n: int, tokens: int) -> tuple[float, float]:
    """(ms to the first token, events/s) of one REST-streamed run."""
    tid = client.post("/threads", json={}).raise_for_status().json()["thread_id"]
    body = {
        "assistant_id": "lead_agent",
        "input": human(n),
        "stream_mode": ["messages-tuple", "values"],
        "config": knobs(tokens),
    }
    t0 = time.perf_counter()
    first, events = None, 0
    with client.stream("POST", f"/threads/{tid}/runs/stream", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("event: "):
                events += 1
                if first is None and line == "event: messages":
                    first = (time.perf_counter() - t0) * 1000
    total = time.perf_counter() - t0
    if first is None:
        raise RuntimeError(f"REST run {n} streamed no token")
    return first, events / total


def frames(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The data of each SSE frame of a protocol stream."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[6:])


def is_end(data: dict[str, Any]) -> bool:
    """The root's terminal lifecycle."""
    if data.get("method") != "lifecycle" or data["params"]["namespace"]:
        return False
    return data["params"]["data"]["event"] in ("completed", "failed")


def start(client: httpx.Client, tid: str, n: int, tokens: int, delay_ms: float = 0) -> None:
    cmd = {
        "id": n,
        "method": "run.start",
        "params": {
            "assistant_id": "lead_agent",
            "input": human(n),
            "config": knobs(tokens, delay_ms),
        },
    }
    answer = client.post(f"/threads/{tid}/commands", json=cmd).raise_for_status().json()
    if answer["type"] != "success":
        raise RuntimeError(f"run.start: {answer}")


def protocol_run(client: httpx.Client, n: int, tokens: int) -> tuple[float, float]:
    """(ms to the first token, events/s) of one run through the protocol."""
    tid = str(uuid.uuid4())
    t0 = time.perf_counter()
    start(client, tid, n, tokens)
    first, events = None, 0
    with client.stream("POST", f"/threads/{tid}/stream/events", json={"channels": CHANNELS}) as r:
        r.raise_for_status()
        for data in frames(r):
            events += 1
            delta = data.get("method") == "messages" and (
                data["params"]["data"].get("event") == "content-block-delta"
            )
            if first is None and delta:
                first = (time.perf_counter() - t0) * 1000
            if is_end(data):
                break
    total = time.perf_counter() - t0
    if first is None:
        raise RuntimeError(f"protocol run {n} streamed no token")
    return first, events / total


def read(
    client: httpx.Client, tid: str, since: int | None, stop_after: int | None
) -> list[dict[str, Any]]:
    """A protocol stream's events (after `since`) until the run's end, or `stop_after` of them
    (the connection is then dropped)."""
    body: dict[str, Any] = {"channels": CHANNELS}
    if since is not None:
        body["since"] = since
    got: list[dict[str, Any]] = []
    with client.stream("POST", f"/threads/{tid}/stream/events", json=body) as r:
        r.raise_for_status()
        for data in frames(r):
            if data.get("type") == "error":
                raise RuntimeError(f"stream error: {data}")
            got.append(data)
            if is_end(data) or (stop_after is not None and len(got) >= stop_after):
                break
    return got


def one_stream(clients: Sequence[httpx.Client], n: int, tokens: int) -> tuple[bool, int, int]:
    """(dropped, duplicated, lost) for one run's protocol stream."""
    tid = str(uuid.uuid4())
    first, other = clients[n % 2], clients[(n + 1) % 2]
    start(first, tid, n, tokens, delay_ms=2)
    dropped = n % 3 == 0
    if dropped:
        got = read(first, tid, None, stop_after=max(1, tokens // 3))
        got += read(other, tid, got[-1]["seq"], None)  # the other web process
    else:
        got = read(first, tid, None, None)
    whole = read(other, tid, None, None)  # the run has ended: one uninterrupted replay
    ids = [e["event_id"] for e in got]
    duplicated = len(ids) - len(set(ids))
    lost = len({e["event_id"] for e in whole} - set(ids))
    return dropped, duplicated, lost


def measure(urls: list[str], settings: Settings, args: argparse.Namespace) -> list[str]:
    headers = (
        {"x-api-key": settings.api_keys.split(",")[0].split(":")[0]} if settings.api_keys else {}
    )
    clients = [httpx.Client(base_url=u, timeout=120, headers=headers) for u in urls]
    out: list[str] = []
    try:
        for i in range(WARMUP):
            rest_run(clients[i % 2], i, args.tokens)
            protocol_run(clients[i % 2], i, args.tokens)
        rest = [rest_run(clients[i % 2], i, args.tokens) for i in range(args.runs)]
        proto = [protocol_run(clients[i % 2], i, args.tokens) for i in range(args.runs)]
        rclient = redis.Redis.from_url(settings.redis_url)
        ping = median_us(rclient.ping)
        rclient.close()
        with psycopg.connect(settings.dsn, autocommit=True) as conn:
            select = median_us(lambda: conn.execute("SELECT 1").fetchone())
        rows = []
        for name, got in (("runs.stream (REST)", rest), ("threads.stream (protocol)", proto)):
            ttft = [g[0] for g in got]
            rate = statistics.median(g[1] for g in got)
            rows.append(
                [
                    name,
                    f"{pct(ttft, 0.5):.1f}",
                    f"{pct(ttft, 0.9):.1f}",
                    f"{pct(ttft, 0.5) * 1000 / ping:.0f}",
                    f"{rate:.0f}",
                ]
            )
        ratio = pct([g[0] for g in proto], 0.5) / pct([g[0] for g in rest], 0.5)
        out.append(
            f"C=1, {args.runs} runs of {args.tokens} tokens; Redis PING {ping:.0f} µs,"
            f" PostgreSQL SELECT 1 {select:.0f} µs"
        )
        out.append(
            table(["stream", "first token p50 ms", "p90 ms", "p50 in PINGs", "events/s p50"], rows)
        )
        out.append(f"protocol / REST first token p50: {ratio:.2f}x")
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.c) as pool:
            results = list(
                pool.map(lambda n: one_stream(clients, n, args.tokens), range(args.streams))
            )
        wall = time.perf_counter() - t0
        dropped = sum(1 for r in results if r[0])
        dup = sum(r[1] for r in results)
        lost = sum(r[2] for r in results)
        out.append(
            table(
                ["streams", "concurrency", "dropped + resumed", "duplicated", "lost", "wall s"],
                [
                    [
                        str(args.streams),
                        str(args.c),
                        str(dropped),
                        str(dup),
                        str(lost),
                        f"{wall:.1f}",
                    ]
                ],
            )
        )
    finally:
        for c in clients:
            c.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--c", type=int, default=50)
    args = parser.parse_args(argv)

    def body() -> None:
        lines = on_cluster("thread_stream", lambda urls, roots, s: measure(urls, s, args))
        print("\n\n".join(lines))

    return run_bench("thread_stream", body)


if __name__ == "__main__":
    raise SystemExit(main())
