"""Journal benchmark: events/s the run event store accepts, beside raw INSERT / COPY in the same run.

Run with `.venv/bin/python -m bench.journal_bench [--events 5000] [--rounds 3]`. It
creates a private database `threadrun_jbench_<hex>` on the server of
THREADRUN_DATABASE_URL (default postgresql://postgres@127.0.0.1:5432), runs our
migrations on it, and drops exactly that database at the end, also on Ctrl-C, SIGTERM
or a failure.

Single-writer rows time ours and the baseline call by call, alternately, so noise from
anything else on the machine hits both alike; the 4-writer row (contention on one run
is its point) runs each side alone, alternating which goes first by round. Same pool,
same payloads (a ~300-byte tool result, serialised by `shared.serde` on both sides).
events/s is the median over rounds, `ratio` is ours / baseline events/s (higher is
better; 1.00 = our layer costs nothing measurable). `--async-commit` sets
synchronous_commit = off in the bench database, which takes the disk flush of each
commit out and leaves the cost of our layer itself. The baselines insert precomputed seqs
into other runs: they pay neither seq allocation nor truncation checks, which is
exactly what the ratio prices.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from shared import serde
from shared.db import DictPool, make_pool
from shared.journal import RunEvent, RunEventStore, RunJournal
from shared.runs.model import MultitaskStrategy, RunRequest
from shared.runs.store import RunStore
from shared.settings import Settings
from shared.tools.testing import Sandbox

OWNER = "bench-user"
COLUMNS = "(run_id, seq, thread_id, category, type, payload, created_at)"
COPY_SQL = f"COPY run_events {COLUMNS} FROM STDIN"
PAYLOAD = {
    "call_id": "01a2367c-1e4e-7228-8100-74d1f56df4da",
    "name": "write_artifact",
    "tool_call_id": "call_0",
    "status": "success",
    "content": '{"path": "outputs/report.md", "size": 85} ' + "x" * 160,
}


def insert_values_sql(n: int) -> str:
    """A multi-row INSERT of `n` events with explicit seqs."""
    return f"INSERT INTO run_events {COLUMNS} VALUES " + ", ".join(
        ["(%s, %s, %s, %s, %s, %s, %s)"] * n
    )


@dataclass
class Side:
    """Timings of one side of a row: (events, seconds, per-batch latencies) per round."""

    rates: list[float]
    latencies_ms: list[float]

    @classmethod
    def empty(cls) -> Side:
        """No rounds yet."""
        return cls([], [])

    def rate(self) -> float:
        """Median events/s over the rounds."""
        return statistics.median(self.rates) if self.rates else float("nan")

    def p50(self) -> float:
        """Median latency of one call, ms."""
        return statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")


@dataclass
class Row:
    """Ours beside a baseline."""

    stage: str
    ours: Side
    baseline_name: str
    baseline: Side

    @property
    def ratio(self) -> float:
        """ours / baseline events per second."""
        base = self.baseline.rate()
        return self.ours.rate() / base if base else float("nan")


def format_table(rows: Sequence[Row]) -> str:
    """A plain-text table."""
    head = ("stage", "ours ev/s", "ours p50 ms", "baseline", "base ev/s", "base p50 ms", "ratio")
    cells = [head] + [
        (
            r.stage,
            f"{r.ours.rate():,.0f}",
            f"{r.ours.p50():.2f}",
            r.baseline_name,
            f"{r.baseline.rate():,.0f}",
            f"{r.baseline.p50():.2f}",
            f"{r.ratio:.2f}",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.ljust(w) if i in (0, 3) else v.rjust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        )

    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(c) for c in cells[1:]])


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def signals_ignored() -> Iterator[None]:
    """Let cleanup finish even if Ctrl-C or SIGTERM arrives again."""
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


# --- the stages --------------------------------------------------------------------------------------
class Runs:
    """Fresh runs (the FK target of every event) on one thread."""

    def __init__(self, pool: DictPool) -> None:
        self.store = RunStore(pool)
        self.thread_id = self.store.create_thread(None, OWNER, {}, "raise").thread_id

    def new(self) -> str:
        """Admit a run; it holds its `created` event at seq 1."""
        run_id = str(uuid.uuid4())
        self.store.admit(
            RunRequest(thread_id=self.thread_id, assistant_id="bench"),
            run_id=run_id,
            owner=OWNER,
            graph_id="bench",
            strategy=MultitaskStrategy.ENQUEUE,
        )
        return run_id


class RawWriter:
    """The baseline: explicit seqs into one run, by multi-row INSERT or COPY."""

    def __init__(self, pool: DictPool, run_id: str, thread_id: str) -> None:
        self.pool, self.run_id, self.thread_id = pool, run_id, thread_id
        self.seq = 1  # after `created`
        self.lock = threading.Lock()

    def _rows(self, n: int) -> list[tuple[Any, ...]]:
        with self.lock:
            first, self.seq = self.seq + 1, self.seq + n
        now = datetime.now(UTC)
        return [
            (self.run_id, first + i, self.thread_id, "tool", "tool.result", PAYLOAD, now)
            for i in range(n)
        ]

    def insert(self, n: int) -> None:
        """One multi-row INSERT of `n` events."""
        rows = self._rows(n)
        params = [
            Jsonb(v, dumps=serde.dumps_str) if isinstance(v, dict) else v for r in rows for v in r
        ]
        with self.pool.connection() as conn:
            conn.execute(insert_values_sql(n), params)

    def copy(self, n: int) -> None:
        """One COPY of `n` events."""
        rows = self._rows(n)
        with self.pool.connection() as conn, conn.cursor() as cur, cur.copy(COPY_SQL) as cp:
            for r in rows:
                cp.write_row((*r[:5], serde.dumps_str(r[5]), r[6]))


def events_for(run_id: str, thread_id: str, n: int) -> list[RunEvent]:
    """`n` typical events of one run."""
    return [RunEvent(run_id, thread_id, "tool", "tool.result", PAYLOAD) for _ in range(n)]


def timed_calls(calls: int, writers: int, one: Callable[[], None]) -> tuple[float, list[float]]:
    """Run `one` `calls` times spread over `writers` threads; (wall seconds, latencies ms)."""
    latencies: list[float] = []
    lock = threading.Lock()
    per = [calls // writers + (1 if i < calls % writers else 0) for i in range(writers)]

    def work(k: int) -> None:
        mine = []
        for _ in range(k):
            t0 = time.perf_counter()
            one()
            mine.append((time.perf_counter() - t0) * 1000)
        with lock:
            latencies.extend(mine)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(k,)) for k in per]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, latencies


def timed_alternating(
    calls: int, ours: Callable[[], None], base: Callable[[], None]
) -> tuple[list[float], list[float]]:
    """One thread, ours and the baseline call by call, so noise hits both alike (ms)."""
    lat_ours: list[float] = []
    lat_base: list[float] = []
    for _ in range(calls):
        for fn, out in ((ours, lat_ours), (base, lat_base)):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1000)
    return lat_ours, lat_base


def run_all(
    settings: Settings, *, events: int, rounds: int, log: Callable[[str], None]
) -> list[Row]:
    """Every row: one writer alternates ours and baseline call by call; several writers by round."""
    pool = make_pool(settings, name="jbench", max_size=8)
    try:
        runs = Runs(pool)
        store = RunEventStore(pool)
        tid = runs.thread_id
        rows: list[Row] = []

        def pair(
            stage: str,
            base_name: str,
            batch: int,
            writers: int,
            make_ours: Callable[[], Callable[[], None]],
            make_base: Callable[[], Callable[[], None]],
            n_events: int = events,
        ) -> None:
            row = Row(stage, Side.empty(), base_name, Side.empty())
            calls = max(writers, n_events // batch)
            for r in range(rounds):
                ours, base = make_ours(), make_base()
                ours()  # warm-up: prepared statements, pool connections
                base()
                if writers == 1:
                    lat_ours, lat_base = timed_alternating(calls, ours, base)
                    for side, lat in ((row.ours, lat_ours), (row.baseline, lat_base)):
                        side.rates.append(len(lat) * batch * 1000 / sum(lat))
                        side.latencies_ms.extend(lat)
                else:  # contention is the point: each side alone, sides alternate by round
                    sides = ((row.ours, ours), (row.baseline, base))
                    for side, one in sides if r % 2 == 0 else sides[::-1]:
                        wall, lat = timed_calls(calls, writers, one)
                        side.rates.append(calls * batch / wall)
                        side.latencies_ms.extend(lat)
                log(f"  {stage}: round {r + 1}/{rounds}")
            rows.append(row)

        def ours_batch(batch: int) -> Callable[[], Callable[[], None]]:
            def make() -> Callable[[], None]:
                run_id = runs.new()
                evs = events_for(run_id, tid, batch)

                def one() -> None:
                    store.append_batch(evs)

                return one

            return make

        def ours_same_run(batch: int) -> Callable[[], Callable[[], None]]:
            return ours_batch(batch)  # one run per round; the writers share it

        def raw(batch: int, how: str) -> Callable[[], Callable[[], None]]:
            def make() -> Callable[[], None]:
                writer = RawWriter(pool, runs.new(), tid)
                return lambda: getattr(writer, how)(batch)

            return make

        def journal(batch: int) -> Callable[[], Callable[[], None]]:
            def make() -> Callable[[], None]:
                j = RunJournal(store, run_id=runs.new(), thread_id=tid, flush_size=batch)

                def one() -> None:
                    for _ in range(batch):
                        j.record("tool", "tool.result", PAYLOAD)  # the 20th writes the batch
                    if j.last_error is not None:
                        raise j.last_error

                return one

            return make

        log("stage: append_batch x20")
        pair("append_batch x20", "INSERT VALUES x20", 20, 1, ours_batch(20), raw(20, "insert"))
        log("stage: append_batch x20 vs COPY")
        pair("append_batch x20", "COPY x20", 20, 1, ours_batch(20), raw(20, "copy"))
        log("stage: journal record -> batch x20")
        pair("journal.record, 20/flush", "INSERT VALUES x20", 20, 1, journal(20), raw(20, "insert"))
        log("stage: append x1")
        pair("append x1", "INSERT x1", 1, 1, ours_batch(1), raw(1, "insert"), events // 10)
        log("stage: 4 writers, one run")
        pair(
            "append_batch x20, 4 writers/1 run",
            "INSERT VALUES x20, 4 writers",
            20,
            4,
            ours_same_run(20),
            raw(20, "insert"),
        )
        log("stage: bulk")
        pair("append_batch x500", "COPY x500", 500, 1, ours_batch(500), raw(500, "copy"))
        return rows
    finally:
        pool.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark in a private database, print the table, always clean up."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--events", type=int, default=5_000, help="events per side per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per row (median)")
    parser.add_argument(
        "--async-commit",
        action="store_true",
        help="synchronous_commit = off in the bench database: our layer's cost without fsync",
    )
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    sandbox = Sandbox(Settings(), "jbench", uses_redis=False)
    old_term = signal.signal(signal.SIGTERM, _interrupt)
    rc = 0
    started = time.time()
    try:
        log(f"journal bench: database {sandbox.db_name}")
        settings = sandbox.create(async_commit=args.async_commit)
        rows = run_all(settings, events=args.events, rounds=args.rounds, log=log)
        with psycopg.connect(settings.dsn) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            sync = conn.execute("SHOW synchronous_commit").fetchone()
        print(
            f"threadrun journal bench: {args.events} events per side per round, "
            f"{args.rounds} rounds (median), postgres {version[0] if version else '?'}, "
            f"synchronous_commit={sync[0] if sync else '?'}, {time.time() - started:.0f} s"
        )
        print(format_table(rows))
    except KeyboardInterrupt:
        log("journal bench: interrupted")
        rc = 130
    finally:
        with signals_ignored():
            try:
                sandbox.destroy()
                log(f"journal bench: dropped {sandbox.db_name}")
            except Exception as exc:  # noqa: BLE001 - say exactly what is left behind
                log(f"journal bench: CLEANUP FAILED ({exc}); drop {sandbox.db_name} by hand")
                rc = rc or 1
        signal.signal(signal.SIGTERM, old_term)
    return rc


if __name__ == "__main__":
    sys.exit(main())
