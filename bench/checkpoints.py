"""Checkpoint modes benchmark (S4): `full` vs `delta` on the Postgres saver, beside
InMemorySaver on the same workload.

Run with `.venv/bin/python -m bench.checkpoints [--runs 100] [--every 10]` (also part of
`make bench`). Workload: one thread, `--runs` runs of a two-node graph over our
`ThreadState` schema (as built for each mode by `shared.state.modes`); each run adds
5 messages (the user's, then 2 + 2 from the nodes, ~400 bytes each), so 100 runs grow the
thread to 500 messages and write 3 checkpoints per run. It creates a private database on
the server of THREADRUN_DATABASE_URL and drops it at the end (bench.internals.Sandbox).

Per saver and mode it reports:
- bytes per checkpoint: what the saver stored for the thread (Postgres: blob and
  checkpoint row sizes; InMemorySaver: its serialized blobs) divided by checkpoints;
- write ms: the median time of one `aput` (timed around the saver call, so the graph's own
  work is not counted), and the p95;
- read ms: the median of 20 `aget_state` calls on the final thread (a delta thread replays
  the writes since its last snapshot);
- ratios against InMemorySaver in the same mode (the cost of durability) and, for the
  Postgres rows, against a raw INSERT of the same number of bytes (the floor of durability).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.pregel import Pregel

from bench.chaos import table
from bench.internals import Sandbox
from shared.db import make_async_pool, make_pool
from shared.runs.leases import lease_value
from shared.runs.model import MultitaskStrategy, RunRequest
from shared.runs.store import RunStore
from shared.settings import Settings
from shared.state.modes import CheckpointMode, thread_state_schema
from shared.state.savers import LEASE_KEY, RUN_KEY, FencedPostgresSaver

BODY = "lorem ipsum dolor sit amet " * 15  # ~400 bytes per message


def build_graph(mode: CheckpointMode, every: int, saver: BaseCheckpointSaver[Any]) -> Pregel:
    """Two nodes, two messages each: the shape of a model turn followed by a tool turn."""

    def model(state: dict[str, Any]) -> dict[str, Any]:
        n = len(state["messages"])
        call = {"name": "lookup", "args": {"q": n}, "id": f"call-{n}"}
        return {
            "messages": [
                AIMessage(content=BODY, tool_calls=[call]),
                ToolMessage(content=BODY, tool_call_id=f"call-{n}"),
            ]
        }

    def answer(state: dict[str, Any]) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(content=f"{n} " + BODY), AIMessage(content=f"{n}. " + BODY)]}

    g: StateGraph[Any] = StateGraph(thread_state_schema(mode, every))
    g.add_node("model", model)
    g.add_node("answer", answer)
    g.add_edge(START, "model")
    g.add_edge("model", "answer")
    g.add_edge("answer", END)
    return g.compile(checkpointer=saver)


class TimedSaver:
    """Times every aput of the wrapped saver (the graph calls it through this proxy)."""

    def __init__(self, saver: BaseCheckpointSaver[Any]) -> None:
        self.saver = saver
        self.put_ms: list[float] = []
        orig = saver.aput

        async def timed(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await orig(*args, **kw)
            finally:
                self.put_ms.append((time.perf_counter() - t0) * 1000)

        saver.aput = timed  # type: ignore[method-assign]


@dataclass
class Result:
    saver: str
    mode: str
    checkpoints: int
    bytes_per_checkpoint: float
    write_ms: float
    write_p95_ms: float
    read_ms: float
    messages: int


async def workload(
    name: str,
    mode: CheckpointMode,
    every: int,
    saver: BaseCheckpointSaver[Any],
    runs: int,
    fence: tuple[str, str, dict[str, str]] | None = None,
) -> tuple[Result, str]:
    """`fence`: (thread_id, run_id, fence keys) of a claimed run, for fenced writes."""
    timed = TimedSaver(saver)
    graph = build_graph(mode, every, saver)
    tid = fence[0] if fence else str(uuid.uuid4())
    cfg = {"configurable": {"thread_id": tid, **(fence[2] if fence else {})}}
    for i in range(runs):
        await graph.ainvoke({"messages": [{"role": "user", "content": f"{i} " + BODY}]}, cfg)
    reads = []
    for _ in range(20):
        t0 = time.perf_counter()
        snap = await graph.aget_state(cfg)
        reads.append((time.perf_counter() - t0) * 1000)
    n_msgs = len(snap.values["messages"])
    q = statistics.quantiles(timed.put_ms, n=20)
    return (
        Result(
            name,
            mode,
            len(timed.put_ms),
            0.0,
            statistics.median(timed.put_ms),
            q[18],
            statistics.median(reads),
            n_msgs,
        ),
        tid,
    )


def claimed_run(settings: Settings) -> tuple[str, str, dict[str, str]]:
    """A thread with a claimed run, and the fence keys its attempt writes with."""
    pool = make_pool(settings, name="bench-checkpoints-store", max_size=1)
    try:
        store = RunStore(pool)
        tid = store.create_thread(None, "bench", {}, "raise").thread_id
        run_id = str(uuid.uuid4())
        store.admit(
            RunRequest(thread_id=tid, assistant_id="bench"),
            run_id=run_id,
            owner="bench",
            graph_id="bench",
            strategy=MultitaskStrategy.ENQUEUE,
        )
        claim = store.claim(run_id, "bench-worker")
        assert claim.run is not None
        lease = lease_value(claim.run.owner_epoch, "bench-worker")
    finally:
        pool.close()
    return tid, run_id, {RUN_KEY: run_id, LEASE_KEY: lease}


def postgres_bytes(dsn: str, tid: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT coalesce(sum(length(blob)), 0) FROM checkpoint_blobs"
            "        WHERE thread_id = %(t)s)"
            "     + (SELECT coalesce(sum(pg_column_size(checkpoint) + pg_column_size(metadata)), 0)"
            "        FROM checkpoints WHERE thread_id = %(t)s)",
            {"t": tid},
        ).fetchone()
    return int(row[0]) if row else 0


def memory_bytes(saver: InMemorySaver, tid: str) -> int:
    blobs = sum(
        len(v[1]) for k, v in saver.blobs.items() if k[0] == tid and isinstance(v[1], bytes)
    )
    cps = sum(
        len(c[0][1]) + len(c[1][1])
        for ns in saver.storage.get(tid, {}).values()
        for c in ns.values()
    )
    return blobs + cps


def raw_insert_ms(dsn: str, nbytes: int, n: int = 200) -> float:
    """The floor: one INSERT of `nbytes` into a plain bytea table, autocommit, median of n."""
    payload = b"x" * max(1, nbytes)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw_blob (id bigserial, b bytea)")
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            conn.execute("INSERT INTO bench_raw_blob (b) VALUES (%s)", (payload,))
            times.append((time.perf_counter() - t0) * 1000)
        conn.execute("DROP TABLE bench_raw_blob")
    return statistics.median(times)


async def main_async(settings: Settings, runs: int, every: int) -> list[Result]:
    apool = await make_async_pool(settings, name="bench-checkpoints", max_size=4)
    results: list[Result] = []
    try:
        for mode in ("full", "delta"):
            mem = InMemorySaver()
            res, tid = await workload("InMemorySaver", mode, every, mem, runs)
            res.bytes_per_checkpoint = memory_bytes(mem, tid) / res.checkpoints
            results.append(res)
            pg = FencedPostgresSaver(apool, mode=mode)
            res, tid = await workload("Postgres (ours)", mode, every, pg, runs)
            res.bytes_per_checkpoint = postgres_bytes(settings.dsn, tid) / res.checkpoints
            results.append(res)
            # The same writes through the epoch fence of a claimed run (L2): the price of
            # the SELECT … FOR SHARE in each write's transaction.
            res, tid = await workload(
                "Postgres (ours, fenced)", mode, every, pg, runs, claimed_run(settings)
            )
            res.bytes_per_checkpoint = postgres_bytes(settings.dsn, tid) / res.checkpoints
            results.append(res)
    finally:
        await apool.close()
    return results


def report(results: Sequence[Result], settings: Settings, runs: int, every: int) -> str:
    mem = {r.mode: r for r in results if r.saver == "InMemorySaver"}
    full_pg = next(r for r in results if r.saver == "Postgres (ours)" and r.mode == "full")
    rows = []
    for r in results:
        base = mem[r.mode]
        raw = (
            raw_insert_ms(settings.dsn, int(r.bytes_per_checkpoint))
            if r.saver != base.saver
            else None
        )
        rows.append(
            [
                r.saver,
                r.mode,
                str(r.messages),
                str(r.checkpoints),
                f"{r.bytes_per_checkpoint:,.0f}",
                f"{r.bytes_per_checkpoint / full_pg.bytes_per_checkpoint:.2f}"
                if r.saver != base.saver
                else "-",
                f"{r.write_ms:.2f} / {r.write_p95_ms:.2f}",
                f"{r.write_ms / base.write_ms:.1f}x" if r.saver != base.saver else "1.0x",
                f"{raw:.2f} ({r.write_ms / raw:.1f}x)" if raw else "-",
                f"{r.read_ms:.2f}",
                f"{r.read_ms / base.read_ms:.1f}x" if r.saver != base.saver else "1.0x",
            ]
        )
    head = [
        "saver",
        "mode",
        "messages",
        "checkpoints",
        "bytes/checkpoint",
        "vs full PG",
        "write ms p50 / p95",
        "write vs memory",
        "raw INSERT ms (ours/raw)",
        "read ms",
        "read vs memory",
    ]
    return (
        f"checkpoint modes: {runs} runs, 5 messages per run, delta snapshot every {every}\n"
        + table(head, rows)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--every", type=int, default=10, help="delta snapshot frequency")
    args = parser.parse_args()
    sandbox = Sandbox(Settings())
    try:
        settings = sandbox.create()
        results = asyncio.run(main_async(settings, args.runs, args.every))
        print(report(results, settings, args.runs, args.every))
    finally:
        sandbox.destroy()


if __name__ == "__main__":
    main()
