"""Streams benchmark: the web server model (gevent vs gthread) on latency, rate and idle capacity.

Run with `.venv/bin/python -m bench.streams [--models gevent,gthread] [--threads 64]
[--idle 5000] [--json PATH]`. For each server model it starts a private cluster with
shared.tools.testing (one gunicorn web process configured by app/gunicorn_conf.py with
`THREADRUN_WEB_WORKER_CLASS`, one Celery runs worker) on a database
`threadrun_streams_<hex>` and the Redis key prefix `trstreams:<hex>:`, and at the end stops
every process it started, drops exactly that database and deletes exactly those keys, also
on Ctrl-C, SIGTERM or a failure. One table compares the models.

Latency is end to end: a `messages` event's stream id carries Redis's clock (ms) at XADD;
the client compares it with its own wall clock on receipt (same machine, same clock; the
id has 1 ms resolution, so every figure carries up to 1 ms of truncation).

1. Latency: `--rounds` runs of `lead_agent` (200 tokens, 10 ms apart), each followed live by
   one WebSocket client (`run.join`) and one SSE client at once, beside a raw XADD (every
   10 ms) -> XREAD BLOCK reader thread measured the same way at the same time. Each measured
   run is queued (enqueue) behind a 1 s blocker run on its thread so both clients are
   subscribed before its first event: nothing is replayed.
2. Throughput: one run of 20,000 tokens without delay to one SSE client (events/s from its
   first to its last token), beside pipelined XADD (100 per pipeline) of as many events of
   the same size to one XREAD reader.
3. Connections: 100 streaming WebSocket clients (each `run.join`s one of 5 long runs), then
   `--idle` idle connections, half WebSocket (handshake only) and half SSE (joined to a run
   at the model's slowest pace, a token every 2 s, and heartbeats), opened 100 at a time from one
   asyncio loop with a 3 s handshake timeout. Reports how many connected and the errors,
   the streaming clients' token latency before, while and after the idle ones open (the
   first SETTLE_S after, while the opening burst's backlog drains, then a window), the web
   worker's RSS (/proc) -> memory per connection, and its CPU while they are open.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
from websockets.sync.client import ClientConnection, connect

from bench.chaos import bench_cluster, log, run_body, table
from bench.internals import _raise_interrupt, percentile, signals_ignored
from bench.system_cpu import logged_and_stopped
from shared.agent.model import MAX_TOKEN_DELAY_MS
from shared.settings import Settings
from shared.tools.testing import Cluster, Proc, Sandbox, iter_sse, open_stream

LAT_TOKENS, LAT_DELAY_MS = 200, 10
BLOCKER_TOKENS = 100  # x 10 ms: the measured run waits ~1 s behind it
TPUT_TOKENS = 20000
STREAMING_SOCKETS, STREAMING_RUNS = 100, 5
OPEN_CONCURRENCY, OPEN_TIMEOUT_S, OPEN_DEADLINE_S = 100, 3.0, 45.0
# The idle SSE clients' run: the model's slowest pace (one token every 2 s; a minute, as
# before, is over its limit and failed the run at once), for longer than the bench lasts.
IDLE_RUN_DELAY_MS = MAX_TOKEN_DELAY_MS
IDLE_RUN_TOKENS = 900  # 30 min; cancelled at the end
MODELS = ("gevent", "gthread")
WINDOW_S = 4.0  # latency window before / while the idle sockets are open
SETTLE_S = 4.0  # after the idle ones opened: the backlog of the opening burst drains first


def id_ms(eid: str) -> int:
    return int(str(eid).split("-")[0])


def ms_stats(xs: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(xs),
        "p50_ms": percentile(xs, 50) if xs else None,
        "p99_ms": percentile(xs, 99) if xs else None,
        "max_ms": max(xs) if xs else None,
    }


def f(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def web_worker_pid(web: Proc) -> int:
    """gunicorn's (single) worker process: the master's child."""
    kids = web.children()
    return kids[0] if kids else web.pid


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def start_model(c: Cluster, worker_class: str, threads: int) -> Proc:
    """One gunicorn worker process of `worker_class` (gthread: `threads` threads)."""
    c.start_web(
        {
            "THREADRUN_WEB_WORKER_CLASS": worker_class,
            "THREADRUN_WEB_THREADS": str(threads),
        }
    )
    return next(p for p in c.procs if p.role == "web")


# --- clients ------------------------------------------------------------------------------------------
@dataclass
class Tokens:
    """Receipt of one client: (receive wall s, latency ms) per live `messages` event."""

    samples: list[tuple[float, float]] = field(default_factory=list)
    end: str = ""
    error: str = ""
    sample_bytes: int = 0

    def lat(self, t0: float = 0.0, t1: float = float("inf")) -> list[float]:
        return [ms for t, ms in self.samples if t0 <= t < t1]


def ws_url(base: str, tid: str) -> str:
    return base.replace("http://", "ws://") + f"/threads/{tid}/ws"


def ws_follow(ws: ClientConnection, run_id: str, out: Tokens, deadline: float) -> None:
    """Join `run_id` and record each live `messages` event until its end (or the deadline)."""
    join_ms = time.time() * 1000.0
    ws.send(
        json.dumps(
            {
                "type": "run.join",
                "run_id": run_id,
                "last_event_id": "-1",
                "stream_mode": ["messages-tuple"],
            }
        )
    )
    try:
        while time.time() < deadline:
            try:
                raw = ws.recv(timeout=max(0.1, deadline - time.time()))
            except TimeoutError:
                break
            now = time.time()
            frame = json.loads(raw)
            kind = frame.get("type")
            if kind == "event" and frame.get("event") == "messages":
                ms = id_ms(frame["id"])
                if ms >= join_ms - 1:  # live, not replayed before we joined
                    out.samples.append((now, now * 1000.0 - ms))
            elif kind in ("end", "gap", "error"):
                out.end = kind if kind != "end" else frame.get("status", "end")
                if kind != "end":
                    out.error = json.dumps(frame)[:200]
                return
    except Exception as exc:  # noqa: BLE001 - reported in the table
        out.error = repr(exc)[:200]


def sse_follow(base: str, tid: str, run_id: str, out: Tokens, deadline: float) -> None:
    try:
        timeout = httpx.Timeout(10, read=max(1.0, deadline - time.time()))
        params = {"stream_mode": "messages-tuple"}
        with (
            httpx.Client(base_url=base, timeout=timeout) as client,
            open_stream(client, tid, run_id, params=params) as res,
        ):
            for e in iter_sse(res.iter_lines(), heartbeats=True):
                now = time.time()
                if e.event == "messages":
                    out.samples.append((now, now * 1000.0 - id_ms(e.id)))
                    out.sample_bytes = out.sample_bytes or len(e.text)
                elif e.event in ("end", "gap"):
                    out.end = e.event
                    return
                if time.time() > deadline:
                    out.error = "deadline"
                    return
    except Exception as exc:  # noqa: BLE001 - reported in the table
        out.error = repr(exc)[:200]


def raw_latency(r: redis.Redis, key: str, n: int, delay_ms: float, out: Tokens) -> None:
    """XADD every `delay_ms` from this thread; a reader thread XREAD BLOCKs and timestamps."""
    done = threading.Event()

    def reader() -> None:
        last = "$"
        got = 0
        while got < n and not done.is_set():
            res = r.xread({key: last}, block=1000, count=100)
            now = time.time()
            for _, entries in res or []:
                for eid, _ in entries:
                    last = eid.decode()
                    out.samples.append((now, now * 1000.0 - id_ms(last)))
                    got += 1

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    time.sleep(0.05)
    payload = "x" * 300
    for _ in range(n):
        r.xadd(key, {"d": payload})
        time.sleep(delay_ms / 1000.0)
    t.join(timeout=5)
    done.set()
    t.join(timeout=2)


def raw_throughput(r: redis.Redis, key: str, n: int, size: int) -> tuple[float, int]:
    """Pipelined XADD (100 per pipeline) -> one XREAD reader; events/s first send -> last read."""
    got = [0]

    def reader() -> None:
        last = "0-0"
        end = time.monotonic() + 60
        while got[0] < n and time.monotonic() < end:
            res = r.xread({key: last}, block=1000, count=1000)
            for _, entries in res or []:
                got[0] += len(entries)
                last = entries[-1][0].decode()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    payload = "x" * max(1, size)
    t0 = time.perf_counter()
    for i in range(0, n, 100):
        with r.pipeline(transaction=False) as p:
            for _ in range(min(100, n - i)):
                p.xadd(key, {"d": payload})
            p.execute()
    t.join(timeout=60)
    wall = time.perf_counter() - t0
    return (got[0] / wall if wall else 0.0), got[0]


# --- the cluster operations --------------------------------------------------------------------------
def new_thread(client: httpx.Client) -> str:
    return str(client.post("/threads", json={}).json()["thread_id"])


def start_run(
    client: httpx.Client, tid: str, tokens: int, delay_ms: float, text: str = "bench"
) -> str:
    res = client.post(
        f"/threads/{tid}/runs",
        json=run_body(text, tokens, delay_ms, multitask_strategy="enqueue"),
    )
    res.raise_for_status()
    return str(res.json()["run_id"])


def cancel(client: httpx.Client, tid: str, run_id: str) -> None:
    with contextlib.suppress(httpx.HTTPError):
        client.post(
            f"/threads/{tid}/runs/{run_id}/cancel", params={"action": "interrupt"}, timeout=10
        )


def measure_latency(c: Cluster, rounds: int) -> dict[str, Tokens]:
    r = redis.Redis.from_url(c.settings.redis_url)
    out = {"ws": Tokens(), "sse": Tokens(), "raw": Tokens()}
    try:
        with httpx.Client(base_url=c.url, timeout=30) as client:
            for i in range(rounds):
                log(f"streams: latency round {i + 1}/{rounds}")
                tid = new_thread(client)
                start_run(client, tid, BLOCKER_TOKENS, LAT_DELAY_MS, "blocker")
                run_id = start_run(client, tid, LAT_TOKENS, LAT_DELAY_MS)
                deadline = time.time() + 30
                ws_out, sse_out, raw_out = Tokens(), Tokens(), Tokens()
                with connect(ws_url(c.url, tid), open_timeout=10) as ws:
                    tw = threading.Thread(target=ws_follow, args=(ws, run_id, ws_out, deadline))
                    ts = threading.Thread(
                        target=sse_follow, args=(c.url, tid, run_id, sse_out, deadline)
                    )
                    tw.start()
                    ts.start()
                    time.sleep(0.8)  # the blocker streams; the raw baseline overlaps the run
                    key = f"{c.settings.redis_prefix}bench:raw-lat:{i}"
                    raw_latency(r, key, LAT_TOKENS, LAT_DELAY_MS, raw_out)
                    tw.join(timeout=max(0.1, deadline - time.time()))
                    ts.join(timeout=max(0.1, deadline - time.time()))
                for k, v in (("ws", ws_out), ("sse", sse_out), ("raw", raw_out)):
                    out[k].samples += v.samples
                    out[k].error = out[k].error or v.error
                    out[k].end = v.end or out[k].end
                out["sse"].sample_bytes = sse_out.sample_bytes or out["sse"].sample_bytes
    finally:
        r.close()
    return out


def measure_throughput(c: Cluster, tokens: int, size: int) -> dict[str, Any]:
    log(f"streams: throughput, {tokens} tokens")
    with httpx.Client(base_url=c.url, timeout=30) as client:
        tid = new_thread(client)
        start_run(client, tid, BLOCKER_TOKENS, LAT_DELAY_MS, "blocker")
        run_id = start_run(client, tid, tokens, 0)
        out = Tokens()
        sse_follow(c.url, tid, run_id, out, time.time() + 120)
        if out.end != "end":
            cancel(client, tid, run_id)
    ts = [t for t, _ in out.samples]
    span = (ts[-1] - ts[0]) if len(ts) > 1 else 0.0
    r = redis.Redis.from_url(c.settings.redis_url)
    try:
        raw_rate, raw_n = raw_throughput(
            r, f"{c.settings.redis_prefix}bench:raw-tput", tokens, size
        )
    finally:
        r.close()
    return {
        "sse_events": len(ts),
        "sse_end": out.end or out.error,
        "sse_events_per_s": (len(ts) - 1) / span if span else 0.0,
        "sse_lat": ms_stats(out.lat()),
        "raw_events": raw_n,
        "raw_events_per_s": raw_rate,
        "event_bytes": size,
    }


class IdleHolder:
    """Idle connections held open on one asyncio loop in a thread (no thread per socket).

    A WebSocket counts once the server answered 101; an SSE stream once it answered 200 with
    its first bytes. Neither is read any further: they sit idle until `close()`.
    """

    def __init__(self, base: str) -> None:
        host, port = base.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.loop = asyncio.new_event_loop()
        self.held: dict[str, list[asyncio.StreamWriter]] = {"ws": [], "sse": []}
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def _request(self, kind: str, path: str) -> bytes:
        head = f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if kind == "ws":
            key = base64.b64encode(os.urandom(16)).decode()
            head += (
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            )
        else:
            head += "Accept: text/event-stream\r\nLast-Event-ID: -1\r\n"
        return (head + "\r\n").encode()

    async def _one(self, kind: str, path: str, errors: Counter[str], end: float) -> None:
        if time.monotonic() > end:
            errors[f"{kind}: skipped (phase deadline)"] += 1
            return
        writer = None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), OPEN_TIMEOUT_S
            )
            writer.write(self._request(kind, path))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), OPEN_TIMEOUT_S)
            status = int(head.split(b" ", 2)[1])
            if status != (101 if kind == "ws" else 200):
                errors[f"{kind}: HTTP {status}"] += 1
                writer.close()
                return
            if kind == "sse":
                await asyncio.wait_for(reader.read(1), OPEN_TIMEOUT_S)  # the stream is live
        except Exception as exc:  # noqa: BLE001 - counted by type
            errors[f"{kind}: {type(exc).__name__}"] += 1
            if writer is not None:
                writer.close()
            return
        self.held[kind].append(writer)

    async def _open(self, plan: list[tuple[str, str]]) -> Counter[str]:
        errors: Counter[str] = Counter()
        end = time.monotonic() + OPEN_DEADLINE_S
        gate = asyncio.Semaphore(OPEN_CONCURRENCY)

        async def gated(kind: str, path: str) -> None:
            async with gate:
                await self._one(kind, path, errors, end)

        await asyncio.gather(*(gated(k, p) for k, p in plan))
        return errors

    def open(self, plan: list[tuple[str, str]]) -> tuple[Counter[str], float]:
        """Open every (kind, path) of `plan`; (errors by kind and type, seconds)."""
        t0 = time.perf_counter()
        errors = asyncio.run_coroutine_threadsafe(self._open(plan), self.loop).result()
        return errors, time.perf_counter() - t0

    def close(self) -> None:
        """Close every held connection and stop the loop."""

        async def close_all() -> None:
            for writers in self.held.values():
                for w in writers:
                    w.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close_all(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def measure_connections(c: Cluster, idle: int, web_pid: int, delay_ms: float) -> dict[str, Any]:
    res: dict[str, Any] = {"idle_requested": idle, "streaming_requested": STREAMING_SOCKETS}
    streams: list[ClientConnection] = []
    holder: IdleHolder | None = None
    followers: list[tuple[threading.Thread, Tokens]] = []
    runs: list[tuple[str, str]] = []
    with httpx.Client(base_url=c.url, timeout=30) as client:
        try:
            res["rss_mb_start"] = rss_mb(web_pid)
            res["threads_start"] = threads_of(web_pid)
            # long enough for the whole phase; cancelled at the end
            tokens = int((2 * WINDOW_S + SETTLE_S + OPEN_DEADLINE_S + 30) * 1000 / delay_ms)
            res["token_delay_ms"] = delay_ms
            for i in range(STREAMING_RUNS):
                tid = new_thread(client)
                runs.append((tid, start_run(client, tid, tokens, delay_ms, f"long {i}")))
            idle_tid = new_thread(client)
            idle_run = start_run(client, idle_tid, IDLE_RUN_TOKENS, IDLE_RUN_DELAY_MS, "idle")
            runs.append((idle_tid, idle_run))
            log(f"streams: {STREAMING_SOCKETS} streaming sockets on {STREAMING_RUNS} runs")
            deadline = time.time() + 2 * WINDOW_S + SETTLE_S + OPEN_DEADLINE_S + 20
            errs: Counter[str] = Counter()
            lock = threading.Lock()

            def open_streaming(i: int) -> None:
                tid, run_id = runs[i % STREAMING_RUNS]
                try:
                    ws = connect(
                        ws_url(c.url, tid),
                        open_timeout=OPEN_TIMEOUT_S,
                        close_timeout=1,
                        legacy=True,
                    )
                except Exception as exc:  # noqa: BLE001 - counted by type
                    with lock:
                        errs[type(exc).__name__] += 1
                    return
                tok = Tokens()
                th = threading.Thread(
                    target=ws_follow, args=(ws, run_id, tok, deadline), daemon=True
                )
                th.start()
                with lock:
                    streams.append(ws)
                    followers.append((th, tok))

            with ThreadPoolExecutor(OPEN_CONCURRENCY) as pool:
                list(pool.map(open_streaming, range(STREAMING_SOCKETS)))
            res["streaming_connected"] = len(streams)
            res["streaming_errors"] = dict(errs)
            t_before = time.time()
            cpu0 = cpu_s(web_pid)
            time.sleep(WINDOW_S)
            res["web_cpu_pct_streaming"] = 100 * (cpu_s(web_pid) - cpu0) / (time.time() - t_before)
            res["rss_mb_streaming"] = rss_mb(web_pid)
            res["threads_streaming"] = threads_of(web_pid)
            t_open = time.time()
            log(f"streams: opening {idle} idle connections (WebSocket and SSE)")
            holder = IdleHolder(c.url)
            plan = [
                ("ws", f"/threads/{idle_tid}/ws")
                if i % 2 == 0
                else ("sse", f"/threads/{idle_tid}/runs/{idle_run}/stream")
                for i in range(idle)
            ]
            ierrs, open_s = holder.open(plan)
            res["idle_ws_connected"] = len(holder.held["ws"])
            res["idle_sse_connected"] = len(holder.held["sse"])
            res["idle_connected"] = res["idle_ws_connected"] + res["idle_sse_connected"]
            res["idle_errors"] = dict(ierrs)
            res["idle_open_s"] = open_s
            t_opened = time.time()
            time.sleep(SETTLE_S)
            t_idle = time.time()
            cpu0 = cpu_s(web_pid)
            time.sleep(WINDOW_S)
            t_after = time.time()
            res["web_cpu_pct_idle_open"] = 100 * (cpu_s(web_pid) - cpu0) / (t_after - t_idle)
            res["rss_mb_idle"] = rss_mb(web_pid)
            res["threads_idle"] = threads_of(web_pid)
            toks = [tok for _, tok in followers]
            res["lat_before"] = ms_stats([x for t in toks for x in t.lat(t_before, t_open)])
            res["lat_opening"] = ms_stats([x for t in toks for x in t.lat(t_open, t_opened)])
            res["lat_settling"] = ms_stats([x for t in toks for x in t.lat(t_opened, t_idle)])
            res["lat_idle_open"] = ms_stats([x for t in toks for x in t.lat(t_idle, t_after)])
            res["streaming_failed_midway"] = sum(1 for t in toks if t.error)
            res["streaming_errors_midway"] = [t.error for t in toks if t.error][:3]
        finally:
            if holder is not None:
                holder.close()
            for ws in streams:
                with contextlib.suppress(Exception):
                    ws.close()
            for th, _ in followers:
                th.join(timeout=2)
            for tid, run_id in runs:
                cancel(client, tid, run_id)
    s0, s1, s2 = (res.get(k) for k in ("rss_mb_start", "rss_mb_streaming", "rss_mb_idle"))
    if s1 and res.get("streaming_connected"):
        res["kb_per_streaming_socket"] = (s1 - s0) * 1024 / res["streaming_connected"]
    if s2 and res.get("idle_connected"):
        res["kb_per_idle_connection"] = (s2 - s1) * 1024 / res["idle_connected"]
    return res


# --- report -------------------------------------------------------------------------------------------
@dataclass
class ModelResult:
    """Every figure of one server model's cluster."""

    model: str
    threads: int
    lat: dict[str, Tokens]
    tput: dict[str, Any]
    conns: dict[str, Any]

    @property
    def label(self) -> str:
        return f"gthread ({self.threads} threads)" if self.model == "gthread" else self.model

    def latency_cell(self, key: str) -> str:
        s, raw = ms_stats(self.lat[key].lat()), ms_stats(self.lat["raw"].lat())
        cell = f"{f(s['p50_ms'])} / {f(s['p99_ms'])}"
        if key != "raw" and s["p50_ms"] is not None and raw["p50_ms"]:
            cell += f" ({s['p50_ms'] / raw['p50_ms']:.1f}x raw p50)"
        if self.lat[key].error:
            cell += f" [error: {self.lat[key].error[:60]}]"
        return cell


def comparison_table(results: list[ModelResult], idle: int) -> str:
    """One row per figure, one column per server model."""

    def row(label: str, cell: Any) -> list[str]:
        return [label, *(cell(r) for r in results)]

    def conn(r: ModelResult, key: str, fmt: str = ".0f") -> str:
        return f(r.conns.get(key), fmt)

    def lat(r: ModelResult, key: str) -> str:
        s = r.conns.get(key) or {}
        return f"{f(s.get('p50_ms'))} / {f(s.get('p99_ms'))} (n={s.get('n', 0)})"

    def errs(r: ModelResult) -> str:
        d = r.conns.get("idle_errors") or {}
        return ", ".join(f"{k} x{v}" for k, v in d.items()) or "none"

    rows = [
        row("publish -> WebSocket p50 / p99 ms", lambda r: r.latency_cell("ws")),
        row("publish -> SSE p50 / p99 ms", lambda r: r.latency_cell("sse")),
        row("raw XADD -> XREAD BLOCK p50 / p99 ms", lambda r: r.latency_cell("raw")),
        row(
            "one stream to SSE, events/s",
            lambda r: f"{r.tput['sse_events_per_s']:,.0f} ({r.tput['sse_end']})",
        ),
        row(
            "raw pipelined XADD -> XREAD, events/s",
            lambda r: f"{r.tput['raw_events_per_s']:,.0f}",
        ),
        row(
            f"idle connections held, of {idle} (WS + SSE)",
            lambda r: (
                f"{r.conns.get('idle_connected', 0)}"
                f" ({r.conns.get('idle_ws_connected', 0)} + {r.conns.get('idle_sse_connected', 0)})"
                f" in {r.conns.get('idle_open_s', 0):.1f} s"
            ),
        ),
        row("idle open errors", errs),
        row(
            f"streaming WS sockets connected, of {STREAMING_SOCKETS}",
            lambda r: str(r.conns.get("streaming_connected", 0)),
        ),
        row(
            "web RSS MB: start / +streaming / +idle",
            lambda r: (
                f"{conn(r, 'rss_mb_start', '.1f')} / {conn(r, 'rss_mb_streaming', '.1f')}"
                f" / {conn(r, 'rss_mb_idle', '.1f')}"
            ),
        ),
        row("KB per idle connection", lambda r: conn(r, "kb_per_idle_connection")),
        row("KB per streaming socket", lambda r: conn(r, "kb_per_streaming_socket")),
        row(
            "web OS threads: start / streaming / idle",
            lambda r: (
                f"{r.conns.get('threads_start')} / {r.conns.get('threads_streaming')}"
                f" / {r.conns.get('threads_idle')}"
            ),
        ),
        row(
            "web CPU %: streaming only / + idle open",
            lambda r: f"{conn(r, 'web_cpu_pct_streaming')} / {conn(r, 'web_cpu_pct_idle_open')}",
        ),
        row("streaming token p50 / p99 ms, before idle", lambda r: lat(r, "lat_before")),
        row("  ... while opening the idle ones", lambda r: lat(r, "lat_opening")),
        row(f"  ... the first {SETTLE_S:g} s after", lambda r: lat(r, "lat_settling")),
        row(f"  ... the {WINDOW_S:g} s after that", lambda r: lat(r, "lat_idle_open")),
        row(
            "streaming sockets that failed midway",
            lambda r: str(r.conns.get("streaming_failed_midway", 0)),
        ),
    ]
    return table(["figure", *(r.label for r in results)], rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.streams", description=__doc__.splitlines()[0])
    p.add_argument(
        "--models",
        default=",".join(MODELS),
        help="comma-separated gunicorn worker classes to compare (gevent,gthread)",
    )
    p.add_argument("--threads", type=int, default=64, help="gthread threads (64)")
    p.add_argument(
        "--idle", type=int, default=5000, help="idle connections, half WS half SSE (5000)"
    )
    p.add_argument("--rounds", type=int, default=3, help="latency runs of 200 tokens (3)")
    p.add_argument("--tokens", type=int, default=TPUT_TOKENS, help="throughput run's tokens")
    p.add_argument(
        "--conn-delay-ms",
        type=float,
        default=50,
        help="token_delay_ms of the 5 runs the streaming sockets follow (50: 20 tokens/s each)",
    )
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    p.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in args.models if m not in MODELS]
    if bad or not args.models:
        p.error(f"--models: choose from {', '.join(MODELS)}; got {args.models}")
    return args


def measure_model(
    settings: Settings, workdir: Path, model: str, args: argparse.Namespace
) -> ModelResult:
    """Start a cluster with this server model, measure, stop it."""
    cluster = bench_cluster(settings, workdir)
    with logged_and_stopped(cluster, (BaseException,)):
        log(f"streams: {model}: starting web and worker (logs {workdir})")
        web = start_model(cluster, model, args.threads)
        cluster.start_worker("worker1")
        web_pid = web_worker_pid(web)
        lat = measure_latency(cluster, args.rounds)
        tput = measure_throughput(cluster, args.tokens, lat["sse"].sample_bytes or 300)
        conns = measure_connections(cluster, args.idle, web_pid, args.conn_delay_ms)
        return ModelResult(model, args.threads, lat, tput, conns)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.getLogger("websockets").setLevel(logging.CRITICAL)  # client EOFs on failed opens
    workdir = Path(tempfile.mkdtemp(prefix="threadrun-streams-"))
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    started = time.time()
    rc = 0
    results: list[ModelResult] = []
    try:
        for model in args.models:
            # A sandbox per model: runs the first cluster left behind never reach the second.
            sandbox = Sandbox(Settings(), "streams")
            log(f"streams: {model}: database {sandbox.db_name}, redis prefix {sandbox.prefix}")
            try:
                (workdir / model).mkdir()
                results.append(measure_model(sandbox.create(), workdir / model, model, args))
            finally:
                with signals_ignored():
                    try:
                        deleted = sandbox.destroy()
                        log(
                            f"streams: dropped {sandbox.db_name}, deleted {deleted} keys under"
                            f" {sandbox.prefix}"
                        )
                    except Exception as exc:  # noqa: BLE001 - say exactly what is left behind
                        log(
                            f"streams: CLEANUP FAILED ({exc}); drop {sandbox.db_name} and"
                            f" {sandbox.prefix}*"
                        )
                        rc = rc or 1
        cpus = len(os.sched_getaffinity(0))
        print(
            f"threadrun streams: one gunicorn worker process per model, 1 runs worker, {cpus}"
            f" cpus, clients on the same machine, {time.time() - started:.0f} s"
        )
        print()
        print(comparison_table(results, args.idle))
        if args.json is not None:
            report = {
                "meta": {
                    "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                    "elapsed_s": round(time.time() - started, 1),
                    "python": platform.python_version(),
                    "cpus": cpus,
                    "threads": args.threads,
                    "idle": args.idle,
                    "rounds": args.rounds,
                },
                "models": {
                    r.model: {
                        "latency": {
                            k: {**ms_stats(v.lat()), "error": v.error or None}
                            for k, v in r.lat.items()
                        },
                        "throughput": r.tput,
                        "connections": r.conns,
                    }
                    for r in results
                },
            }
            args.json.write_text(json.dumps(report, indent=2) + "\n")
            log(f"streams: wrote {args.json}")
    except KeyboardInterrupt:
        log("streams: interrupted")
        rc = 130
    except Exception as exc:  # noqa: BLE001 - report, then clean up
        log(f"streams: failed: {exc!r}")
        rc = 1
    finally:
        if args.keep_logs:
            log(f"streams: logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        signal.signal(signal.SIGTERM, old_term)
    return rc


if __name__ == "__main__":
    sys.exit(main())
