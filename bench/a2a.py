"""A2A's first token beside the REST API's, on the same assistant and input, in the same run.

Run with `.venv/bin/python -m bench.a2a [--runs 60] [--tokens 50]`. It starts two web
processes and one runs worker (the `make run` shape) on a private database and Redis prefix,
makes one assistant of the built-in model (`tokens`, no delay), warms up, then alternates:

- A2A: the `a2a-sdk` 1.x client's streaming send (`SendStreamingMessage`) on
  `/a2a/{assistant_id}`, a new context each time; timed from the call to the first artifact
  update (the first AI text chunk), and to the final status;
- REST (the baseline): the official `langgraph-sdk`'s `runs.stream` on a new thread
  (`if_not_exists="create"`, `messages-tuple`); timed from the call to the first `messages`
  event with AI text, and to the stream's end.

Both are read to their end. The ratio is A2A over REST: what the protocol's edge costs over
the REST path on the same runs (admission, bridge and subscriber are the same code).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest
from langgraph_sdk import get_client

from bench.chaos import table
from bench.system_cpu import WEBS, on_cluster, run_bench
from shared.settings import Settings

WARMUP = 5


@dataclass
class Timings:
    """Seconds to the first token and to the end, per side."""

    a2a_first: list[float]
    a2a_end: list[float]
    rest_first: list[float]
    rest_end: list[float]


async def a2a_once(client: object, text: str) -> tuple[float, float]:
    """(first artifact chunk, final status) of one streamed A2A send, in seconds."""
    message = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)])
    t0 = time.perf_counter()
    first = None
    async for response in client.send_message(SendMessageRequest(message=message)):  # type: ignore[attr-defined]
        if first is None and response.HasField("artifact_update"):
            first = time.perf_counter() - t0
    end = time.perf_counter() - t0
    assert first is not None, "no artifact update"
    return first, end


async def rest_once(sdk: object, assistant_id: str, text: str) -> tuple[float, float]:
    """(first AI `messages` event, end) of one `runs.stream`, in seconds."""
    t0 = time.perf_counter()
    first = None
    async for part in sdk.runs.stream(  # type: ignore[attr-defined]
        str(uuid.uuid4()),
        assistant_id,
        input={"messages": [{"role": "user", "content": text}]},
        stream_mode="messages-tuple",
        if_not_exists="create",
    ):
        if first is None and part.event == "messages" and part.data[0].get("content"):
            first = time.perf_counter() - t0
    end = time.perf_counter() - t0
    assert first is not None, "no messages event"
    return first, end


async def measure(url: str, runs: int, tokens: int) -> Timings:
    """Alternate the two sides on one assistant, after a warm-up of each."""
    sdk = get_client(url=url, api_key=None)
    config = {"configurable": {"tokens": tokens, "token_delay_ms": 0}}
    assistant = await sdk.assistants.create("lead_agent", config=config, name="bench a2a")
    aid = assistant["assistant_id"]
    http = httpx.AsyncClient(timeout=120)
    client = await ClientFactory(ClientConfig(httpx_client=http)).create_from_url(
        f"{url}/a2a/{aid}"
    )
    out = Timings([], [], [], [])
    try:
        for i in range(WARMUP):
            await a2a_once(client, f"warm {i}")
            await rest_once(sdk, aid, f"warm {i}")
        for i in range(runs):  # interleaved, so machine noise hits both sides alike
            first, end = await a2a_once(client, f"first token {i}")
            out.a2a_first.append(first)
            out.a2a_end.append(end)
            first, end = await rest_once(sdk, aid, f"first token {i}")
            out.rest_first.append(first)
            out.rest_end.append(end)
    finally:
        await http.aclose()
        await sdk.http.client.aclose()
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(t: Timings, runs: int, tokens: int) -> str:
    """The table: p50/p90 ms of each side and the A2A/REST ratio of the p50s."""
    rows = []
    for name, ours, base in (
        ("first token", t.a2a_first, t.rest_first),
        ("whole stream", t.a2a_end, t.rest_end),
    ):
        rows.append(
            (
                name,
                f"{1000 * pct(ours, 0.5):.1f}",
                f"{1000 * pct(ours, 0.9):.1f}",
                f"{1000 * pct(base, 0.5):.1f}",
                f"{1000 * pct(base, 0.9):.1f}",
                f"{pct(ours, 0.5) / pct(base, 0.5):.2f}x",
            )
        )
    head = ("C=1", "A2A p50 ms", "A2A p90 ms", "REST p50 ms", "REST p90 ms", "A2A/REST p50")
    return f"{runs} runs per side, {tokens} tokens each, alternated\n\n" + table(head, rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.a2a", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=60, help="timed runs per side")
    p.add_argument("--tokens", type=int, default=50, help="built-in model tokens per run")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure in a private sandbox, print the table, always clean up."""
    args = parse_args(argv)
    if args.runs < 1:
        raise SystemExit("--runs: at least 1")

    def body() -> None:
        def go(urls: list[str], _roots: dict[str, list[int]], _settings: Settings) -> Timings:
            return asyncio.run(measure(urls[0], args.runs, args.tokens))

        timings = on_cluster("a2a", go)
        print(
            f"threadrun A2A first token: {WEBS} web processes, 1 runs worker, {os.cpu_count()} CPUs"
        )
        print()
        print(report(timings, args.runs, args.tokens))

    return run_bench("a2a", body)


if __name__ == "__main__":
    raise SystemExit(main())
