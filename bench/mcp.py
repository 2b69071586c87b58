"""MCP `tools/call` against `runs.wait` for the same assistant and input, interleaved in one run.

Run with `.venv/bin/python -m bench.mcp [--calls 100]` (not in `make bench`). It starts two web
processes and one runs worker on a private database and Redis prefix (bench/system_cpu.py's
`on_cluster`), warms up, then times, one after another and in turn: the official
langgraph-sdk's `runs.wait` without a thread (the baseline), the `mcp` package's
`ClientSession.call_tool` answered as JSON, and the same call with a progress token (answered
as SSE with a progress notification per batch of events). Each is the system assistant
`lead_agent` with the built-in model's default reply, on a new temporary thread.

What MCP adds over `runs.wait`: the session lookup in Redis, the caller's assistants and the
tool naming (one search per call), the call record (a SET and a DEL), and the result's
conversion; the run itself is the same.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx2
from langgraph_sdk import get_client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from bench.chaos import table
from bench.system_cpu import WEBS, on_cluster, run_bench
from shared.settings import Settings

WARMUP = 10
TEXT = "hello, how long does this take?"
INPUT: dict[str, Any] = {"messages": [{"role": "user", "content": TEXT}]}


async def _progress(progress: float, total: float | None, message: str | None) -> None:
    return None


async def _measure(url: str, calls: int) -> dict[str, list[float]]:
    sdk = get_client(url=url)
    timeout = httpx2.Timeout(60, read=120)
    try:
        async with (
            httpx2.AsyncClient(timeout=timeout) as http,
            streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as mcp,
        ):
            await mcp.initialize()
            await mcp.list_tools()
            kinds: dict[str, Callable[[], Awaitable[Any]]] = {
                "runs.wait (langgraph-sdk)": lambda: sdk.runs.wait(None, "lead_agent", input=INPUT),
                "tools/call, JSON": lambda: mcp.call_tool("lead_agent", {"messages": TEXT}),
                "tools/call, SSE + progress": lambda: mcp.call_tool(
                    "lead_agent", {"messages": TEXT}, progress_callback=_progress
                ),
            }
            times: dict[str, list[float]] = {k: [] for k in kinds}
            for i in range(WARMUP + calls):
                for name, call in kinds.items():
                    start = time.perf_counter()
                    out = await call()
                    elapsed = (time.perf_counter() - start) * 1000
                    if getattr(out, "is_error", False):
                        raise RuntimeError(f"{name} failed: {out}")
                    if i >= WARMUP:
                        times[name].append(elapsed)
            return times
    finally:
        await sdk.http.client.aclose()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(times: dict[str, list[float]]) -> str:
    """The table: p50 / p90 ms per kind and the ratio of each p50 to the baseline's."""
    base = statistics.median(next(iter(times.values())))
    rows = [
        (
            name,
            f"{statistics.median(v):.1f}",
            f"{pct(v, 0.9):.1f}",
            f"{statistics.median(v) / base:.2f}",
        )
        for name, v in times.items()
    ]
    return table(
        ("call (same assistant, same input)", "p50 ms", "p90 ms", "p50 vs runs.wait"), rows
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.mcp", description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=100, help="timed calls of each kind")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure in a private sandbox, print the table, always clean up."""
    args = parse_args(argv)
    if args.calls < 1:
        raise SystemExit("--calls: at least 1")

    def measure(urls: list[str], _roots: dict[str, list[int]], _s: Settings) -> Any:
        return asyncio.run(_measure(urls[0], args.calls))

    def body() -> None:
        times = on_cluster("mcp", measure)
        tokens = Settings.model_fields["builtin_tokens"].default
        print(f"threadrun MCP: {WEBS} web processes, 1 runs worker, {os.cpu_count()} CPUs")
        print(f"{args.calls} calls of each kind in turn, one at a time, {tokens} tokens per reply")
        print()
        print(report(times))

    return run_bench("mcp", body)


if __name__ == "__main__":
    raise SystemExit(main())
