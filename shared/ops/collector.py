"""What the ops view and the Prometheus gauges show, read from Postgres, Redis and Celery.

Sources:
- runs, epochs, attempts, fenced status writes, tokens per hour: Postgres (OpsStore);
- leases (time left), streams (length), queue depths: Redis;
- open connections and stream subscribers: the web processes' reports (connections.py);
- workers online and their queues: a Celery `inspect` broadcast (`active_queues` and
  `stats`, answered within `ops_inspect_timeout_s`), cached `ops_inspect_cache_s` per
  process, and the workers' own presence records in Redis for those too busy to answer in
  time (shared/ops/presence.py); a worker's active runs are the running runs whose `owner`
  names its host:pid;
- worker losses (a worker gone from the broadcast while runs name it as their owner is
  recorded as one, once: shared/ops/worker_history.py) and each worker's finished-run
  counts: Redis, written by the web's ops view and by the workers;
- memory backlog and skipped updates: `shared.memory.stats.memory_stats`;
- each graph's load state (ok, or the error that keeps it from being served): what the
  last runs worker to start found and wrote to Redis (`Keys.ops_graphs`);
- the health strip (`health`): the figures above judged against the `ops_*` thresholds,
  plus failures and overdue crons from Postgres (the cron scheduler answers no broadcast:
  crons left due in the past are how its absence shows).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import importlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis
from celery import Celery

from shared import metrics
from shared.db.statistics import statistics_verdict
from shared.ops.actions import REQUEUE_WHY, requeue_verdict
from shared.ops.connections import read_connections
from shared.ops.presence import read_presence
from shared.ops.store import OpsStore
from shared.ops.supervision import read_supervisors, supervision_tile
from shared.ops.worker_history import NOT_ANSWERING, WorkerHistory, process_of
from shared.redis_keys import Keys, MemoryKeys
from shared.runs.taskqueue import BACKGROUND_QUEUE, MEMORY_QUEUE, RUNS_QUEUE, WEBHOOKS_QUEUE
from shared.settings import Settings
from shared.vocab import RunStatus

log = logging.getLogger(__name__)

QUEUES = (RUNS_QUEUE, MEMORY_QUEUE, WEBHOOKS_QUEUE)
HEX = frozenset("0123456789abcdef")
# kombu's Redis transport keeps one list per priority step: name, name\x06\x163, …
PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def live_processes(workers: list[dict[str, Any]]) -> frozenset[tuple[str, str]]:
    """(host, pid) of the workers online (answered the broadcast or recorded themselves)."""
    return frozenset((str(w["host"]), str(w["pid"])) for w in workers if w.get("pid") is not None)


def orphan_state(
    *,
    status: str,
    owner: str | None,
    live: frozenset[tuple[str, str]],
    lease_left_s: float | None,
    idle_s: float,
    lease_ttl_s: float,
    reaper_interval_s: float,
) -> tuple[bool, float | None]:
    """H2: is this run orphaned (running, and its owner `host:pid:…` is no live worker), and
    within how many seconds the reaper picks it up: it takes a running run once its lease is
    gone and its row is a lease TTL old, on a pass every `reaper_interval_s`."""
    if status != RunStatus.RUNNING or not owner:
        return False, None
    parts = owner.split(":")
    if len(parts) >= 2 and (parts[0], parts[1]) in live:
        return False, None
    wait = max(lease_left_s or 0.0, lease_ttl_s - idle_s, 0.0) + reaper_interval_s
    return True, round(wait, 1)


class WorkerInspector:
    """Celery workers answering a broadcast, and those whose presence record is fresh
    (`presence`), cached for a short while. `answered` tells the two apart."""

    def __init__(
        self,
        celery: Celery,
        timeout_s: float,
        cache_s: float,
        presence: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self._celery = celery
        self._presence = presence
        self._timeout = timeout_s
        self._cache_s = cache_s
        self._lock = threading.Lock()
        self._at = 0.0
        self._value: list[dict[str, Any]] = []
        # Every worker this process has seen answer: (host, pid) -> its Celery name, so
        # that a lost worker's event can name it (bounded: the newest NAMES_KEPT).
        self.names: dict[tuple[str, str], str] = {}
        # The pinned answer of the current context (a request's greenlet or thread).
        self._pin: contextvars.ContextVar[list[list[dict[str, Any]]] | None] = (
            contextvars.ContextVar(f"ops-pin-{id(self)}", default=None)
        )

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """Within the block, every `workers()` of this context is the first answer: one view
        (the overview, health) asks the workers once, whatever the cache time, so its panels
        agree and it waits one broadcast, not one per panel. Nested blocks share the outer pin."""
        if self._pin.get() is not None:
            yield
            return
        token = self._pin.set([])
        try:
            yield
        finally:
            self._pin.reset(token)

    def workers(self) -> list[dict[str, Any]]:
        """[{name, host, pid, queues, concurrency, answered}] of the workers online."""
        held = self._pin.get()
        if held is None:
            return self._cached()
        if not held:
            held.append(self._cached())
        return held[0]

    def _cached(self) -> list[dict[str, Any]]:
        with self._lock:
            if time.monotonic() - self._at < self._cache_s:
                return self._value
            self._value = self._inspect()
            self._at = time.monotonic()
            return self._value

    def _inspect(self) -> list[dict[str, Any]]:
        def ask(method: str) -> dict[str, Any]:
            insp = self._celery.control.inspect(timeout=self._timeout)
            try:
                return getattr(insp, method)() or {}
            except Exception as exc:  # noqa: BLE001 - the broker is down: nobody answers
                log.warning("celery inspect %s failed: %s", method, exc)
                return {}

        # Both broadcasts wait the whole timeout; ask them at the same time.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            queues_f = pool.submit(ask, "active_queues")
            stats_f = pool.submit(ask, "stats")
            queues, stats = queues_f.result(), stats_f.result()
        out = []
        for name in sorted(set(queues) | set(stats)):
            info = stats.get(name) or {}
            host = name.split("@", 1)[1] if "@" in name else name
            if info.get("pid") is not None:
                self.names[(host, str(info["pid"]))] = name
            out.append(
                {
                    "name": name,
                    "host": host,
                    "pid": info.get("pid"),
                    "queues": sorted(q.get("name", "") for q in queues.get(name) or []),
                    "concurrency": (info.get("pool") or {}).get("max-concurrency"),
                    "answered": True,
                }
            )
        answered = {w["name"] for w in out}
        for record in self._present():
            if record.get("name") in answered or record.get("pid") is None:
                continue
            self.names[(str(record["host"]), str(record["pid"]))] = str(record["name"])
            out.append({**record, "answered": False})
        out.sort(key=lambda w: str(w["name"]))
        while len(self.names) > NAMES_KEPT:
            self.names.pop(next(iter(self.names)))
        return out

    def _present(self) -> list[dict[str, Any]]:
        if self._presence is None:
            return []
        try:
            return self._presence()
        except redis.RedisError as exc:  # the broadcast's answers still count
            log.warning("reading the workers' presence failed: %s", exc)
            return []


NAMES_KEPT = 1000
"""Worker names a web process remembers for the loss events (a dict keeps insertion order)."""


RENEWAL_SLACK_S = 1.0
"""How late past `lease_renew_s` a lease's renewal may be before its owner counts as having
stopped renewing (`renewal_missed`)."""


def renewal_missed(lease_left_s: float | None, lease_ttl_s: float, lease_renew_s: float) -> bool:
    """Whether a running run's owner has stopped renewing its lease: the lease is gone, or
    its last renewal (TTL minus what is left) is older than one renewal period plus
    RENEWAL_SLACK_S. A worker too busy to answer the ops broadcast in time still renews its
    leases, so this tells it from a dead one."""
    if lease_left_s is None:
        return True
    return lease_ttl_s - lease_left_s > lease_renew_s + RENEWAL_SLACK_S


def lost_owners(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """{owner: [run ids]} of the orphaned rows (see `orphan_state`) whose owner also stopped
    renewing their leases (`renewal_missed`): the record of a loss is kept for days, so it
    takes both signs, never a slow broadcast alone."""
    out: dict[str, list[str]] = {}
    for r in rows:
        if r.get("orphaned") and r.get("renewal_missed") and r.get("owner"):
            out.setdefault(str(r["owner"]), []).append(str(r["run_id"]))
    return out


TOKEN_HOURS_SLACK_S = 60.0
"""Beyond `run_timeout_s`, how long after its end an hour may still get model calls recorded
(a journal's last write after its run's time was up)."""


class TokenHours:
    """The token chart's hours that no longer change, kept between refreshes.

    A model call is recorded with the time it ended, and its run's journal writes it at the
    latest when the run ends, so an hour that ended `settle_s` ago (the longest a run may
    last, and a margin) is complete. A refresh then reads the hours from the oldest one not
    settled yet (the last one or two, once the chart is filled): the 24 hours of every model
    call were read at every refresh (every 3 s while the page is open), a read that grew with
    the load of the day."""

    def __init__(self, settle_s: float) -> None:
        self.settle_s = settle_s
        self._settled: dict[int, tuple[int, int]] = {}

    @staticmethod
    def _starts(now: float, hours: int) -> list[int]:
        last = int(now // 3600 * 3600)
        return [last - h * 3600 for h in range(hours - 1, -1, -1)]

    def since(self, now: float, hours: int) -> int:
        """The start of the first hour of the chart to read (epoch seconds)."""
        starts = self._starts(now, hours)
        return next((h for h in starts if h not in self._settled), starts[-1])

    def chart(
        self, now: float, hours: int, read: dict[int, tuple[int, int]]
    ) -> list[dict[str, Any]]:
        """The chart's hours, oldest first, from what was kept and what was `read` (hour
        start -> (input, output) tokens, from `since` on); keeps the hours that settled."""
        starts = self._starts(now, hours)
        out = []
        for start in starts:
            got = self._settled.get(start)
            if got is None:
                got = read.get(start, (0, 0))
                if start + 3600 + self.settle_s <= now:
                    self._settled[start] = got
            out.append({"hour": start, "input": got[0], "output": got[1]})
        for start in [h for h in self._settled if h < starts[0]]:
            del self._settled[start]
        return out


class OpsCollector:
    """Every figure of the ops view; each method is one panel."""

    def __init__(
        self,
        settings: Settings,
        store: OpsStore,
        client: redis.Redis,
        celery: Celery,
        *,
        memory_stats: Callable[[Settings, redis.Redis], dict[str, Any]] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.redis = client
        self.keys = Keys(settings.redis_prefix)
        self.inspector = WorkerInspector(
            celery,
            settings.ops_inspect_timeout_s,
            settings.ops_inspect_cache_s,
            presence=lambda: read_presence(client, self.keys, settings.ops_presence_s),
        )
        self._memory_stats = memory_stats if memory_stats is not None else _find_memory_stats()
        self.history = WorkerHistory(settings, client)
        # (owner, run) pairs this process already recorded: a page refresh every few
        # seconds re-sees the same orphans, and records them once.
        self._recorded: set[tuple[str, str]] = set()
        self._token_hours = TokenHours(settings.run_timeout_s + TOKEN_HOURS_SLACK_S)

    # -- runs -------------------------------------------------------------------------------
    def runs_summary(self) -> dict[str, Any]:
        """Runs by status, stuck runs and fenced rejections."""
        counters = metrics.counter_values()
        fenced = {
            sink: counters.get(f"threadrun_fenced_writes_total{{sink={sink}}}", 0.0)
            for sink in metrics.FENCED_SINKS
        }
        return {
            "by_status": self.store.runs_by_status(),
            "stuck": len(self.stuck_runs()),
            "fenced": {
                "status_writes_recorded": self.store.fenced_status_writes(),
                "by_sink_this_host": fenced,
            },
        }

    def stuck_runs(self) -> list[str]:
        """Running runs, untouched for a lease TTL, with no live lease."""
        ids = self.store.stuck_candidates(self.settings.lease_ttl_s)
        if not ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for run_id in ids:
            pipe.exists(self.keys.lease(run_id))
        return [r for r, held in zip(ids, pipe.execute(), strict=True) if not held]

    def runs(self, *, status: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Runs with their lease: owner, epoch, lease epoch, time left, attempt."""
        limit = limit or self.settings.ops_runs_limit
        if status is None:
            return self._with_leases(lambda: self.store.inflight_runs(limit))
        return self._with_leases(lambda: self.store.list_runs(status=status, limit=limit))

    def run(self, run_id: str) -> dict[str, Any] | None:
        """One run with its lease, stream and ops audit."""
        found = self._with_leases(lambda: [r] if (r := self.store.get_run(run_id)) else [])
        if not found:
            return None
        out = found[0]
        out["stream"] = self.streams([run_id])[0]
        out["audit"] = self.store.list_audit(run_id=run_id, limit=50)
        return out

    def _with_leases(self, fetch: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """The rows `fetch` reads, each with its lease read right after them. The live workers
        are asked first: the broadcast waits its timeout, and a row read before it would be
        that much older than its lease (a run that ended meanwhile would show `running`
        with no lease)."""
        live = live_processes(self.inspector.workers())
        rows = fetch()
        pipe = self.redis.pipeline(transaction=False)
        for r in rows:
            pipe.get(self.keys.lease(r["run_id"]))
            pipe.pttl(self.keys.lease(r["run_id"]))
        got = pipe.execute() if rows else []
        out = []
        for i, r in enumerate(rows):
            value, pttl = got[2 * i], got[2 * i + 1]
            lease_epoch = None
            if value is not None:
                lease_epoch = int(_s(value).split("|", 1)[0])
            verdict = requeue_verdict(
                status=r["status"],
                lease_held=value is not None,
                idle_s=float(r.get("idle_s") or 0.0),
                dispatched=r["dispatched_at"] is not None,
                behind=bool(r.get("behind")),
                due=bool(r.get("due", True)),
                lease_ttl_s=self.settings.lease_ttl_s,
            )
            lease_left = pttl / 1000 if pttl and pttl > 0 else None
            orphaned, recovers_in = orphan_state(
                status=r["status"],
                owner=r.get("owner"),
                live=live,
                lease_left_s=lease_left,
                idle_s=float(r.get("idle_s") or 0.0),
                lease_ttl_s=self.settings.lease_ttl_s,
                reaper_interval_s=self.settings.reaper_interval_s,
            )
            out.append(
                {
                    **r,
                    "orphaned": orphaned,
                    "renewal_missed": orphaned
                    and renewal_missed(
                        lease_left, self.settings.lease_ttl_s, self.settings.lease_renew_s
                    ),
                    "recovers_in_s": recovers_in,
                    "lease": {
                        "held": value is not None,
                        "epoch": lease_epoch,
                        "ttl_s": round(pttl / 1000, 3) if pttl and pttl > 0 else None,
                    },
                    "lease_expired": r["status"] == RunStatus.RUNNING and value is None,
                    # The server's own rule (shared/ops/actions.py): offered iff accepted.
                    "requeue": {
                        "eligible": verdict.done,
                        "outcome": verdict.value,
                        "why": REQUEUE_WHY.get(verdict, verdict.value),
                    },
                }
            )
        self._record_losses(out)
        return out

    def _record_losses(self, rows: list[dict[str, Any]]) -> None:
        """Keep a worker loss for each owner of orphaned runs (once, whoever records it
        first: shared/ops/worker_history.py). Best effort: the view goes on without it."""
        for owner, run_ids in lost_owners(rows).items():
            new = [r for r in run_ids if (owner, r) not in self._recorded]
            if not new:
                continue
            proc = process_of(owner)
            name = self.inspector.names.get(proc) if proc else None
            try:
                self.history.record_loss(owner, new, NOT_ANSWERING, name)
            except redis.RedisError as exc:
                log.warning("could not record the loss of worker %s: %s", owner, exc)
                continue
            if len(self._recorded) > 10 * NAMES_KEPT:
                self._recorded.clear()
            self._recorded.update((owner, r) for r in new)

    def worker_losses(self, limit: int = 50, *, look: bool = True) -> list[dict[str, Any]]:
        """Lost workers, latest first: when, the worker (id, host, pid, Celery name when
        known), how the loss was seen, its runs with their status now, and the runs it had
        finished (`finished`). `look`: first record the losses the running runs show now
        (the overview has just read them)."""
        if look:
            with self.inspector.pinned():
                self.orphaned_runs()
        events = self.history.losses(limit)
        ids = sorted({r for e in events for r in e["runs"]})
        now = self.store.run_statuses(ids)
        procs = [(str(e.get("host")), str(e.get("pid"))) for e in events]
        counts = self.history.finished(procs)
        for e, finished in zip(events, counts, strict=True):
            e["finished"] = finished
            e["runs"] = [
                {
                    "run_id": r,
                    "status": now[r]["status"] if r in now else None,
                    "attempt": now[r]["attempt"] if r in now else None,
                }
                for r in e["runs"]
            ]
        return events

    def runs_by_prefix(self, prefix: str, limit: int = 10) -> list[dict[str, Any]]:
        """Runs whose id starts with `prefix` (hex digits, dashes ignored), at most `limit`.

        The ops page shows 8-character ids; the CLI resolves such a prefix here and refuses
        an ambiguous one by listing these candidates.
        """
        digits = prefix.replace("-", "").lower()
        if not digits or len(digits) > 32 or not set(digits) <= HEX:
            raise ValueError("a run id prefix is 1 to 32 hex digits (dashes allowed)")
        low = digits.ljust(32, "0")
        high = digits.ljust(32, "f")
        return self._with_leases(lambda: self.store.runs_by_prefix(low, high, limit))

    def failures(self, limit: int = 20, window_s: float | None = None) -> list[dict[str, Any]]:
        """Runs that ended `error`/`timeout` within the window, latest first, with their
        error (`{error: type, message}`)."""
        window = window_s if window_s is not None else self.settings.ops_failure_window_s
        return self.store.failures(window, limit)

    # -- queues and workers -----------------------------------------------------------------
    def queue_depths(self) -> dict[str, int]:
        """Messages waiting in each Celery queue's Redis lists; for `runs`, the runs waiting
        in the run queue (its messages name no run, shared/runs/run_queue.py)."""
        others = [q for q in QUEUES if q != RUNS_QUEUE]
        pipe = self.redis.pipeline(transaction=False)
        pipe.zcard(self.keys.run_queue())
        for q in others:
            for suffix in PRIORITY_SUFFIXES:
                pipe.llen(self.keys.celery_queue(q) + suffix)
        got = [int(x) for x in pipe.execute()]
        n = len(PRIORITY_SUFFIXES)
        depths = {RUNS_QUEUE: got[0]}
        for i, q in enumerate(others):
            depths[q] = sum(got[1 + i * n : 1 + (i + 1) * n])
        return depths

    def queues(self, memory: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        """Depth and age of the oldest waiting item per queue.

        runs: the pending run dispatched longest ago. memory: how long the earliest due
        update has been due (0 when none is overdue). webhooks: how long the earliest due
        delivery of the outbox has been due, and `outbox_due`, how many are (a delivery
        waits in the outbox, not in the queue, while no worker takes it). Null age when
        nothing waits.
        """
        depths = self.queue_depths()
        memory = memory if memory is not None else self.memory()
        hooks = self.store.webhooks_due()
        return {
            RUNS_QUEUE: {"depth": depths[RUNS_QUEUE], "oldest_age_s": self.oldest_run_age()},
            MEMORY_QUEUE: {
                "depth": depths[MEMORY_QUEUE],
                "oldest_age_s": memory.get("oldest_due_age_s"),
            },
            WEBHOOKS_QUEUE: {
                "depth": depths[WEBHOOKS_QUEUE],
                "oldest_age_s": hooks["oldest_s"],
                "outbox_due": hooks["due"],
            },
        }

    def oldest_run_age(self) -> float | None:
        """Seconds since the oldest pending dispatch."""
        return self.store.oldest_dispatched_age_s()

    def workers(self) -> list[dict[str, Any]]:
        """Workers online, their queues, the runs they own now and the runs they have
        finished (`finished`: a count per terminal status)."""
        workers = self.inspector.workers()
        running = self.store.list_runs(status=RunStatus.RUNNING, limit=self.settings.ops_runs_limit)
        by_proc: dict[tuple[str, str], list[str]] = {}
        for r in running:
            parts = (r.get("owner") or "").split(":")
            if len(parts) >= 2:
                by_proc.setdefault((parts[0], parts[1]), []).append(r["run_id"])
        procs = [(str(w["host"]), str(w["pid"])) for w in workers]
        counts = self.history.finished(procs)
        out = []
        for w, proc, finished in zip(workers, procs, counts, strict=True):
            active = by_proc.get(proc, [])
            out.append({**w, "active_runs": active, "finished": finished})
        return out

    def workers_online(self, workers: list[dict[str, Any]] | None = None) -> dict[str, int]:
        """How many online workers consume each queue (and the background runs' queue,
        whose runs wait in the run queue with the others)."""
        workers = workers if workers is not None else self.inspector.workers()
        return {q: sum(1 for w in workers if q in w["queues"]) for q in (*QUEUES, BACKGROUND_QUEUE)}

    def graphs(self) -> list[dict[str, Any]]:
        """Each graph's load state as the last runs worker to start found it: graph_id,
        spec, state (`ok` or `error`), error, worker, at (config order)."""
        out = []
        for raw in self.redis.hvals(self.keys.ops_graphs()):
            try:
                out.append(json.loads(_s(raw)))
            except ValueError:
                continue
        return sorted(out, key=lambda g: float(g.get("at") or 0.0))

    # -- streams and connections -----------------------------------------------------------
    def connections(self) -> dict[str, Any]:
        """Open connections by transport and subscribers by run, over all web processes."""
        c = read_connections(self.redis, self.keys, self.settings.ops_report_s)
        return {
            "open": {t: c.by_transport.get(t, 0) for t in metrics.TRANSPORTS},
            "subscribers": c.subscribers,
            "web_processes": c.processes,
        }

    def streams(
        self, run_ids: list[str], subscribers: dict[str, int] | None = None
    ) -> list[dict[str, Any]]:
        """Length, last id and expiry of the streams of `run_ids`."""
        subscribers = subscribers or {}
        pipe = self.redis.pipeline(transaction=False)
        for r in run_ids:
            pipe.xlen(self.keys.stream(r))
            pipe.hmget(self.keys.stream_meta(r), ["n", "l"])
            pipe.ttl(self.keys.stream(r))
        got = pipe.execute() if run_ids else []
        out = []
        for i, r in enumerate(run_ids):
            length, (count, last), ttl = got[3 * i : 3 * i + 3]
            out.append(
                {
                    "run_id": r,
                    "exists": bool(length) or count is not None,
                    "length": int(length),
                    "published": int(count or 0),
                    "last_id": _s(last) if last else None,
                    "expires_in_s": int(ttl) if ttl and ttl > 0 else None,
                    "subscribers": subscribers.get(r, 0),
                }
            )
        return out

    # -- memory and tokens -----------------------------------------------------------------
    def memory(self) -> dict[str, Any]:
        """Memory backlog, skipped updates and the rest of `memory_stats` (0s when absent)."""
        if self._memory_stats is None:
            return {"available": False, "backlog": 0, "skipped": 0, "oldest_due_age_s": None}
        stats = dict(self._memory_stats(self.settings, self.redis))
        stats["available"] = True
        stats["oldest_due_age_s"] = self._memory_oldest_due_age()
        return stats

    def _memory_oldest_due_age(self) -> float | None:
        first = self.redis.zrange(MemoryKeys(self.settings.redis_prefix).due, 0, 0, withscores=True)
        if not first:
            return None
        return round(max(0.0, time.time() - float(first[0][1])), 3)

    def tokens_per_hour(self) -> list[dict[str, Any]]:
        """Input/output tokens per hour of the last `ops_token_hours` hours (zeros filled);
        only the hours not settled yet are read (`TokenHours`)."""
        now, hours = time.time(), self.settings.ops_token_hours
        read = self.store.tokens_per_hour(self._token_hours.since(now, hours))
        return self._token_hours.chart(now, hours, read)

    # -- health ---------------------------------------------------------------------------
    def health(
        self,
        *,
        workers_online: dict[str, int] | None = None,
        queues: dict[str, dict[str, Any]] | None = None,
        graphs: list[dict[str, Any]] | None = None,
        supervisors: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Is anything wrong? One tile per question, each `ok`, `warn` or `bad` with its
        reason as a sentence (the page must not rely on colour alone), and the verdict;
        `graphs` beside them: each graph's load state (`graphs()`)."""
        with self.inspector.pinned():
            return self._health(workers_online, queues, graphs, supervisors)

    def _health(
        self,
        workers_online: dict[str, int] | None,
        queues: dict[str, dict[str, Any]] | None,
        graphs: list[dict[str, Any]] | None,
        supervisors: list[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        s = self.settings
        online = workers_online if workers_online is not None else self.workers_online()
        q = queues if queues is not None else self.queues()
        graphs = graphs if graphs is not None else self.graphs()
        tiles = [
            self._workers_tile(RUNS_QUEUE, online, q, "new runs stay pending"),
            self._workers_tile(BACKGROUND_QUEUE, online, q, "cron firings stay pending"),
            self._workers_tile(MEMORY_QUEUE, online, q, "memory updates are not extracted"),
            self._webhooks_tile(online, q),
            self._stuck_tile(),
            self._orphans_tile(),
            self._failures_tile(s.ops_failure_window_s),
            self._queue_age_tile(q),
            self._crons_tile(),
            self._graphs_tile(graphs),
            self._statistics_tile(),
            *self._supervision_tile(supervisors),
        ]
        bad = [t["reason"] for t in tiles if t["state"] == "bad"]
        warn = [t["reason"] for t in tiles if t["state"] == "warn"]
        out = {"ok": not bad, "problems": bad, "warnings": warn, "tiles": tiles}
        return {**out, "graphs": graphs}

    def supervisors(self) -> list[dict[str, Any]]:
        """`make run` supervisors' children (shared/ops/supervision.py); [] without one."""
        return read_supervisors(self.redis, self.keys)

    def _supervision_tile(self, records: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """The supervised processes' tile, only where a supervisor reports (`records`: the
        supervisors read already, else they are read here)."""
        records = records if records is not None else self.supervisors()
        verdict = supervision_tile(records)
        if verdict is None:
            return []
        state, reason = verdict
        n = sum(1 for r in records for c in r["children"] if c["state"] == "running")
        return [self._tile("supervised", "supervised processes", n, state, reason)]

    def _statistics_tile(self) -> dict[str, Any]:
        """A warning while a table with rows has no planner statistics (shared/db/statistics.py)."""
        stats = self.store.table_stats()
        state, reason = statistics_verdict(stats, self.settings.analyze_interval_s)
        missing = sum(1 for t in stats if not t.analyzed and (t.live > 0 or t.changed > 0))
        return self._tile("statistics", "planner statistics", missing, state, reason)

    @staticmethod
    def _tile(key: str, label: str, value: Any, state: str, reason: str) -> dict[str, Any]:
        return {"key": key, "label": label, "value": value, "state": state, "reason": reason}

    def _workers_tile(
        self, queue: str, online: dict[str, int], q: dict[str, dict[str, Any]], effect: str
    ) -> dict[str, Any]:
        n = online.get(queue, 0)
        label = f"{queue} workers"
        if n == 0:
            waiting = q.get(queue, {}).get("depth", 0)
            extra = f" ({waiting} waiting)" if waiting else ""
            reason = f"no worker consumes the {queue} queue: {effect}{extra}"
            return self._tile(f"workers.{queue}", label, 0, "bad", reason)
        reason = f"{n} worker{'s consume' if n != 1 else ' consumes'} the {queue} queue"
        return self._tile(f"workers.{queue}", label, n, "ok", reason)

    def _webhooks_tile(
        self, online: dict[str, int], q: dict[str, dict[str, Any]]
    ) -> dict[str, Any]:
        """Webhooks go out only while a worker consumes their queue: none is bad when
        deliveries are due (they wait in the outbox), a warning while none is."""
        n = online.get(WEBHOOKS_QUEUE, 0)
        hooks = q.get(WEBHOOKS_QUEUE, {})
        due, age = int(hooks.get("outbox_due") or 0), hooks.get("oldest_age_s")
        key, label = f"workers.{WEBHOOKS_QUEUE}", f"{WEBHOOKS_QUEUE} workers"
        waiting = f"{due} webhook{'s wait' if due != 1 else ' waits'} in the outbox"
        if age is not None and due:
            waiting += f" (oldest {age:.0f}s)"
        if n == 0:
            if due:
                reason = f"no worker consumes the {WEBHOOKS_QUEUE} queue: {waiting}"
                return self._tile(key, label, 0, "bad", reason)
            reason = (
                f"no worker consumes the {WEBHOOKS_QUEUE} queue: a run's webhook would wait"
                " in the outbox"
            )
            return self._tile(key, label, 0, "warn", reason)
        reason = f"{n} worker{'s consume' if n != 1 else ' consumes'} the {WEBHOOKS_QUEUE} queue"
        return self._tile(key, label, n, "ok", reason + (f"; {waiting}" if due else ""))

    def _stuck_tile(self) -> dict[str, Any]:
        expired = self.stuck_runs()
        lost = self.store.undispatched_heads(self.settings.dispatch_stale_s)
        n = len(expired) + len(lost)
        if not n:
            return self._tile("stuck", "stuck runs", 0, "ok", "no stuck run")
        parts = []
        if expired:
            parts.append(f"{len(expired)} running with an expired lease")
        if lost:
            parts.append(f"{len(lost)} pending and never dispatched")
        reason = "; ".join(parts) + " (the reaper recovers them if a worker runs; or requeue)"
        return self._tile("stuck", "stuck runs", n, "bad", reason)

    def orphaned_runs(self) -> list[dict[str, Any]]:
        """H2: running runs whose owner is no live worker, with `recovers_in_s`."""
        return [r for r in self.runs(status=RunStatus.RUNNING) if r["orphaned"]]

    def _orphans_tile(self) -> dict[str, Any]:
        orphans = self.orphaned_runs()
        if not orphans:
            return self._tile(
                "orphaned", "orphaned runs", 0, "ok", "every running run's owner is live"
            )
        n = len(orphans)
        owners = sorted({str(r.get("owner")) for r in orphans})
        latest = max(float(r["recovers_in_s"] or 0.0) for r in orphans)
        reason = (
            f"{n} running run{'s' if n != 1 else ''} owned by no live worker "
            f"({', '.join(owners)}): the reaper recovers {'them' if n != 1 else 'it'} "
            f"within {int(latest + 0.5)}s"  # rounded as the page rounds
        )
        return self._tile("orphaned", "orphaned runs", n, "bad", reason)

    def _failures_tile(self, window_s: float) -> dict[str, Any]:
        ended = self.store.ended_by_status(window_s)
        failed = ended.get(RunStatus.ERROR, 0) + ended.get(RunStatus.TIMEOUT, 0)
        total = sum(ended.values())
        span = _span(window_s)
        if not total:
            return self._tile("failures", "failure rate", None, "ok", f"no run ended in {span}")
        rate = failed / total
        reason = f"{failed} of {total} runs ended error/timeout in {span}"
        state = "ok"
        if failed:
            s = self.settings
            loud = rate >= s.ops_failure_rate_bad and failed >= s.ops_failure_bad_min
            state = "bad" if loud else "warn"
        return self._tile("failures", "failure rate", round(rate, 4), state, reason)

    def _queue_age_tile(self, q: dict[str, dict[str, Any]]) -> dict[str, Any]:
        runs = q.get(RUNS_QUEUE, {})
        age, depth = runs.get("oldest_age_s"), runs.get("depth", 0)
        limit = self.settings.ops_queue_age_bad_s
        if age is None:
            return self._tile("queue_age", "queue wait", None, "ok", "no run waits for a worker")
        reason = f"the oldest dispatched run has waited {age:.0f}s ({depth} in the runs queue)"
        state = "bad" if age >= limit else "warn" if age >= limit / 4 else "ok"
        return self._tile("queue_age", "queue wait", round(age, 1), state, reason)

    def _crons_tile(self) -> dict[str, Any]:
        c = self.store.crons_due(self.settings.ops_cron_late_s)
        if not c["enabled"]:
            return self._tile("crons", "cron scheduler", 0, "ok", "no cron is enabled")
        if c["overdue"]:
            late = c["most_late_s"] or 0.0
            reason = (
                f"{c['overdue']} of {c['enabled']} crons overdue (up to {late:.0f}s): "
                "is the cron scheduler running?"
            )
            return self._tile("crons", "cron scheduler", c["overdue"], "bad", reason)
        reason = f"{c['enabled']} enabled crons fire on time"
        return self._tile("crons", "cron scheduler", c["enabled"], "ok", reason)

    def _graphs_tile(self, graphs: list[dict[str, Any]]) -> dict[str, Any]:
        failed = [g for g in graphs if g.get("state") == "error"]
        if not graphs:
            return self._tile("graphs", "graphs", None, "ok", "no runs worker reported its graphs")
        if failed:
            names = ", ".join(f"{g.get('graph_id')} ({g.get('error')})" for g in failed)
            n = len(failed)
            reason = f"{n} graph{'s' if n != 1 else ''} cannot be loaded, their runs fail: {names}"
            return self._tile("graphs", "graphs", n, "bad", reason)
        n = len(graphs)
        return self._tile("graphs", "graphs", 0, "ok", f"{n} graph{'s' if n != 1 else ''} loaded")

    # -- everything -------------------------------------------------------------------------
    def overview(self) -> dict[str, Any]:
        """The whole ops view in one document, from one worker broadcast."""
        with self.inspector.pinned():
            return self._overview()

    def _overview(self) -> dict[str, Any]:
        memory = self.memory()
        conns = self.connections()
        runs = self.runs()
        recent = self.store.list_runs(status=None, limit=20)
        stream_ids = list(
            dict.fromkeys([r["run_id"] for r in runs] + [r["run_id"] for r in recent])
        )
        stream_ids += [r for r in conns["subscribers"] if r not in stream_ids]
        workers = self.workers()
        online = self.workers_online(workers)
        queues = self.queues(memory)
        counters = metrics.counter_values()
        graphs = self.graphs()
        supervisors = self.supervisors()
        return {
            "at": time.time(),
            "refresh_s": self.settings.ops_refresh_s,
            "health": self.health(
                workers_online=online, queues=queues, graphs=graphs, supervisors=supervisors
            ),
            "graphs": graphs,
            "runs": {**self.runs_summary(), "inflight": runs},
            "queues": queues,
            "workers": workers,
            "workers_online": online,
            "worker_losses": self.worker_losses(limit=20, look=False),
            "supervisors": supervisors,
            "streams": self.streams(stream_ids, conns["subscribers"]),
            "connections": conns,
            "gaps_sent_this_host": counters.get("threadrun_stream_gaps_total", 0.0),
            "memory": memory,
            "tokens_per_hour": self.tokens_per_hour(),
        }

    def figures(self) -> dict[str, Any]:
        """The scrape-time gauges of shared.metrics.OpsGauges."""
        memory = self.memory()
        q = self.queues(memory)
        return {
            "runs_by_status": self.store.runs_by_status(),
            "runs_stuck": len(self.stuck_runs()),
            "queue_depth": {k: v["depth"] for k, v in q.items()},
            "queue_oldest_age_s": {k: v["oldest_age_s"] for k, v in q.items()},
            "workers_online": self.workers_online(),
            "connections_open": self.connections()["open"],
            "memory_backlog": int(memory.get("backlog", 0)),
            "memory_skipped": int(memory.get("skipped", 0)),
        }


def _span(seconds: float) -> str:
    """`the last 1h`, `the last 15m`, `the last 30s`."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"the last {int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"the last {int(seconds // 60)}m"
    return f"the last {seconds:g}s"


def _find_memory_stats() -> Callable[[Settings, redis.Redis], dict[str, Any]] | None:
    try:
        mod = importlib.import_module("shared.memory.stats")
    except ImportError:
        return None
    fn = getattr(mod, "memory_stats", None)
    return fn if callable(fn) else None
