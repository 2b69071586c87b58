"""Prometheus metrics of threadrun: the names below are a contract (alert rules, HPA).

Counters and the histogram are counted where things happen (workers, web streams) with
prometheus-client's multi-process mode: every process of a host writes its own mmap file
under one PROMETHEUS_MULTIPROC_DIR (`metrics_dir`, default `data_dir/prometheus/<host>`), and
any web process's `/metrics` sums the files. Files of dead processes are folded into one
archive file per type (so counters never go backwards and the directory stays small).

Gauges are never process state: `OpsGauges` computes them at scrape time from Redis and
Postgres (shared/ops), so every web process answers the same.

    threadrun_runs{status}                    gauge
    threadrun_runs_stuck                      gauge
    threadrun_fenced_writes_total{sink}       counter  sink = stream|status|checkpoint|receipt
    threadrun_queue_depth{queue}              gauge
    threadrun_queue_oldest_age_seconds{queue} gauge
    threadrun_workers_online{queue}           gauge
    threadrun_stream_gaps_total               counter
    threadrun_connections_open{transport}     gauge    transport = sse|ws
    threadrun_memory_backlog                  gauge
    threadrun_memory_updates_skipped_total    counter
    threadrun_tokens_total{kind}              counter  kind = input|output
    threadrun_run_duration_seconds            histogram
    threadrun_runs_started_total              counter
    threadrun_runs_finished_total{status}     counter
    threadrun_webhook_deliveries_total{outcome} counter  one per attempt (shared/webhooks)
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from shared.settings import Settings
from shared.vocab import RunStatus, Sink

log = logging.getLogger(__name__)

PREFIX = "threadrun_"
FENCED_SINKS = tuple(s.value for s in Sink)
TOKEN_KINDS = ("input", "output")
FINISHED_STATUSES = tuple(s.value for s in RunStatus if s.terminal)
TRANSPORTS = ("sse", "ws")
QUEUES = ("runs", "memory")
WEBHOOK_OUTCOMES = (
    "delivered",
    "retryable_status",
    "rejected",
    "redirect",
    "connection_error",
    "timeout",
    "refused",
    "gone",
)
RUN_STATUSES = tuple(s.value for s in RunStatus)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_FILE_RE = re.compile(r"^(counter|histogram|summary|gauge_[a-z]+)_(\d+)\.db$")


class Instruments:
    """The counters and the histogram this process increments."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.runs_started = Counter(
            f"{PREFIX}runs_started", "Run attempts claimed by a worker.", registry=registry
        )
        self.runs_finished = Counter(
            f"{PREFIX}runs_finished",
            "Runs whose terminal status a worker wrote.",
            ["status"],
            registry=registry,
        )
        self.run_duration = Histogram(
            f"{PREFIX}run_duration_seconds",
            "Wall time of a finished run attempt, claim to terminal status.",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.fenced_writes = Counter(
            f"{PREFIX}fenced_writes",
            "Writes of a stale owner rejected by the fence (L2).",
            ["sink"],
            registry=registry,
        )
        self.stream_gaps = Counter(
            f"{PREFIX}stream_gaps", "Gap events sent to stream clients (B5).", registry=registry
        )
        self.tokens = Counter(
            f"{PREFIX}tokens", "Model tokens of finished runs.", ["kind"], registry=registry
        )
        self.webhook_deliveries = Counter(
            f"{PREFIX}webhook_deliveries",
            "Webhook delivery attempts by outcome.",
            ["outcome"],
            registry=registry,
        )
        for outcome in WEBHOOK_OUTCOMES:
            self.webhook_deliveries.labels(outcome=outcome)
        # Label values that exist from the start, so every series of the contract is
        # exported (at 0) before the first event.
        for sink in FENCED_SINKS:
            self.fenced_writes.labels(sink=sink)
        for kind in TOKEN_KINDS:
            self.tokens.labels(kind=kind)
        for status in FINISHED_STATUSES:
            self.runs_finished.labels(status=status)

    def collectors(self) -> list[Collector]:
        """Every instrument (for a single-process registry)."""
        return [
            self.runs_started,
            self.runs_finished,
            self.run_duration,
            self.fenced_writes,
            self.stream_gaps,
            self.tokens,
            self.webhook_deliveries,
        ]


@dataclass
class _State:
    instruments: Instruments
    multiproc_dir: Path | None
    local: CollectorRegistry | None


_lock = threading.Lock()
_state: _State | None = None


def default_dir(settings: Settings) -> Path:
    """This host's multi-process directory: `metrics_dir`, else data_dir/prometheus/<host>.

    Per host because the dead-pid cleanup asks the kernel whether a pid lives: two
    containers sharing one volume would see each other's pids as dead.
    """
    if settings.metrics_dir is not None:
        return settings.metrics_dir
    return settings.data_dir / "prometheus" / socket.gethostname()


def configure(settings: Settings) -> Path:
    """Switch this process to multi-process metrics in `default_dir(settings)`.

    Call once at process start, before any metric is counted (web: app creation; worker:
    the Celery app module). Returns the directory.
    """
    global _state
    path = default_dir(settings)
    with _lock:
        if _state is not None and _state.multiproc_dir == path:
            return path
        path.mkdir(parents=True, exist_ok=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
        # prometheus-client picks the value class at import from the environment; we
        # configure later (from Settings), so set it here, before creating the instruments.
        values.ValueClass = values.MultiProcessValue()
        reap_dead(path)
        _state = _State(Instruments(registry=None), path, None)
    return path


def _get() -> _State:
    """The configured state, or an in-process one (unit tests, one-off scripts)."""
    global _state
    with _lock:
        if _state is None:
            local = CollectorRegistry(auto_describe=True)
            _state = _State(Instruments(registry=local), None, local)
        return _state


def multiproc_dir() -> Path | None:
    """The directory of this process's metrics (None in single-process mode)."""
    return _get().multiproc_dir


# --- hooks (one-line calls from workers/ and app/streaming/) -----------------------------------
def run_started() -> None:
    """A worker claimed a run attempt."""
    _safe(lambda i: i.runs_started.inc())


def run_finished(
    status: str, duration_s: float | None, usage: Mapping[str, Any] | None = None
) -> None:
    """A worker (or the reaper, with no duration) wrote a run's terminal status; `usage` is
    the run's usage summary (J2)."""

    def count(i: Instruments) -> None:
        i.runs_finished.labels(status=status).inc()
        if duration_s is not None:
            i.run_duration.observe(max(duration_s, 0.0))
        total = (usage or {}).get("total") or {}
        for kind in TOKEN_KINDS:
            n = total.get(f"{kind}_tokens")
            if isinstance(n, int | float) and n > 0:
                i.tokens.labels(kind=kind).inc(n)

    _safe(count)


def fenced_write(sink: str) -> None:
    """A stale owner's write was rejected (sink: stream, status, checkpoint, receipt)."""
    _safe(lambda i: i.fenced_writes.labels(sink=sink).inc())


def webhook_delivery(outcome: str) -> None:
    """A webhook attempt ended with `outcome` (shared/webhooks/retry.py AttemptOutcome, or
    `gone`: the run was deleted before its body was read, or `deferred`: its receiver's host
    or its owner had its share of attempts in flight, shared/webhooks/fairness.py)."""
    _safe(lambda i: i.webhook_deliveries.labels(outcome=outcome).inc())


def gap_sent(n: int = 1) -> None:
    """A `gap` event went to a client."""
    _safe(lambda i: i.stream_gaps.inc(n))


def _safe(fn: Callable[[Instruments], None]) -> None:
    # Counting must never break the code path it observes.
    try:
        fn(_get().instruments)
    except Exception:
        log.exception("metric update failed")


def counter_values() -> dict[str, float]:
    """This host's counters summed over its processes: {sample name{labels}: value}."""
    out: dict[str, float] = {}
    for metric in _registry(None).collect():
        for s in metric.samples:
            if s.name.endswith("_total"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


# --- exposition -----------------------------------------------------------------------------
def _registry(gauges: Collector | None) -> CollectorRegistry:
    state = _get()
    registry = CollectorRegistry(auto_describe=False)
    if state.multiproc_dir is not None:
        reap_dead(state.multiproc_dir)
        MultiProcessCollector(registry, path=str(state.multiproc_dir))
    else:
        for c in state.instruments.collectors():
            registry.register(c)
    if gauges is not None:
        registry.register(gauges)
    return registry


def render(gauges: Collector | None) -> bytes:
    """The text exposition: this host's counters plus `gauges` computed now."""
    return generate_latest(_registry(gauges))


class OpsGauges(Collector):
    """Scrape-time gauges (and the memory skip counter) from `figures()` (shared/ops)."""

    def __init__(self, figures: Callable[[], Mapping[str, Any]]) -> None:
        self._figures = figures

    def collect(self) -> Iterable[Metric]:
        try:
            f = self._figures()
        except Exception:  # Redis/Postgres down: the counters still export
            log.exception("ops gauges unavailable for this scrape")
            return
        runs = GaugeMetricFamily(f"{PREFIX}runs", "Runs by status.", labels=["status"])
        by_status = f["runs_by_status"]
        for status in sorted(set(RUN_STATUSES) | set(by_status)):
            runs.add_metric([status], by_status.get(status, 0))
        yield runs
        yield GaugeMetricFamily(
            f"{PREFIX}runs_stuck", "Running runs whose lease has expired.", value=f["runs_stuck"]
        )
        depth = GaugeMetricFamily(
            f"{PREFIX}queue_depth", "Messages waiting in the Celery queue.", labels=["queue"]
        )
        age = GaugeMetricFamily(
            f"{PREFIX}queue_oldest_age_seconds",
            "Age of the oldest pending run / memory update.",
            labels=["queue"],
        )
        workers = GaugeMetricFamily(
            f"{PREFIX}workers_online", "Celery workers answering, by queue.", labels=["queue"]
        )
        for q in QUEUES:
            depth.add_metric([q], f["queue_depth"].get(q, 0))
            age.add_metric([q], f["queue_oldest_age_s"].get(q) or 0.0)
            workers.add_metric([q], f["workers_online"].get(q, 0))
        yield depth
        yield age
        yield workers
        conns = GaugeMetricFamily(
            f"{PREFIX}connections_open", "Open SSE / WebSocket connections.", labels=["transport"]
        )
        for t in TRANSPORTS:
            conns.add_metric([t], f["connections_open"].get(t, 0))
        yield conns
        yield GaugeMetricFamily(
            f"{PREFIX}memory_backlog", "Memory updates waiting.", value=f["memory_backlog"]
        )
        yield CounterMetricFamily(
            f"{PREFIX}memory_updates_skipped",
            "Memory updates skipped by backpressure (M5).",
            value=f["memory_skipped"],
        )


# --- the multi-process directory -------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _dir_lock(path: Path) -> Iterator[None]:
    with open(path / ".lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def reap_dead(path: Path) -> int:
    """Fold the files of dead processes into `<type>_archive.db`; return how many.

    Live gauges of a dead pid are dropped (prometheus-client's `mark_process_dead`);
    counter, histogram and summary values are added to the archive, so sums never drop.
    Serialised by a file lock, since every process may reap.
    """
    me = os.getpid()
    dead: list[tuple[str, int, Path]] = []
    for entry in path.iterdir():
        m = _FILE_RE.match(entry.name)
        if m and int(m.group(2)) != me and not _alive(int(m.group(2))):
            dead.append((m.group(1), int(m.group(2)), entry))
    if not dead:
        return 0
    n = 0
    with _dir_lock(path):
        for typ, pid, file in dead:
            if not file.exists():  # another process reaped it first
                continue
            if typ.startswith("gauge_"):
                if typ.startswith("gauge_live"):
                    mark_process_dead(pid, str(path))
                    n += 1
                continue  # other gauge modes keep a dead process's last value by design
            archive = MmapedDict(str(path / f"{typ}_archive.db"))
            try:
                for key, value, timestamp, _pos in MmapedDict.read_all_values_from_file(str(file)):
                    old, _ = archive.read_value(key)
                    archive.write_value(key, old + value, timestamp)
            finally:
                archive.close()
            file.unlink()
            n += 1
    return n


def configure_worker(settings: Settings) -> None:
    """A Celery worker: multi-process metrics, and `/metrics` on `worker_metrics_port` if set
    (counters only; the gauges come from any web process)."""
    configure(settings)
    if settings.worker_metrics_port:
        from prometheus_client import start_http_server

        try:
            start_http_server(settings.worker_metrics_port, registry=_registry(None))
        except OSError as exc:  # another worker of this host serves it already
            log.warning("worker metrics port %s: %s", settings.worker_metrics_port, exc)
