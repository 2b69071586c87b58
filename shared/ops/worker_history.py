"""What the ops view keeps about worker processes: their losses and their finished runs.

A worker loss is an event (when it was first seen, the worker, how it was seen, the runs it
held), written once per lost worker id however many processes notice it at the same time:
every web process whose worker broadcast the worker no longer answers while runs still name
it as their owner (`shared/ops/collector.py`), and the reaper when it finds their leases
expired (`workers/reaper.py`). One Lua step (`ops_worker_loss.lua`) makes the first caller
the recorder and merges what later callers saw. Events are kept `ops_worker_history_s`, at
most `ops_worker_losses_max`.

A worker's finished runs are counted per terminal status in one small hash per worker
process (host and pid, as the broadcast names a worker), bumped when the run's terminal
status is committed and kept `ops_worker_history_s` after the last one.

`WorkerHistory` is the sync side (the web's ops view), `AsyncWorkerHistory` the workers';
both build their script arguments and read their answers with the functions below.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

import redis
import redis.asyncio as aredis

from shared import lua
from shared.redis_keys import Keys
from shared.settings import Settings
from shared.vocab import RunStatus

FINISHED_STATUSES = (
    RunStatus.SUCCESS,
    RunStatus.ERROR,
    RunStatus.TIMEOUT,
    RunStatus.INTERRUPTED,
)
"""The statuses counted per worker, in the order the page shows them."""

NOT_ANSWERING = "not answering"
"""`how` of a loss seen by the ops view: the worker left the broadcast, its runs did not."""
LEASES_EXPIRED = "leases expired"
"""`how` of a loss seen by the reaper: the worker's runs' leases expired."""


def process_of(worker_id: str) -> tuple[str, str] | None:
    """(host, pid) of a worker id `host:pid:nonce` (a run's `owner`); None if it is not one."""
    parts = worker_id.split(":")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


def loss_event(
    worker_id: str, runs: Iterable[str], how: str, *, name: str | None, at: float
) -> dict[str, Any]:
    """The event of a lost worker, as first recorded."""
    proc = process_of(worker_id)
    return {
        "at": at,
        "worker": worker_id,
        "host": proc[0] if proc else None,
        "pid": proc[1] if proc else None,
        "name": name,
        "how": how,
        "runs": sorted(set(runs)),
    }


def loss_args(
    settings: Settings, worker_id: str, runs: Sequence[str], how: str, name: str | None
) -> list[Any]:
    """ARGV of `ops_worker_loss.lua`."""
    now = time.time()
    event = loss_event(worker_id, runs, how, name=name, at=now)
    return [
        worker_id,
        now,
        json.dumps(event),
        settings.ops_worker_history_s,
        settings.ops_worker_losses_max,
    ]


def parse_losses(raw: Sequence[Any]) -> list[dict[str, Any]]:
    """The events of an HMGET, the vanished ones left out; `runs` always a list (an empty
    Lua table encodes as an object)."""
    out = []
    for value in raw:
        if value is None:
            continue
        try:
            event = json.loads(value)
        except ValueError:
            continue
        runs = event.get("runs")
        event["runs"] = list(runs) if isinstance(runs, list) else []
        out.append(event)
    return out


def parse_finished(raw: dict[Any, Any]) -> dict[str, int]:
    """{status: count} of a worker's hash (zeros for the statuses it has none of)."""
    got = {_s(k): _s(v) for k, v in raw.items()}
    return {str(s): int(got.get(str(s), 0)) for s in FINISHED_STATUSES}


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class WorkerHistory:
    """Worker losses and finished-run counts, for the ops view (sync Redis)."""

    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings = settings
        self.redis = client
        self.keys = Keys(settings.redis_prefix)
        self._record = lua.register(client, "ops_worker_loss")

    def record_loss(
        self, worker_id: str, runs: Sequence[str], how: str, name: str | None = None
    ) -> bool:
        """Record that `worker_id` is lost with `runs`; True if this call was the first."""
        keys = [self.keys.ops_worker_losses(), self.keys.ops_worker_loss_events()]
        args = loss_args(self.settings, worker_id, runs, how, name)
        return bool(self._record(keys=keys, args=args))

    def losses(self, limit: int = 50) -> list[dict[str, Any]]:
        """Worker losses within the retention, latest first."""
        since = time.time() - self.settings.ops_worker_history_s
        got = self.redis.zrevrangebyscore(
            self.keys.ops_worker_losses(), "+inf", since, start=0, num=limit
        )
        ids = [_s(w) for w in got]
        if not ids:
            return []
        return parse_losses(self.redis.hmget(self.keys.ops_worker_loss_events(), ids))

    def finished(self, procs: Sequence[tuple[str, str]]) -> list[dict[str, int]]:
        """Finished-run counts of each (host, pid), in order."""
        if not procs:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for host, pid in procs:
            pipe.hgetall(self.keys.ops_worker_finished(host, pid))
        return [parse_finished(raw) for raw in pipe.execute()]


class AsyncWorkerHistory:
    """The workers' side: count a finished run, record a loss the reaper found."""

    def __init__(self, settings: Settings, client: aredis.Redis) -> None:
        self.settings = settings
        self.keys = Keys(settings.redis_prefix)
        self._record = lua.register(client, "ops_worker_loss")
        self._count = lua.register(client, "ops_worker_finished")

    async def count_finished(self, worker_id: str, status: str) -> None:
        """One run of `worker_id` ended `status`."""
        proc = process_of(worker_id)
        if proc is None or status not in FINISHED_STATUSES:
            return
        keys = [self.keys.ops_worker_finished(*proc)]
        await self._count(
            keys=keys, args=[worker_id, status, int(self.settings.ops_worker_history_s)]
        )

    async def record_loss(
        self, worker_id: str, runs: Sequence[str], how: str, name: str | None = None
    ) -> bool:
        """Record that `worker_id` is lost with `runs`; True if this call was the first."""
        keys = [self.keys.ops_worker_losses(), self.keys.ops_worker_loss_events()]
        args = loss_args(self.settings, worker_id, runs, how, name)
        return bool(await self._record(keys=keys, args=args))
