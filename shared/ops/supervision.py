"""The supervisor's children as the ops view sees them (SPEC H1, H2).

`make run`'s supervisor (shared/tools/supervisor.py) restarts a child that died and stops
one in a crash loop while the rest keep serving. Without this record that happened only in
the terminal: the ops page kept saying "all clear" with the memory worker down for good. So
the supervisor publishes its children's state to Redis every REPORT_PERIOD_S (and at once
after a change), one hash field per supervisor host (`Keys.ops_supervisors`): each child's
name, state, pid, restarts and last exit. The ops collector reads it; a supervisor that
stopped reporting (stopped, or killed) drops out after STALE_PERIODS periods and its field
is pruned (shared/ops/timed_records.py).

Child states: `running`; `restarting` (exited, waiting out its backoff: `restart_in_s`);
`crash_loop` (given up on: too many exits in the window; it stays down until the
supervisor is restarted).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis

from shared import serde
from shared.ops.timed_records import read_fresh
from shared.redis_keys import Keys

log = logging.getLogger(__name__)

REPORT_PERIOD_S = 2.0

RUNNING, RESTARTING, CRASH_LOOP = "running", "restarting", "crash_loop"


@dataclass(frozen=True, slots=True)
class ChildState:
    """One supervised child, as the supervisor last saw it."""

    name: str
    state: str
    pid: int | None
    restarts: int
    last_exit: str | None
    """How it last ended (`code 1`, `signal SIGKILL`), None if it never did."""
    since: float
    """Unix time of its last state change."""
    restart_in_s: float | None = None


class SupervisionReporter:
    """Writes one supervisor's children to Redis; never raises (a Redis that is down only
    delays the ops view, never the supervisor)."""

    def __init__(self, client: redis.Redis, keys: Keys, host: str | None = None) -> None:
        self.client = client
        self.keys = keys
        self.host = host or socket.gethostname()
        self._last: tuple[Any, ...] | None = None
        self._at = 0.0
        self._failing = False

    def publish(self, children: Sequence[ChildState], *, supervisor_pid: int) -> None:
        """Write `children` when they changed or a period passed since the last write."""
        shape = tuple((c.name, c.state, c.pid, c.restarts, c.last_exit) for c in children)
        now = time.monotonic()
        if shape == self._last and now - self._at < REPORT_PERIOD_S:
            return
        record = {
            "host": self.host,
            "pid": supervisor_pid,
            "at": time.time(),
            "children": [asdict(c) for c in children],
        }
        try:
            self.client.hset(self.keys.ops_supervisors(), self.host, serde.dumps(record))
        except redis.RedisError as exc:
            if not self._failing:
                log.warning("supervisor: ops report failed (%s); retrying every period", exc)
            self._failing = True
            return
        self._failing = False
        self._last, self._at = shape, now

    def remove(self) -> None:
        """Drop this host's record (a clean stop: nothing is supervised any more)."""
        with contextlib.suppress(redis.RedisError):  # the record goes stale by itself
            self.client.hdel(self.keys.ops_supervisors(), self.host)


def read_supervisors(
    client: redis.Redis, keys: Keys, period_s: float = REPORT_PERIOD_S
) -> list[dict[str, Any]]:
    """The live supervisors' records (newest write within STALE_PERIODS periods), by host;
    records older than PRUNE_S are removed."""
    live = read_fresh(client, keys.ops_supervisors(), period_s)
    return sorted(live, key=lambda r: str(r["host"]))


def supervision_tile(records: Sequence[dict[str, Any]]) -> tuple[str, str] | None:
    """The health strip's verdict on supervised children: (state, reason), None when no
    supervisor reports (a deployment without `make run`'s supervisor)."""
    if not records:
        return None
    looping, restarting = [], []
    for record in records:
        for child in record["children"]:
            if child["state"] == CRASH_LOOP:
                looping.append(f"{child['name']} ({child.get('last_exit') or 'exited'})")
            elif child["state"] == RESTARTING:
                restarting.append(str(child["name"]))
    if looping:
        return "bad", "crash loop, not restarted: " + ", ".join(looping)
    if restarting:
        return "warn", "restarting: " + ", ".join(restarting)
    n = sum(len(r["children"]) for r in records)
    return "ok", f"{n} supervised processes running"
