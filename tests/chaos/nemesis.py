"""The nemesis: a seeded schedule of faults, one at a time, each healed after its duration.

The schedule is drawn from the seed alone before anything starts, so a seed replays the same
faults at the same offsets on the same hosts (`make chaos SEED=... DURATION=...`). Kinds:

| kind | fault | heal |
|---|---|---|
| worker_kill | SIGKILL a worker | a new worker on that host |
| worker_pause | SIGSTOP a worker (often longer than the lease TTL) | SIGCONT |
| worker_redis_partition | blackhole the Redis/Sentinel addresses in a worker's namespace | routes removed |
| worker_pg_partition | blackhole PostgreSQL in a worker's namespace | routes removed |
| web_redis_partition | blackhole Redis in a web host's namespace | routes removed |
| pg_restart | PostgreSQL fast shutdown (every session ends) | started again |
| worker_delay | netem 200 ms on a worker's link (htb 64 kbit/s without netem) | qdisc removed |
| redis_failover | SIGKILL the Redis primary (Sentinel promotes the replica) | old primary back as a replica |

`redis_failover` is drawn only when the checkout's Settings know Sentinel (the app then finds
the primary through the Sentinels; without them it is pointed at the primary directly).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from tests.chaos.cluster import MASTER_NAME, SENTINEL_PORT, ChaosCluster

KINDS = (
    "worker_kill",
    "worker_pause",
    "worker_redis_partition",
    "worker_pg_partition",
    "web_redis_partition",
    "pg_restart",
    "worker_delay",
)
FAILOVER = "redis_failover"
DELAY_MS = 200


@dataclass
class Fault:
    """One scheduled fault; `start`/`heal` are wall-clock times once applied."""

    kind: str
    target: str
    at_s: float  # offset from the workload's start
    duration_s: float
    start: float = 0.0
    heal: float = 0.0
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def schedule(
    seed: int, duration_s: float, kinds: list[str], workers: list[str], webs: list[str]
) -> list[Fault]:
    """Faults for `duration_s` seconds of workload: a few seconds of calm first, then one
    fault at a time with a gap after each heal; the last one heals before the end."""
    rng = random.Random(seed)
    out: list[Fault] = []
    t = min(5.0, duration_s / 6)
    while True:
        kind = rng.choice(kinds)
        if kind.startswith("worker"):
            target = rng.choice(workers)
        elif kind.startswith("web"):
            target = rng.choice(webs)
        elif kind == "pg_restart":
            target = "pg"
        else:
            target = "redis1"
        dur = round(rng.uniform(2.0, 8.0), 1)
        if kind == "pg_restart":
            dur = round(rng.uniform(1.0, 4.0), 1)
        if t + dur > duration_s - 2:
            return out
        out.append(Fault(kind, target, round(t, 1), dur))
        t += dur + rng.uniform(2.0, 6.0)


@dataclass
class Nemesis:
    """Applies a schedule to a cluster in a thread of its own; `stop()` heals everything."""

    cluster: ChaosCluster
    faults: list[Fault]
    log: Any = print
    done: list[Fault] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    error: BaseException | None = None
    netem: bool = True

    def start(self, t0: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(t0,), name="nemesis", daemon=True)
        self._thread.start()

    def _run(self, t0: float) -> None:
        try:
            for f in self.faults:
                if self._stop.wait(max(0.0, t0 + f.at_s - time.time())):
                    return
                self.apply(f)
                self.done.append(f)
                self._stop.wait(f.duration_s)
                self.heal(f)
                if self._stop.is_set():
                    return
        except BaseException as exc:  # noqa: BLE001 - reported by the harness
            self.error = exc
            self.log(f"nemesis failed: {exc!r}")

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        """Stop drawing faults, heal the one in progress (the thread does), then heal all."""
        self._stop.set()
        self.join()
        self.heal_all()

    # --- faults ---------------------------------------------------------------------------
    def apply(self, f: Fault) -> None:
        c = self.cluster
        host = c.net.hosts[f.target]
        f.start = time.time()
        if f.kind == "worker_kill":
            proc = c.proc(f.target)
            if proc is not None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.popen.wait(timeout=10)
                f.note = f"pid {proc.pid}"
        elif f.kind == "worker_pause":
            proc = c.proc(f.target)
            if proc is not None:
                os.kill(proc.pid, signal.SIGSTOP)
                f.note = f"pid {proc.pid}"
        elif f.kind in ("worker_redis_partition", "web_redis_partition"):
            c.net.partition(host, c.redis_ips)
        elif f.kind == "worker_pg_partition":
            c.net.partition(host, [c.host("pg").ip])
        elif f.kind == "worker_delay":
            f.note = c.net.delay(host, DELAY_MS, netem=self.netem)
        elif f.kind == "pg_restart":
            proc = c.proc("pg")
            if proc is not None:
                proc.stop(signal.SIGINT, timeout=30)
        elif f.kind == FAILOVER:
            proc = c.proc("redis1")
            if proc is not None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.popen.wait(timeout=10)
        self.log(f"nemesis: {f.kind} on {f.target} for {f.duration_s:g} s {f.note}".rstrip())

    def heal(self, f: Fault) -> None:
        c = self.cluster
        host = c.net.hosts[f.target]
        if f.kind == "worker_kill":
            if c.proc(f.target) is None:
                c.spawn_worker(host)  # boots while the run goes on (not waited for)
        elif f.kind == "worker_pause":
            proc = c.proc(f.target)
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
        elif f.kind == "pg_restart":
            if c.proc("pg") is None:
                c.start_postgres()
        elif f.kind == FAILOVER:
            if c.proc("redis1") is None:
                c.start_redis("redis1", replica_of=self.current_primary())
        else:
            c.net.heal(host)
        f.heal = time.time()
        self.log(f"nemesis: healed {f.kind} on {f.target}")

    def current_primary(self) -> str | None:
        for name, host in self.cluster.net.hosts.items():
            if not name.startswith("sentinel"):
                continue
            with contextlib.suppress(redis.RedisError):
                s = redis.Redis(host=host.ip, port=SENTINEL_PORT, socket_timeout=1)
                addr = s.sentinel_get_master_addr_by_name(MASTER_NAME)
                s.close()
                if addr and addr[0] != self.cluster.host("redis1").ip:
                    return str(addr[0])
        return self.cluster.host("redis2").ip

    def heal_all(self) -> None:
        """Every partition and delay removed, every process running and not frozen."""
        c = self.cluster
        c.net.heal_all()
        for p in c.procs:
            if p.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
        if c.proc("pg") is None:
            c.start_postgres()
        if c.proc("redis1") is None and "redis1" in c.net.hosts:
            c.start_redis("redis1", replica_of=self.current_primary())
        for h in c.workers:
            if c.proc(h.name) is None:
                c.spawn_worker(h)
