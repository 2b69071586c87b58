"""Memory benchmark (M4, M5): what admitting and extracting memory costs, beside raw Redis and
PostgreSQL operations measured in the same run.

Run with `.venv/bin/python -m bench.memory [--n 2000]` (also part of `make bench`). It uses
a private database `threadrun_bench_<hex>` and Redis prefix `trbench:<hex>:`
(bench.internals.Sandbox), removed at the end.

Rows (p50/p99 per call, and the ratio to the baseline beside it):
- admit: `MemoryManager.add` of a 20-message history (filter, signals, one Lua admission)
  vs a raw RPUSH of the same JSON;
- stats: `memory_stats()` (the ops view's and /metrics' read) vs a raw PING;
- extract+store: `MemoryManager.process` of one due batch with the built-in model (load,
  merge, extract, upsert with superseding, ack) vs a raw INSERT of one fact row.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
import redis
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from bench.chaos import table
from bench.internals import Sandbox
from shared import serde
from shared.agent.model import BuiltinChatModel
from shared.memory.base import keep_for_memory
from shared.memory.services import build_manager
from shared.memory.stats import memory_stats
from shared.settings import Settings


@dataclass
class Row:
    name: str
    ours: list[float]
    baseline_name: str
    baseline: list[float]

    def cells(self) -> list[str]:
        def q(xs: list[float], p: int) -> float:
            return statistics.quantiles(xs, n=100)[p - 1] if len(xs) > 1 else xs[0]

        ours50, base50 = statistics.median(self.ours), statistics.median(self.baseline)
        return [
            self.name,
            f"{ours50 * 1e6:.0f}",
            f"{q(self.ours, 99) * 1e6:.0f}",
            self.baseline_name,
            f"{base50 * 1e6:.0f}",
            f"{ours50 / base50:.1f}x",
        ]


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def history(n: int) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for i in range(n // 2):
        text = "I prefer reports in bullet points." if i == 3 else f"message {i} " + "x" * 80
        out += [HumanMessage(text, id=f"h{i}"), AIMessage(f"reply {i} " + "y" * 120, id=f"a{i}")]
    return out


def run(settings: Settings, n: int) -> list[Row]:
    client = redis.Redis.from_url(settings.redis_url)
    fast = settings.model_copy(update={"memory_debounce_s": 0.001, "memory_max_wait_s": 0.002})
    manager = build_manager(fast)
    msgs = history(20)
    payload = serde.dumps_str({"messages": keep_for_memory(msgs, 40)})
    raw_key = f"{settings.redis_prefix}bench:raw"
    admit, rpush = [], []
    for i in range(n):  # interleaved, so machine noise hits both alike
        tid = f"t{i}"
        admit.append(timed(lambda tid=tid: manager.add(tid, msgs, "agent", "alice")))
        rpush.append(timed(lambda: client.rpush(raw_key, payload)))
    stats, ping = [], []
    for _ in range(min(n, 500)):
        stats.append(timed(lambda: memory_stats(settings, client)))
        ping.append(timed(client.ping))
    time.sleep(0.01)
    model = BuiltinChatModel()
    extract, insert = [], []
    with psycopg.connect(settings.dsn, autocommit=True) as conn:
        for token in manager.queue.claim_due(min(n, 300)):
            extract.append(timed(lambda token=token: manager.process(token, model)))
            insert.append(
                timed(
                    lambda: conn.execute(
                        "INSERT INTO memory_facts (fact_id, agent_name, user_id, category,"
                        " content, content_hash, confidence) VALUES (%s, 'raw', 'raw',"
                        " 'preference', 'I prefer reports', %s, 0.9)",
                        (uuid.uuid4(), uuid.uuid4().hex),
                    )
                )
            )
    client.close()
    return [
        Row("admit (MemoryManager.add, 20 messages)", admit, "raw RPUSH, same JSON", rpush),
        Row("memory_stats()", stats, "raw PING", ping),
        Row("extract + store one batch (built-in model)", extract, "raw INSERT of a fact", insert),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="admissions to time")
    args = parser.parse_args()
    sandbox = Sandbox(Settings())
    try:
        rows = run(sandbox.create(), args.n)
        head = ["operation", "p50 µs", "p99 µs", "baseline", "baseline p50 µs", "ours/baseline"]
        print(f"memory: {args.n} admissions\n" + table(head, [r.cells() for r in rows]))
    finally:
        sandbox.destroy()


if __name__ == "__main__":
    main()
