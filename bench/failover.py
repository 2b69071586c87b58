"""Redis failover benchmark: what a Sentinel failover costs a running run and a lost dispatch.

Run with `.venv/bin/python -m bench.failover [--repeats 3] [--lost 50] [--json PATH]`. Each
repeat starts a private Redis HA group (a primary, a replica, three Sentinels on free ports;
shared/tools/testing/redis_ha.py, `down-after-milliseconds` 1000) and measures, with clients built
from THREADRUN_REDIS_SENTINELS settings (shared/redis_clients.py):

1. Bridge (in this process): a publisher emits an event every 5 ms while a follower reads;
   the primary is SIGKILLed. Time from the kill to the promotion, to the publisher's first
   acknowledged event on the new master, and to the follower's next item; how many acknowledged
   events the new master lacked and how each side learned it.
2. Forced tail loss: the replica is frozen and its link cut while the primary acknowledges
   `--lost` events, then the primary is killed and the replica promoted without them; the
   publisher's next call republishes them; a follower that had read them gets a gap.
3. Cluster (one web process, one runs worker, on a private database `threadrun_failover_<hex>`):
   a slow run streams while the primary is killed: time to the first event the run publishes
   on the new master; and a run committed at the kill whose dispatch message is lost with the
   failover: time until the reaper re-dispatches it and a worker claims it (R4).

Every process it starts is stopped by PID and the database dropped, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from shared import redis_clients
from shared.bridge.base import Event, Gap, Heartbeat
from shared.bridge.publisher import EventSink, PublishBatcher, StreamPublisher
from shared.bridge.subscriber import StreamSubscriber
from shared.db import make_pool
from shared.redis_keys import Keys
from shared.runs.leases import LeaseManager, lease_value
from shared.runs.model import MultitaskStrategy, RunRequest
from shared.runs.store import RunStore
from shared.settings import Settings
from shared.tools.testing import Cluster, Sandbox, cluster_env, wait_for
from shared.tools.testing.redis_ha import DOWN_AFTER_MS, RedisHA


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class BridgeRound:
    """One failover seen by a publisher and a follower."""

    kill_to_promotion_s: float
    kill_to_publish_s: float
    kill_to_follower_s: float
    lost: int  # acknowledged events the new master lacked
    republished: int
    follower_outcome: str  # "contiguous" or "gap"
    forced_lost: int
    forced_republished: int
    forced_follower: str


class Publisher:
    """An attempt's sink on its own loop, emitting one event every `every_s`."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        self.settings, self.run_id = settings, run_id
        self.keys = Keys(settings.redis_prefix)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.acks: list[tuple[int, float]] = []  # (event number, acknowledged at)
        self.n = 0
        self.stop = False
        self.call(self._setup())

    async def _setup(self) -> None:
        self.client = redis_clients.async_client(self.settings)
        leases = LeaseManager(self.client, self.keys, ttl_s=60)
        assert await leases.acquire(self.run_id, 1, "bench")
        pub = StreamPublisher(self.client, self.keys, self.settings)
        self.sink = EventSink(
            PublishBatcher(pub),
            self.run_id,
            lease_value(1, "bench"),
            on_cancel=lambda _a: None,
            on_lost=lambda _e: None,
        )

    def call(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    def emit(self, count: int) -> None:
        async def go() -> None:
            for _ in range(count):
                self.sink.emit("custom", json.dumps({"i": self.n}).encode())
                self.n += 1
            await self.sink.drain()
            self.acks.append((self.n, time.monotonic()))

        self.call(go())

    def start_stream(self, every_s: float) -> None:
        async def go() -> None:
            while not self.stop:
                self.sink.emit("custom", json.dumps({"i": self.n}).encode())
                self.n += 1
                await self.sink.drain()
                self.acks.append((self.n, time.monotonic()))
                await asyncio.sleep(every_s)

        self.task = asyncio.run_coroutine_threadsafe(go(), self.loop)

    def close(self) -> None:
        self.stop = True
        if hasattr(self, "task"):
            self.task.result(timeout=30)
        self.call(self.client.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


class Follower(threading.Thread):
    """A live subscriber from the start; records each item with its arrival time."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        super().__init__(daemon=True)
        self.client = redis_clients.sync_client(settings, socket_timeout=15)
        self.sub = StreamSubscriber(self.client, Keys(settings.redis_prefix), settings)
        self.run_id = run_id
        self.items: list[tuple[object, float]] = []
        self.done = threading.Event()
        self.reconnects = 0

    def run(self) -> None:
        """Like a client: after a broken connection, rejoin after the last event it got."""
        cursor = "-1"
        while not self.done.is_set():
            try:
                for item in self.sub.subscribe(self.run_id, cursor, is_terminal=lambda: False):
                    self.items.append((item, time.monotonic()))
                    if isinstance(item, Event):
                        cursor = item.id
                    if isinstance(item, Gap) or self.done.is_set():
                        return
            except Exception as exc:  # noqa: BLE001 - a client reconnects
                self.reconnects += 1
                log(f"failover: follower reconnects after {type(exc).__name__}")
                time.sleep(0.1)

    def events(self) -> int:
        return sum(isinstance(i, Event) for i, _ in self.items)

    def outcome(self) -> str:
        gap = any(isinstance(i, Gap) for i, _ in self.items)
        return f"{'gap' if gap else 'contiguous'} ({self.reconnects} rejoin)"


def bridge_round(workdir: Path, base: Settings, lost: int) -> BridgeRound:
    """Scenarios 1 and 2 on one HA group each."""
    with RedisHA(workdir / "natural") as ha:
        s = base.model_copy(update={**ha.settings_update(), "stream_heartbeat_s": 1.0})
        run_id = str(uuid.uuid4())
        pub = Publisher(s, run_id)
        pub.emit(1)
        follower = Follower(s, run_id)
        follower.start()
        pub.start_stream(0.005)
        time.sleep(1.0)
        killed = ha.kill_primary()
        acked_before = max(n for n, t in pub.acks if t < killed)
        ha.wait_for_promotion()
        promoted = time.monotonic()
        wait_for(lambda: any(t > killed for _, t in pub.acks), 30, what="a publish after the kill")
        first_pub = min(t for _, t in pub.acks if t > killed)
        wait_for(
            lambda: any(t > promoted and not isinstance(i, Heartbeat) for i, t in follower.items),
            30,
            what="the follower to go on",
        )
        first_follow = min(
            t for i, t in follower.items if t > killed and not isinstance(i, Heartbeat)
        )
        time.sleep(0.5)
        pub.close()
        follower.done.set()
        natural = (
            promoted - killed,
            first_pub - killed,
            first_follow - killed,
            pub.sink.republished + pub.sink.marked_lost,
            pub.sink.republished,
            follower.outcome(),
        )
        log(f"failover: natural {natural}, acked before kill {acked_before}")
    with RedisHA(workdir / "forced") as ha:
        s = base.model_copy(update={**ha.settings_update(), "stream_heartbeat_s": 1.0})
        run_id = str(uuid.uuid4())
        pub = Publisher(s, run_id)
        pub.emit(10)
        ha.node(ha.primary).wait(1, 2000)
        follower = Follower(s, run_id)
        follower.start()
        replica = ha.procs["node1"]
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            ha.node(ha.primary).client_kill_filter(_type="replica")
            pub.emit(lost)
            wait_for(lambda: follower.events() >= 10 + lost, 10, what="the follower to read all")
            ha.kill_primary()
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        ha.wait_for_promotion()
        pub.emit(1)  # the next publish finds the tail missing and repairs it
        follower.join(timeout=15)
        forced = (pub.sink.republished + pub.sink.marked_lost, pub.sink.republished)
        forced_follower = follower.outcome()
        pub.close()
    return BridgeRound(*natural, *forced, forced_follower)


@dataclass
class ClusterRound:
    kill_to_promotion_s: float
    kill_to_run_event_s: float
    kill_to_redispatch_claim_s: float
    run_status: str


def cluster_round(workdir: Path, base: Settings) -> ClusterRound:
    """Scenario 3: real web and worker processes on Sentinel."""
    sandbox = Sandbox(base, "failover", uses_redis=False)
    cluster: Cluster | None = None
    try:
        with RedisHA(workdir / "cluster") as ha:
            settings = sandbox.create().model_copy(update=ha.settings_update())
            extra = {
                **ha.env(),
                "THREADRUN_DATA_DIR": str(workdir / "data"),
                "THREADRUN_API_KEYS": "",
            }
            cluster = Cluster(settings, cluster_env(settings, extra), workdir)
            cluster.start_web()
            cluster.start_worker("worker", concurrency=4)
            pool = make_pool(settings, name="bench-failover", max_size=2)
            store = RunStore(pool)
            try:
                with httpx.Client(base_url=cluster.url, timeout=30) as http:
                    tid = http.post("/threads", json={}).json()["thread_id"]
                    tid2 = http.post("/threads", json={}).json()["thread_id"]
                    body = {
                        "assistant_id": "lead_agent",
                        "input": {"messages": [{"role": "user", "content": "keep going"}]},
                        "stream_mode": ["messages-tuple", "values"],
                        "config": {"configurable": {"tokens": 600, "token_delay_ms": 20}},
                    }
                    run_id = http.post(f"/threads/{tid}/runs", json=body).json()["run_id"]
                wait_for(lambda: store.run_status(run_id) == "running", 30, what="the run")
                time.sleep(1.0)
                key = Keys(settings.redis_prefix).stream(run_id)
                newest = ha.node(ha.primary).xrevrange(key, count=1)
                before_kill = newest[0][0].decode() if newest else "0-0"
                killed_wall_ms = int(time.time() * 1000)
                killed = ha.kill_primary()
                # A run committed at the kill whose message went down with the primary.
                lost_run = str(uuid.uuid4())
                store.admit(
                    RunRequest(
                        thread_id=tid2,
                        assistant_id="lead_agent",
                        input={"messages": [{"role": "user", "content": "lost dispatch"}]},
                        config={"configurable": {"tokens": 3}},
                    ),
                    run_id=lost_run,
                    owner="local",
                    graph_id="lead_agent",
                    strategy=MultitaskStrategy.ENQUEUE,
                )
                ha.wait_for_promotion()
                promoted = time.monotonic()
                master = ha.node(ha.primary)

                def first_after() -> int | None:
                    """The first entry after the newest one the old primary had."""
                    got = master.xrange(key, min=f"({before_kill}", count=1)
                    return int(got[0][0].decode().split("-")[0]) if got else None

                first_ms = wait_for(first_after, 60, what="the run's first event after the kill")
                claimed = wait_for(
                    lambda: store.run_status(lost_run) != "pending" and time.monotonic(),
                    120,
                    what="the reaper to re-dispatch the lost run",
                )
                status = wait_for(
                    lambda: (
                        (store.run_status(run_id) not in ("pending", "running"))
                        and store.run_status(run_id)
                    ),
                    120,
                    what="the run to finish",
                )
                return ClusterRound(
                    promoted - killed,
                    (first_ms - killed_wall_ms) / 1000,
                    float(claimed) - killed,
                    str(status),
                )
            finally:
                pool.close()
                if cluster is not None:
                    cluster.stop()
    finally:
        sandbox.destroy()


def table(rows: list[list[str]], head: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(str(c).rjust(w) for c, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.failover", description=__doc__.splitlines()[0]
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--lost", type=int, default=50, help="events the forced failover loses")
    p.add_argument("--no-cluster", action="store_true", help="skip scenario 3")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    base = Settings().model_copy(update={"redis_prefix": "trfailover:"})
    workdir = Path(tempfile.mkdtemp(prefix="threadrun-failover-"))
    bridge: list[BridgeRound] = []
    clusters: list[ClusterRound] = []
    for i in range(args.repeats):
        log(f"failover: bridge round {i + 1}/{args.repeats}")
        bridge.append(bridge_round(workdir / f"b{i}", base, args.lost))
        log(f"failover:   {asdict(bridge[-1])}")
    if not args.no_cluster:
        for i in range(args.repeats):
            log(f"failover: cluster round {i + 1}/{args.repeats}")
            clusters.append(cluster_round(workdir / f"c{i}", base))
            log(f"failover:   {asdict(clusters[-1])}")
    d = Settings.model_construct()
    print(
        f"threadrun failover: Sentinel down-after {DOWN_AFTER_MS} ms, lease TTL "
        f"{d.lease_ttl_s:g} s, renew {d.lease_renew_s:g} s, reaper {d.reaper_interval_s:g} s, "
        f"dispatch stale {d.dispatch_stale_s:g} s, {len(os.sched_getaffinity(0))} cpus"
    )
    print()
    print("bridge (publisher every 5 ms, follower live), seconds after the SIGKILL:")
    print(
        table(
            [
                [
                    str(i + 1),
                    f"{r.kill_to_promotion_s:.2f}",
                    f"{r.kill_to_publish_s:.2f}",
                    f"{r.kill_to_follower_s:.2f}",
                    str(r.lost),
                    r.follower_outcome,
                    f"{r.forced_lost} -> {r.forced_republished} republished",
                    r.forced_follower,
                ]
                for i, r in enumerate(bridge)
            ],
            [
                "#",
                "promoted",
                "1st publish",
                "follower on",
                "lost",
                "follower",
                f"forced loss ({args.lost})",
                "reader past it",
            ],
        )
    )
    if clusters:
        print()
        print("cluster (web + runs worker), seconds after the SIGKILL:")
        print(
            table(
                [
                    [
                        str(i + 1),
                        f"{r.kill_to_promotion_s:.2f}",
                        f"{r.kill_to_run_event_s:.2f}",
                        f"{r.kill_to_redispatch_claim_s:.2f}",
                        r.run_status,
                    ]
                    for i, r in enumerate(clusters)
                ],
                ["#", "promoted", "run's 1st event", "lost dispatch claimed", "run ended"],
            )
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"bridge": [asdict(b) for b in bridge], "cluster": [asdict(c) for c in clusters]},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
