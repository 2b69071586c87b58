"""Workers record themselves in Redis, so that a busy one is not shown gone (SPEC H2).

The ops view learns which workers are online from a Celery `inspect` broadcast answered
within `ops_inspect_timeout_s` (0.5 s). A runs worker whose threads keep the GIL busy, or a
host under load, answers later than that: for one refresh its queue had "no worker", and
its running runs showed orphaned. So each worker process also writes a record of itself
every `ops_presence_s` (2 s), one hash field per Celery node name (`Keys.ops_workers`):
name, host, pid, queues, concurrency and the time of the write. The ops collector counts a
worker online when it answered the broadcast or its record is at most STALE_PERIODS periods
old; a worker killed or frozen drops out that long after its last write, one stopped in
order at once (its record is removed). The hash is read as shared/ops/timed_records.py reads one.

Why a hash of records written by a thread, and not Celery's own worker heartbeats: those
are task events (`worker-heartbeat`), off unless Flower is watching (`task_events`), and
read by an event receiver a web process would have to keep running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis

from shared import serde
from shared.ops.timed_records import read_fresh
from shared.redis_keys import Keys

log = logging.getLogger(__name__)


def presence_record(name: str, queues: Sequence[str], concurrency: int | None) -> dict[str, Any]:
    """This process's record as `WorkerInspector` shows a worker (`host` is the node name's
    part after `@`, as for the broadcast's answers)."""
    return {
        "name": name,
        "host": name.split("@", 1)[1] if "@" in name else name,
        "pid": os.getpid(),
        "queues": sorted(queues),
        "concurrency": concurrency,
    }


class PresenceWriter:
    """A daemon thread writing one worker's record every `period_s`; never raises (a Redis
    that is down only shows the worker by its broadcast answers)."""

    def __init__(
        self, client: redis.Redis, keys: Keys, record: dict[str, Any], period_s: float
    ) -> None:
        self.client = client
        self.key = keys.ops_workers()
        self.record = record
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> None:
        self.write()
        self._thread = threading.Thread(target=self._loop, name="ops-presence", daemon=True)
        self._thread.start()

    def write(self) -> None:
        try:
            self.client.hset(
                self.key, self.record["name"], serde.dumps({**self.record, "at": time.time()})
            )
        except redis.RedisError as exc:
            if not self._failing:
                log.warning("ops presence write failed (%s); retrying every period", exc)
            self._failing = True
            return
        self._failing = False

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.write()

    def stop(self) -> None:
        """Stop writing and remove the record (a stop in order: the worker is gone now)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.period_s + 1)
        with contextlib.suppress(redis.RedisError):  # else it goes stale by itself
            self.client.hdel(self.key, self.record["name"])


def read_presence(client: redis.Redis, keys: Keys, period_s: float) -> list[dict[str, Any]]:
    """The records written within STALE_PERIODS periods, by name, without their write time;
    records older than PRUNE_S, or unreadable, are removed."""
    live = read_fresh(client, keys.ops_workers(), period_s)
    return sorted(
        ({k: v for k, v in r.items() if k != "at"} for r in live),
        key=lambda r: str(r.get("name")),
    )
