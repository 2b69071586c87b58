"""Webhook benchmark: delivery latency after a run's end, beside a bare POST to the same
receiver, measured in the same run.

Run with `.venv/bin/python -m bench.webhooks [--n 100]` (also part of `make bench`). It starts
real processes (a web process, a runs worker, a worker on the `webhooks` queue) on a private
database and Redis prefix (Sandbox), and a local receiver (a threaded http.server on
127.0.0.1, on THREADRUN_WEBHOOK_ALLOW), all removed at the end.

Rows (p50/p99 ms):
- delivery: from the run's terminal update (`ended_at` in the delivered body, PostgreSQL's
  clock, same host) to the receiver's receipt of the POST: the dispatch after commit, the
  broker, the task's claim, reading the run and the thread's final values, freezing and
  signing the body, the egress check and the POST;
- baseline: a bare `httpx.post` of a body of the same size to the same receiver, from the
  call to the receipt.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import httpx
import orjson

from bench.chaos import table
from shared.settings import Settings
from shared.tools.testing import Cluster, Sandbox, cluster_env, wait_for


def q(xs: list[float], p: int) -> float:
    """The p-th percentile."""
    return statistics.quantiles(xs, n=100)[p - 1] if len(xs) > 1 else xs[0]


class Receiver:
    """Records the wall-clock receipt time of every POST by its path, on `host`; a path
    under `/slow/` hangs `slow_s` first and is only counted (`slow_seen`)."""

    def __init__(self, host: str = "127.0.0.1", slow_s: float = 0.0) -> None:
        self.got: dict[str, tuple[float, bytes]] = {}
        self.host = host
        self.slow_seen = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path.startswith("/slow/"):
                    owner.slow_seen += 1
                    time.sleep(slow_s)
                else:
                    owner.got[self.path] = (time.time(), body)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def measure(c: Cluster, rec: Receiver, n: int) -> tuple[list[float], list[float]]:
    """Delivery latencies (runs one after another) and baseline POST latencies, in seconds."""
    delivery: list[float] = []
    baseline: list[float] = []
    with httpx.Client(base_url=c.url, timeout=30) as http, httpx.Client(timeout=10) as bare:
        for i in range(n):
            path = f"/run/{i}"
            r = http.post(
                "/runs/wait",
                json={
                    "assistant_id": "lead_agent",
                    "input": {"messages": [{"role": "user", "content": f"bench {i}"}]},
                    "config": {"configurable": {"tokens": 4}},
                    "webhook": rec.url(path),
                },
            )
            r.raise_for_status()
            wait_for(lambda p=path: p in rec.got, timeout=30, what=f"the webhook of run {i}")
            at, body = rec.got[path]
            ended = dt.datetime.fromisoformat(orjson.loads(body)["ended_at"]).timestamp()
            delivery.append(at - ended)
            bpath = f"/bare/{i}"
            t0 = time.time()
            bare.post(rec.url(bpath), content=body, headers={"Content-Type": "application/json"})
            baseline.append(rec.got[bpath][0] - t0)
    return delivery, baseline


def main() -> None:
    """CLI entry point."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="runs (and bare POSTs)")
    args = parser.parse_args()
    sandbox = Sandbox(Settings())
    rec = Receiver()
    try:
        settings = sandbox.create()
        with TemporaryDirectory(prefix="bench-webhooks-") as tmp:
            env = cluster_env(
                settings,
                {
                    "THREADRUN_DATA_DIR": str(Path(tmp) / "data"),
                    "THREADRUN_API_KEYS": "",
                    "THREADRUN_RUNS_PER_MINUTE": "100000",
                    "THREADRUN_WEBHOOK_ALLOW": "127.0.0.1",
                    "THREADRUN_WEBHOOK_SECRET": "bench",
                },
            )
            with Cluster(settings, env, Path(tmp)) as c:
                c.start_web()
                c.start_worker("runs", concurrency=4)
                c.start_webhooks_worker()
                print("bench.webhooks: measuring", file=sys.stderr, flush=True)
                delivery, baseline = measure(c, rec, args.n)
        rows = [
            ["webhook delivery after the run's end", delivery],
            ["baseline: bare httpx POST, same receiver", baseline],
        ]
        cells = [
            [name, f"{statistics.median(xs) * 1e3:.1f}", f"{q(xs, 99) * 1e3:.1f}"]
            for name, xs in rows
        ]
        ratio = statistics.median(delivery) / statistics.median(baseline)
        print(
            f"webhooks: {args.n} runs, one at a time; delivery/baseline p50 {ratio:.0f}x\n"
            + table(["latency", "p50 ms", "p99 ms"], cells)
        )
    finally:
        rec.close()
        sandbox.destroy()


if __name__ == "__main__":
    main()
