"""Every Redis key name and TTL in one place.

Per-run keys share the hash tag `{run_id}` so that the multi-key Lua scripts (fenced
publish, lease renew with cancel check) stay valid on Redis Cluster.
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

    def reaper_leader(self) -> str:
        """The reaper's leader lock (one active reaper, any worker may take over)."""
        return f"{self.prefix}reaper:leader"

    def worker(self, worker_id: str) -> str:
        """A worker's liveness record."""
        return f"{self.prefix}worker:{worker_id}"

    def ops_web(self, process_id: str) -> str:
        """Hash of one web process's open connections and stream subscribers (ops view)."""
        return f"{self.prefix}ops:web:{process_id}"

    def ops_web_index(self) -> str:
        """Sorted set of reporting web processes, scored by their last report (unix s)."""
        return f"{self.prefix}ops:web"

    def celery_queue(self, queue: str) -> str:
        """The Redis list behind a Celery queue (kombu's `global_keyprefix` + the name)."""
        return f"{self.prefix}celery:{queue}"


@dataclass(frozen=True)
class LimitKeys:
    """Redis key names of the limits (hash-tagged per user for Redis Cluster)."""

    prefix: str

    def _tag(self, user_id: str) -> str:
        return hashlib.sha256(user_id.encode()).hexdigest()[:20]

    def rate(self, user_id: str) -> str:
        return f"{self.prefix}limit:{{{self._tag(user_id)}}}:runs-rate"

    def active(self, user_id: str) -> str:
        return f"{self.prefix}limit:{{{self._tag(user_id)}}}:runs-active"

    def reserved(self, user_id: str) -> str:
        return f"{self.prefix}limit:{{{self._tag(user_id)}}}:runs-reserved"

    def connections(self, user_id: str) -> str:
        return f"{self.prefix}limit:{{{self._tag(user_id)}}}:connections"


CANCEL_TTL_S = 3600
"""How long a cancel request waits for a worker to see it."""
