"""Stream memory benchmark (B1, B3): Redis bytes per event and per run of the replay buffer.

Run with `.venv/bin/python -m bench.stream_memory [--runs 20] [--graph-config PATH]` (also
part of `make bench`). It runs the comparison benchmark's graph (../shared/bench: 200
message tokens + a tool step, stream modes `messages-tuple,values`: 206 events a run) in
process, turns its stream into events exactly as a worker does (workers/stream_modes.py,
shared/serde.py, the `metadata` first and the `end` last) and publishes each run through
the real publisher (EventSink -> PublishBatcher -> StreamPublisher -> publish.lua) under a
real lease, once per encoding:

- `json`: the data as published, one entry each (what every run stored before the
  compact encoding; `THREADRUN_STREAM_COMPRESS=false`);
- `deflate`: each entry deflated alone (no dictionaries);
- `dictionaries`: the default: per-run deflate dictionaries (shared/bridge/codec.py).

For each it prints `MEMORY USAGE` (SAMPLES 0: exact) of the stream key and of the meta
hash per run and per event, beside the raw payload (the sum of the JSON data bytes) and
the ratio; the encoder's CPU per event; and proves the replay exact: a subscriber from the
start and one from the middle get the very events published, byte for byte. A second
table says where the bytes of a `json` run go. It uses the Redis prefix
`trstreammem:<hex>:` (no database) and deletes exactly its keys at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aredis

from bench.chaos import table
from shared import serde
from shared.bridge.base import END_EVENT, Event
from shared.bridge.publisher import EventSink, PublishBatcher, StreamPublisher
from shared.bridge.subscriber import StreamSubscriber
from shared.redis_keys import Keys
from shared.runs.leases import LeaseManager, lease_value
from shared.settings import PROJECT_ROOT, Settings
from workers.stream_modes import StreamTranslator, graph_modes

DEFAULT_GRAPH = PROJECT_ROOT.parent / "shared" / "bench" / "bench_graph.py"
STREAM_MODES = ["messages-tuple", "values"]
WORKER = "bench-worker"
ENCODINGS = {
    "json": {"stream_compress": False},
    "deflate": {"stream_compress": True, "stream_dictionaries_max": 0},
    "dictionaries": {"stream_compress": True},
}
RUNS_PER_S = 23.0
"""The comparison benchmark's sustained runs/s on this machine (for the sizing line)."""


def load_graph(path: Path) -> Any:
    """The comparison benchmark's graph, imported from its file (read, never copied); where
    that benchmark is not beside the checkout (a fresh clone), our own lead agent with the
    built-in model, whose runs have the same shape (streamed tokens, a tool step)."""
    if not path.is_file():
        print(f"{path} not found: measuring the lead agent instead (--graph to choose)")
        from shared.agent.graphs import GraphRegistry

        return GraphRegistry.from_config(PROJECT_ROOT / "langgraph.json").get("lead_agent")
    spec = importlib.util.spec_from_file_location("bench_graph", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.graph


async def run_events(graph: Any, tokens: int) -> list[tuple[str, bytes]]:
    """One run's events as a worker publishes them (config as workers/executor.py builds it)."""
    from langgraph.checkpoint.memory import InMemorySaver

    g = graph.copy(update={"checkpointer": InMemorySaver()})
    run_id = str(uuid.uuid4())
    ids = {
        "thread_id": str(uuid.uuid4()),
        "run_id": run_id,
        "assistant_id": str(uuid.uuid4()),
        "graph_id": "bench",
        "user_id": "bench-user",
    }
    config = {
        "configurable": {**ids, "checkpoint_ns": "", "tokens": tokens},
        "metadata": {**ids, "attempt": 1},
    }
    translator = StreamTranslator(STREAM_MODES, subgraphs=False)
    out = [("metadata", serde.dumps({"run_id": run_id, "attempt": 1}))]
    inp = {"messages": [{"role": "user", "content": "bench request 0"}]}
    async for item in g.astream(inp, config, stream_mode=graph_modes(STREAM_MODES)):
        out.extend((name, serde.dumps(data)) for name, data in translator.events(item))
    out.append((END_EVENT, serde.dumps({"run_id": run_id, "status": "success"})))
    return out


@dataclass
class Result:
    encoding: str
    runs: int
    events: int
    raw_bytes: int
    stream_bytes: int
    meta_bytes: int
    encode_us: float
    replay_ms: float

    def cells(self) -> list[str]:
        per_run = (self.stream_bytes + self.meta_bytes) / self.runs
        return [
            self.encoding,
            f"{self.events / self.runs:.0f}",
            f"{self.raw_bytes / self.runs:,.0f}",
            f"{self.stream_bytes / self.runs:,.0f}",
            f"{self.meta_bytes / self.runs:,.0f}",
            f"{per_run:,.0f}",
            f"{per_run * self.runs / self.events:,.0f}",
            f"{per_run / (self.raw_bytes / self.runs):.2f}",
            f"{self.encode_us:.1f}",
            f"{self.replay_ms:.1f}",
        ]


HEADER = [
    "encoding",
    "events/run",
    "raw JSON B/run",
    "stream B/run",
    "meta B/run",
    "Redis B/run",
    "Redis B/event",
    "Redis/raw",
    "encode us/event",
    "replay ms/run",
]


async def publish_run(
    client: aredis.Redis, keys: Keys, s: Settings, events: list[tuple[str, bytes]]
) -> tuple[str, float]:
    """Publish one run through the real sink; its id and the encoder's seconds."""
    run_id = str(uuid.uuid4())
    assert await LeaseManager(client, keys, ttl_s=60).acquire(run_id, 1, WORKER)
    publisher = StreamPublisher(client, keys, s)
    lost: list[BaseException] = []
    sink = EventSink(
        PublishBatcher(publisher), run_id, lease_value(1, WORKER), lambda _a: None, lost.append
    )
    for name, data in events[:-1]:
        sink.emit(name, data)
        await asyncio.sleep(0)  # like an astream loop: one event per turn
    await sink.publish_end(events[-1][1])
    assert not lost, lost
    # The encoder's share, timed apart (the same work a fresh attempt's encoder does).
    t0 = time.perf_counter()
    publisher.encoder(lease_value(2, WORKER)).encode(events)
    return run_id, time.perf_counter() - t0


def check_replay(sub: StreamSubscriber, run_id: str, events: list[tuple[str, bytes]]) -> float:
    """Both replays give back exactly what was published; the full one's time in ms."""
    t0 = time.perf_counter()
    got = [i for i in sub.subscribe(run_id, "-1", is_terminal=lambda: True)]
    ms = (time.perf_counter() - t0) * 1000
    assert all(isinstance(i, Event) for i in got), got[-1]
    pairs = [(i.event, i.data.encode()) for i in got if isinstance(i, Event)]
    assert pairs == events, "replay from the start differs from what was published"
    mid = got[len(got) // 2]
    assert isinstance(mid, Event)
    rest = [i for i in sub.subscribe(run_id, mid.id, is_terminal=lambda: True)]
    tail = [(i.event, i.data.encode()) for i in rest if isinstance(i, Event)]
    assert tail == events[len(got) // 2 + 1 :], "replay from the middle differs"
    return ms


def memory(r: redis.Redis, key: str) -> int:
    return int(r.memory_usage(key, samples=0) or 0)


async def measure(
    name: str, base: Settings, runs: list[list[tuple[str, bytes]]], prefix: str
) -> tuple[Result, list[str]]:
    s = base.model_copy(update=ENCODINGS[name])
    keys = Keys(f"{prefix}{name}:")
    client = aredis.Redis.from_url(s.redis_url)
    sync = redis.Redis.from_url(s.redis_url)
    res = Result(name, 0, 0, 0, 0, 0, 0.0, 0.0)
    run_ids: list[str] = []
    spent = replay = 0.0
    try:
        sub = StreamSubscriber(sync, keys, s)
        for events in runs:
            run_id, cpu = await publish_run(client, keys, s, events)
            run_ids.append(run_id)
            spent += cpu
            replay += check_replay(sub, run_id, events)
            res.runs += 1
            res.events += len(events)
            res.raw_bytes += sum(len(d) for _, d in events)
            res.stream_bytes += memory(sync, keys.stream(run_id))
            res.meta_bytes += memory(sync, keys.stream_meta(run_id))
        res.encode_us = spent / res.events * 1e6
        res.replay_ms = replay / res.runs
    finally:
        await client.aclose()
        sync.close()
    return res, [k for rid in run_ids for k in (keys.stream(rid), keys.stream_meta(rid))]


def breakdown(base: Settings, events: list[tuple[str, bytes]], prefix: str) -> str:
    """Where the bytes of a plain JSON run go: entries with empty data cost the stream's own
    overhead; the rest is the payload, and most of a message chunk is its metadata."""
    r = redis.Redis.from_url(base.redis_url)
    key = f"{prefix}breakdown"
    try:
        for name, _ in events:
            r.xadd(key, {"e": name, "d": b"", "n": 1})
        empty = memory(r, key)
        r.delete(key)
        cfg = r.config_get("stream-node-*")
    finally:
        r.delete(key)
        r.close()
    chunks = [serde.loads(d) for n, d in events if n == "messages"]
    meta = sum(len(serde.dumps(c[1])) for c in chunks)
    whole = sum(len(d) for n, d in events if n == "messages")
    rows = [
        ["stream entries with empty data (ids, e, n, listpack, rax)", f"{empty:,}"],
        ["JSON data, all events", f"{sum(len(d) for _, d in events):,}"],
        [f"  of which {len(chunks)} `messages` chunks", f"{whole:,}"],
        ["    of which their metadata (the tuple's 2nd item)", f"{meta:,}"],
        [
            "Redis stream-node-max-bytes / -entries",
            f"{cfg.get('stream-node-max-bytes')} / {cfg.get('stream-node-max-entries')}",
        ],
    ]
    return table(["one 206-event run", "bytes"], rows)


def sizing(res: Result, ttl_s: int, run_s: float) -> str:
    per_run = (res.stream_bytes + res.meta_bytes) / res.runs
    held = per_run * RUNS_PER_S * (run_s + ttl_s)
    return (
        f"{res.encoding}: {per_run:,.0f} B/run x {RUNS_PER_S:g} runs/s x ({run_s:g} s run"
        f" + {ttl_s} s retention) = {held / 1e6:,.0f} MB"
    )


async def amain(args: argparse.Namespace) -> int:
    base = Settings()
    graph = load_graph(Path(args.graph))
    runs = [await run_events(graph, args.tokens) for _ in range(args.runs)]
    prefix = f"trstreammem:{uuid.uuid4().hex[:8]}:"
    results: list[Result] = []
    keys: list[str] = []
    sync = redis.Redis.from_url(base.redis_url)
    try:
        for name in ENCODINGS:
            res, made = await measure(name, base, runs, prefix)
            keys.extend(made)
            results.append(res)
        print(f"{args.runs} runs of {len(runs[0])} events ({args.tokens} tokens + a tool step)")
        print(table(HEADER, [r.cells() for r in results]))
        print()
        print(breakdown(base, runs[0], prefix))
        print()
        print("Redis held at steady state (docs/operations.md):")
        for res, ttl in ((results[0], 3600), (results[-1], base.stream_ttl_after_end_s)):
            print("  " + sizing(res, ttl, args.run_s))
        if args.json:
            Path(args.json).write_text(json.dumps([r.__dict__ for r in results], indent=2))
    finally:
        if keys:
            sync.delete(*keys)
        sync.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--graph", default=str(DEFAULT_GRAPH), help="bench_graph.py")
    parser.add_argument("--run-s", type=float, default=1.0, help="run duration for the sizing line")
    parser.add_argument("--json", help="write the results here")
    return asyncio.run(amain(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
