"""Redis high availability with real processes: a primary, a replica and three Sentinels on
free ports (shared/tools/testing/redis_ha.py), clients built from settings
(THREADRUN_REDIS_SENTINELS) by shared/redis_clients.py. The primary is SIGKILLed; after the
promotion, leases, publishing, reading and Celery dispatch work against the new master, and a
tail the promoted replica never received is repaired and reported as a gap (B5, L1).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from shared import redis_clients
from shared.bridge.base import Event, Gap, Heartbeat, StreamItem
from shared.bridge.publisher import EventSink, PublishBatcher, StreamPublisher
from shared.bridge.subscriber import StreamSubscriber
from shared.redis_keys import Keys
from shared.runs.leases import LeaseManager, RenewOutcome, lease_value
from shared.runs.taskqueue import RUNS_QUEUE, Dispatcher
from shared.settings import Settings
from shared.tools.testing.redis_ha import RedisHA, redis_server

pytestmark = pytest.mark.skipif(
    not any(
        os.access(os.path.join(p, "redis-server"), os.X_OK) for p in os.environ["PATH"].split(":")
    ),
    reason="needs a redis-server binary on PATH (Sentinel mode)",
)


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[RedisHA]:
    """The HA group; every process is stopped by PID, also when the test fails."""
    redis_server()
    with RedisHA(tmp_path / "ha", sync_delay_s=0) as group:
        yield group


@pytest.fixture
def ha_auth(tmp_path: Path) -> Iterator[RedisHA]:
    """The HA group with a password on the data nodes and another on the Sentinels."""
    with RedisHA(
        tmp_path / "ha", password="node-pw", sentinel_password="sentinel-pw", sync_delay_s=0
    ) as group:
        yield group


@pytest.fixture
def hsettings(settings: Settings, ha: RedisHA) -> Settings:
    return settings.model_copy(
        update={**ha.settings_update(db=0), "stream_heartbeat_s": 0.5, "redis_prefix": "ha:"}
    )


class Worker:
    """A worker's async side on its own loop: lease manager and an attempt's event sink,
    on the Sentinel-managed async client."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        self.settings = settings
        self.run_id = run_id
        self.keys = Keys(settings.redis_prefix)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.lease = lease_value(1, "w1")
        self.call(self._setup())

    async def _setup(self) -> None:
        self.client = redis_clients.async_client(self.settings)
        self.leases = LeaseManager(self.client, self.keys, ttl_s=30)
        assert await self.leases.acquire(self.run_id, 1, "w1")
        pub = StreamPublisher(self.client, self.keys, self.settings)
        self.sink = EventSink(
            PublishBatcher(pub), self.run_id, self.lease, on_cancel=print, on_lost=print
        )

    def call(self, coro: Any, timeout: float = 20) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)

    def emit(self, *items: int) -> None:
        async def go() -> None:
            for i in items:
                self.sink.emit("custom", f'{{"i": {i}}}'.encode())
            await self.sink.drain()

        self.call(go())

    def renew(self) -> Any:
        async def go() -> Any:
            acked = self.sink.acked_seq
            (r,) = await self.leases.renew_many([(self.run_id, self.lease)], stream_seq=True)
            if r.outcome is RenewOutcome.RENEWED and r.stream_seq < acked:
                self.sink.check_tail()
                await self.sink.drain()
            return r

        return self.call(go())

    def close(self) -> None:
        self.call(self.client.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


def read(sub: StreamSubscriber, run_id: str, cursor: str | None) -> list[StreamItem]:
    out: list[StreamItem] = []
    for item in sub.subscribe(run_id, cursor, is_terminal=lambda: False):
        if isinstance(item, Heartbeat):
            break
        out.append(item)
    return out


def datas(items: list[StreamItem]) -> list[str]:
    return [i.data for i in items if isinstance(i, Event)]


def expected(n: int) -> list[str]:
    return [f'{{"i": {i}}}' for i in range(n)]


def test_l1_b1_sentinel_clients_follow_a_failover(ha_auth: RedisHA, settings: Settings) -> None:
    """L1, B1, R4: with THREADRUN_REDIS_SENTINELS every client finds the master (the node's
    password from the URL, the Sentinels' from THREADRUN_REDIS_SENTINEL_PASSWORD); after the
    primary is SIGKILLed and the replica promoted, the same clients (web pool, worker async
    client, Celery's broker) renew leases, publish, read and dispatch on the new master."""
    ha = ha_auth
    hsettings = settings.model_copy(
        update={**ha.settings_update(db=0), "stream_heartbeat_s": 0.5, "redis_prefix": "ha:"}
    )
    run_id = str(uuid.uuid4())
    web = redis_clients.sync_client(hsettings, blocking=True, max_connections=8, timeout=5)
    sub = StreamSubscriber(web, Keys(hsettings.redis_prefix), hsettings)
    worker = Worker(hsettings, run_id)
    dispatcher = Dispatcher.of(hsettings, web)
    try:
        worker.emit(0, 1, 2)
        assert datas(read(sub, run_id, "-1")) == expected(3)
        dispatcher.dispatch_run("before")
        assert web.wait(1, 2000) == 1  # replicated: this failover loses nothing

        ha.kill_primary()
        ha.wait_for_promotion()

        assert worker.renew().outcome is RenewOutcome.RENEWED
        worker.emit(3, 4)
        assert datas(read(sub, run_id, "-1")) == expected(5)
        assert worker.sink.repairs == 0
        other = str(uuid.uuid4())
        assert worker.call(worker.leases.acquire(other, 1, "w2"))
        dispatcher.dispatch_run("after")
        queue = Keys(hsettings.redis_prefix).celery_queue(RUNS_QUEUE)
        assert ha.node(ha.primary).llen(queue) == 2
    finally:
        worker.close()
        web.close()


def test_b5_real_failover_that_loses_the_tail_is_repaired_and_gapped(
    ha: RedisHA, hsettings: Settings
) -> None:
    """B5: the replica is frozen (SIGSTOP) and its link cut while the primary acknowledges
    three more events, then the primary is SIGKILLed and the replica, thawed, promoted
    without them. The
    publisher's next renewal finds its stream behind and republishes them; a reader from the
    start gets every event once, a reader that had seen the lost ones gets a gap."""
    run_id = str(uuid.uuid4())
    web = redis_clients.sync_client(hsettings, blocking=True, max_connections=8, timeout=5)
    sub = StreamSubscriber(web, Keys(hsettings.redis_prefix), hsettings)
    worker = Worker(hsettings, run_id)
    replica = ha.procs["node1"]
    try:
        worker.emit(0, 1, 2)
        assert web.wait(1, 2000) == 1
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            # Cut the frozen replica's link first: what follows is never sent to it.
            ha.node(ha.primary).client_kill_filter(_type="replica")
            worker.emit(3, 4, 5)  # acknowledged by the primary only
            seen = read(sub, run_id, "-1")
            assert datas(seen) == expected(6)
            ha.kill_primary()
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        ha.wait_for_promotion()
        new_master = ha.node(ha.primary)
        assert new_master.xlen(Keys(hsettings.redis_prefix).stream(run_id)) == 3  # tail lost

        started = time.monotonic()
        assert worker.renew().outcome is RenewOutcome.RENEWED  # the lease was replicated
        assert (worker.sink.repairs, worker.sink.republished) == (1, 3)
        assert time.monotonic() - started < 10
        assert datas(read(sub, run_id, "-1")) == expected(6)
        lost_cursor = [e.id for e in seen if isinstance(e, Event)][-1]
        got = read(sub, run_id, lost_cursor)
        assert len(got) == 1 and isinstance(got[0], Gap)
        worker.emit(6)
        assert datas(read(sub, run_id, "-1")) == expected(7)
    finally:
        worker.close()
        web.close()


def test_l1_sentinel_settings_are_validated() -> None:
    """THREADRUN_REDIS_SENTINELS is host:port entries: a bad one is named at start-up."""
    with pytest.raises(ValueError, match="redis_sentinels"):
        Settings(redis_sentinels="cache-without-port")
    s = Settings(redis_sentinels="a:26379, b:26380", redis_url="redis://:pw@x:1/3")
    assert s.sentinel_nodes == [("a", 26379), ("b", 26380)]
    url, options = redis_clients.celery_broker(s)
    assert url == "sentinel://:pw@a:26379/3;sentinel://:pw@b:26380/3"
    assert options["master_name"] == "threadrun" and "password" not in options["sentinel_kwargs"]
    assert isinstance(redis_clients.sync_client(s), redis.Redis)


class _Interrupted(BaseException):
    """Raised into a blocked read, as gevent raises GreenletExit into a killed greenlet."""


def _interrupt_after(seconds: float) -> None:
    def raise_it(signum: int, frame: Any) -> None:
        raise _Interrupted

    signal.signal(signal.SIGALRM, raise_it)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def test_l2_b5_an_interrupted_read_never_leaves_its_reply_for_the_next_command(
    ha: RedisHA, hsettings: Settings
) -> None:
    """L2, B5: a command interrupted while it waits for its reply (the web's hang-up watcher
    is killed mid-ZREM when its stream closes) must not hand its connection back with that
    reply still to come: the next command on it would read it (a chaos run's failover:
    `cannot unpack non-iterable int object` in the rate limiter's script call). With the
    Sentinel client, as with a direct one, the interrupted connection is closed."""
    client = redis_clients.sync_client(hsettings, blocking=True, max_connections=1, timeout=5)
    previous = signal.getsignal(signal.SIGALRM)
    try:
        client.set("ha:n", 7)
        _interrupt_after(0.2)
        with pytest.raises(_Interrupted):
            client.blpop(["ha:nothing"], timeout=1)  # its reply (nil) comes after 1 s
        signal.setitimer(signal.ITIMER_REAL, 0)
        assert client.get("ha:n") == b"7"  # not BLPOP's nil
        assert client.incr("ha:n") == 8
        assert client.get("ha:n") == b"8"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        client.close()


def test_l1_a_retried_command_reconnects_through_the_sentinels(
    ha: RedisHA, hsettings: Settings
) -> None:
    """L1: a connection whose command fails after the primary died reconnects, for the
    retry, to the master the Sentinels announce, not to the address it had: with the old
    primary back as a replica on its old port (as the chaos nemesis heals it), the held
    connection of the web's subscription hub kept reading from the demoted node, and a
    retried write failed with READONLY on every attempt."""
    client = redis_clients.sync_client(hsettings, blocking=True, max_connections=4, timeout=5)
    held = redis.Redis(connection_pool=client.connection_pool, single_connection_client=True)
    try:
        assert held.info("replication")["role"] == "master"
        old = ha.primary
        ha.kill_primary()
        ha.wait_for_promotion()
        ha.restart_as_replica(old)
        assert held.info("replication")["role"] == "master"  # served by the new master
        assert held.set("ha:after", 1)
        assert ha.node(ha.primary).get("ha:after") == b"1"
    finally:
        held.close()
        client.close()
