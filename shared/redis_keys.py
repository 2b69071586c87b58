"""Every Redis key name, key prefix and TTL in one place.

Per-run keys share the hash tag `{run_id}` so that the multi-key Lua scripts (fenced
publish, lease renew with cancel check) stay valid on Redis Cluster; the memory queue's
keys share `{memory}` and a user's limit keys a tag of the user id, for the same reason.
The key strings are what deployed Redis data holds: change one only with a migration.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix (tests use a private prefix each)."""

    prefix: str

    def stream(self, run_id: str) -> str:
        """The run's live event stream (B1)."""
        return f"{self.prefix}run:{{{run_id}}}:stream"

    def stream_meta(self, run_id: str) -> str:
        """Hash beside the stream: event count, first/last/trimmed ids (exact gaps, B5)."""
        return f"{self.prefix}run:{{{run_id}}}:meta"

    def lease(self, run_id: str) -> str:
        """The owner lease `{epoch}|{owner}` with a TTL (L1)."""
        return f"{self.prefix}run:{{{run_id}}}:lease"

    def cancel(self, run_id: str) -> str:
        """A pending cancel request for the run: the action name (R5)."""
        return f"{self.prefix}run:{{{run_id}}}:cancel"

    def result(self, run_id: str) -> str:
        """What `/wait` answers for a run whose temporary thread is deleted when it ends
        (JSON, written before its `end`, kept as long as its stream)."""
        return f"{self.prefix}run:{{{run_id}}}:result"

    def thread_runs(self, thread_id: str) -> str:
        """A short stream of the runs admitted on a thread (`r`: run id), newest last: what
        wakes thread followers (GET /threads/{id}/stream) when a run starts; never events."""
        return f"{self.prefix}thread:{{{thread_id}}}:runs"

    def callers_busy(self) -> str:
        """Set (with a short TTL) while runs a caller asked for are running anywhere: the
        background runs yield (workers/background_share.py)."""
        return f"{self.prefix}callers-busy"

    def run_queue(self) -> str:
        """Sorted set of the runs waiting for a worker slot, by priority then age
        (shared/runs/run_queue.py)."""
        return f"{self.prefix}runq"

    def reaper_leader(self) -> str:
        """The reaper's leader lock (one active reaper, any worker may take over)."""
        return f"{self.prefix}reaper:leader"

    def worker(self, worker_id: str) -> str:
        """A worker's liveness record."""
        return f"{self.prefix}worker:{worker_id}"

    def ops_web(self, process_id: str) -> str:
        """Hash of one web process's open connections and stream subscribers (ops view)."""
        return f"{self.prefix}ops:web:{process_id}"

    def ops_graphs(self) -> str:
        """Hash of each graph's load state as the last runs worker to start found it (graph
        id -> JSON: spec, state `ok`/`error`, error, worker, at), for the ops view."""
        return f"{self.prefix}ops:graphs"

    def ops_workers(self) -> str:
        """Hash of Celery workers' presence records (node name -> JSON), for the ops view
        (shared/ops/presence.py)."""
        return f"{self.prefix}ops:workers"

    def ops_supervisors(self) -> str:
        """Hash of `make run` supervisors' children (host -> JSON), for the ops view
        (shared/ops/supervision.py)."""
        return f"{self.prefix}ops:supervisors"

    def ops_web_index(self) -> str:
        """Sorted set of reporting web processes, scored by their last report (unix s)."""
        return f"{self.prefix}ops:web"

    def ops_worker_losses(self) -> str:
        """Sorted set of lost workers (worker id, scored by when the loss was first seen,
        unix s); `ops_worker_loss_events` holds each one's event. Tagged `{ops}` with it:
        one Lua script writes both."""
        return f"{self.prefix}{{ops}}:worker-losses"

    def ops_worker_loss_events(self) -> str:
        """Hash: lost worker id -> its loss event (JSON: at, worker, how, runs, ...)."""
        return f"{self.prefix}{{ops}}:worker-losses:events"

    def ops_worker_finished(self, host: str, pid: str) -> str:
        """Hash of one worker process's finished runs: `worker` (its worker id, so a reused
        pid starts again at zero) and a count per terminal status."""
        return f"{self.prefix}ops:worker-finished:{host}:{pid}"

    def celery_prefix(self) -> str:
        """kombu's `global_keyprefix`: every key Celery writes starts with it."""
        return f"{self.prefix}celery:"

    def celery_queue(self, queue: str) -> str:
        """The Redis list behind a Celery queue (kombu's `global_keyprefix` + the name)."""
        return f"{self.celery_prefix()}{queue}"

    def kombu_bindings(self, kind: str, exchange: str) -> str:
        """kombu's set of queue bindings of an exchange (`kind`: binding, binding_permanent)."""
        return f"{self.celery_prefix()}_kombu.{kind}.{exchange}"


@dataclass(frozen=True)
class LimitKeys:
    """Redis key names of the limits (hash-tagged per user for Redis Cluster)."""

    prefix: str

    def _k(self, user_id: str, name: str) -> str:
        tag = hashlib.sha256(user_id.encode()).hexdigest()[:20]
        return f"{self.prefix}limit:{{{tag}}}:{name}"

    def rate(self, user_id: str) -> str:
        """The user's GCRA theoretical arrival time (`runs_per_minute`)."""
        return self._k(user_id, "runs-rate")

    def active(self, user_id: str) -> str:
        """Sorted set of the user's admitted runs (`max_active_runs`)."""
        return self._k(user_id, "runs-active")

    def ended(self, user_id: str) -> str:
        """Sorted set of the user's runs that ended in the last `ENDED_RUN_TTL_MS` (so a slot
        bound after its run ended is not taken)."""
        return self._k(user_id, "runs-ended")

    def reserved(self, user_id: str) -> str:
        """Sorted set of the user's admissions in flight (`max_active_runs`)."""
        return self._k(user_id, "runs-reserved")

    def heavy_reads(self, user_id: str) -> str:
        """Sorted set of the user's state/history reads in flight (`max_heavy_reads_per_user`)."""
        return self._k(user_id, "heavy-reads")

    def heavy_rate(self, user_id: str) -> str:
        """The user's GCRA theoretical arrival time of heavy reads (`heavy_reads_per_minute`)."""
        return self._k(user_id, "heavy-rate")

    def connections(self, user_id: str) -> str:
        """Sorted set of the user's open streams and WebSockets (`max_connections_per_user`)."""
        return self._k(user_id, "connections")

    def webhooks(self, user_id: str) -> str:
        """Sorted set of the user's webhook attempts in flight (`webhook_user_concurrency`)."""
        return self._k(user_id, "webhooks")

    def webhook_host(self, host: str) -> str:
        """Sorted set of the webhook attempts in flight to a receiver host
        (`webhook_host_concurrency`)."""
        tag = hashlib.sha256(host.encode()).hexdigest()[:20]
        return f"{self.prefix}limit:{{h{tag}}}:webhook-host"


@dataclass(frozen=True)
class MemoryKeys:
    """Key names of the debounced memory queue under one prefix (one hash tag for all)."""

    prefix: str

    def _k(self, name: str) -> str:
        return f"{self.prefix}{{memory}}:{name}"

    @property
    def due(self) -> str:
        """Sorted set: pending bucket -> due time."""
        return self._k("due")

    @property
    def urgent(self) -> str:
        """Hash: buckets holding an urgent update (never pushed back)."""
        return self._k("urgent")

    @property
    def first(self) -> str:
        """Hash: pending bucket -> time of its first admission (bounds the debounce)."""
        return self._k("first")

    @property
    def leases(self) -> str:
        """Sorted set: claimed batch token -> lease deadline."""
        return self._k("leases")

    @property
    def claims(self) -> str:
        """Hash: claimed batch token -> reclaim count."""
        return self._k("claims")

    @property
    def stats(self) -> str:
        """Hash of counters."""
        return self._k("stats")

    def updates(self, bucket: str) -> str:
        """List of a bucket's admitted updates."""
        return self._k(f"updates:{bucket}")

    def batch(self, token: str) -> str:
        """List of a claimed batch's updates."""
        return self._k(f"batch:{token}")


@dataclass(frozen=True)
class McpKeys:
    """Key names of the MCP front end (app/protocols/mcp/): its sessions and the tool calls
    in flight, hash-tagged per session."""

    prefix: str

    def session(self, session_id: str) -> str:
        """Hash of one MCP session (`Mcp-Session-Id`): its caller and protocol version."""
        return f"{self.prefix}mcp:{{{session_id}}}:session"

    def call(self, session_id: str, request_id: int | str) -> str:
        """The run of one `tools/call` in flight (JSON), or a cancel that came before it:
        what `notifications/cancelled` for that request id ends, at any web process. An
        integer id and a string id are different requests (`1` is not `"1"`)."""
        rid = (
            f"i{request_id}"
            if isinstance(request_id, int)
            else "s" + hashlib.sha256(request_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        )
        return f"{self.prefix}mcp:{{{session_id}}}:call:{rid}"


MCP_CALL_TTL_S = 86_400
"""A tool call's record outlives any call that waits for its run (it is deleted when the
call ends): it bounds the orphan of a web process that died mid-call."""


CANCEL_TTL_S = 3600
"""How long a cancel request waits for a worker to see it."""

STREAM_TTL_RUNNING_S = 86_400
"""A stream's TTL while its run is live, refreshed on every publish (bounds orphans)."""

THREAD_RUNS_MAXLEN = 16
"""Entries a thread's admission stream keeps: followers read only what came after their
cursor, and the runs table has the order (a trimmed notice costs nothing but a wake-up)."""

THREAD_RUNS_TTL_S = 86_400
"""A thread's admission stream expires a day after its last admission."""

ACTIVE_SET_TTL_MS = 86_400_000
ENDED_RUN_TTL_MS = 600_000
"""How long a run's end is remembered for the active-run limit: longer than any admission
request takes to bind its slot."""
"""The active-run set of an idle user expires after a day (its runs are long over)."""

OPS_WEB_TTL_PERIODS = 3
"""A web process's ops record lives this many report periods (a dead process drops out)."""

REAPER_LEAD_TTL_INTERVALS = 3
"""The reaper's leader lock lives this many reaper intervals: a dead leader is replaced
within that, while a live one renews it every interval."""
