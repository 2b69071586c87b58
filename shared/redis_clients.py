"""The one place Redis clients are built: direct (THREADRUN_REDIS_URL) or through Sentinel.

Every process component (web, worker runtime, memory queue, cron scheduler, Celery's broker)
gets its clients here, so that turning on `THREADRUN_REDIS_SENTINELS` moves all of them to
the Sentinel-managed master at once. The data node's password, user and db index always come
from `THREADRUN_REDIS_URL`; its host and port are then only the Sentinels' business.

After a failover a Sentinel-managed connection asks the Sentinels for the new master on its
next connect, and a connection still open to a demoted master turns its `READONLY` reply into
a ConnectionError (redis-py's `SentinelManagedConnection`), so both kinds of failure reach
the retry policy below as connection errors.

Two defects of redis-py's `SentinelManagedConnection` (8.1) are corrected by the connection
classes below (`SentinelConnection`, `AsyncSentinelConnection`), which every Sentinel client
here uses, Celery's broker included (shared/runs/taskqueue.py):
- its `read_response` does not disconnect when a read is interrupted (redis-py's plain
  `Connection` does): a greenlet killed or timed out (gevent) while it waited for a reply put
  the connection back in the pool with that reply unread, and every later command on it read
  the reply of the command before (a chaos run's failover: `cannot unpack non-iterable int
  object` in app/limits.py, "Wrong number of response items" in the ops reporter). Now any
  error during a read, or during the connect handshake, closes the socket: a connection whose
  reply may still come is never reused;
- a connection that failed mid-command reconnects, for the retry, to the address it had (the
  old primary), not through the Sentinels: a retried command kept hammering a dead primary
  until its retries ran out, and once the old primary was back as a replica, reads (the
  subscription hub's XREAD) stayed on it. Now every reconnect asks the Sentinels.

Why retrying a command after a connection error is safe here (`RETRIED_ERRORS`,
`THREADRUN_REDIS_RETRIES`): a command whose reply was lost may have run, so a retry may
apply it twice. Everything we send is either idempotent or fails safe under that:
- lease scripts (shared/lua/lease_*.lua): claim sets the same `{epoch}|{owner}` value again
  (a claim never lowers the epoch), renew is compare-and-extend, release compare-and-delete;
  running any of them twice equals running it once. The ownership itself is fenced by the
  Postgres epoch (L2), never by the Redis reply, so even a lease lost with a failover can
  produce no second owner's writes;
- the publish script numbers each attempt's events (`first_seq`): a repeat adds nothing
  (and StreamPublisher has its own, longer retry loop on top);
- slot scripts (limit_reserve_run, limit_acquire_connection, limit_bind_run,
  limit_release_run) add or remove a named member: idempotent;
- the rate limiter (limit_rate.lua) is the one counter: a retried call may charge a request
  twice, which can only refuse a later request early (fail closed, never over-admit);
- the memory queue's admission RPUSHes an update: a retry could admit it twice, so the memory
  queue's client is built with `retry_commands=False` (an admission that fails is reported
  by the caller, M4/M5), see shared/memory/services.py;
- Celery's broker connection is kombu's (its own reconnect loop; tasks are acked early and
  a lost dispatch is the reaper's to repair, R4).
"""

from __future__ import annotations

import math
import random
from typing import Any
from urllib.parse import quote

import redis
import redis.asyncio as aredis
import redis.asyncio.retry as aretry
import redis.asyncio.sentinel as asentinel
import redis.sentinel as sentinel
from redis.backoff import ExponentialWithJitterBackoff
from redis.connection import parse_url
from redis.exceptions import ConnectionError, ReadOnlyError, RedisError, TimeoutError
from redis.retry import Retry
from redis.utils import SENTINEL

from shared.settings import Settings

RETRIED_ERRORS: tuple[type[RedisError], ...] = (ConnectionError, TimeoutError, ReadOnlyError)
"""What a command is retried after (`THREADRUN_REDIS_RETRIES` times, with jittered exponential
back-off: each wait uniform in [0, min(cap, base * 2^n)]). The defaults (8, 0.1 s, 1 s) wait at
most ~5.5 s in all, so a request usually rides through a Sentinel failover (the replica is
promoted ~2.3 s after the primary dies with down-after-milliseconds 1000, bench/failover.py)
instead of failing, while no single wait overshoots the promotion by more than the cap (a
2 s cap measured 4.4 s to a publisher's first event after the kill, 1 s gave 2.8 s in two of
three rounds)."""


def sentinel_enabled(settings: Settings) -> bool:
    """Whether Redis is reached through Sentinel."""
    return bool(settings.sentinel_nodes)


class _PrivateJitterBackoff(ExponentialWithJitterBackoff):
    """redis-py's jittered exponential back-off drawn from a generator of its own: the
    library's draws from the process-wide `random` module, so a client retrying in a
    background thread would move the state that other code (seeded simulations, hypothesis)
    expects to own."""

    def __init__(self, base_s: float, cap_s: float) -> None:
        super().__init__(cap=cap_s, base=base_s)
        self._base_s, self._cap_s = base_s, cap_s
        self._rng = random.Random()

    def compute(self, failures: int) -> float:
        return min(self._cap_s, math.ldexp(self._rng.random() * self._base_s, failures))


def _retry(settings: Settings, retry_commands: bool) -> Retry:
    return Retry(
        _PrivateJitterBackoff(settings.redis_retry_base_s, settings.redis_retry_cap_s),
        settings.redis_retries if retry_commands else 0,
        supported_errors=RETRIED_ERRORS,
    )


def _aretry(settings: Settings, retry_commands: bool) -> aretry.Retry:
    return aretry.Retry(
        _PrivateJitterBackoff(settings.redis_retry_base_s, settings.redis_retry_cap_s),
        settings.redis_retries if retry_commands else 0,
        supported_errors=RETRIED_ERRORS,
    )


def _node_kwargs(settings: Settings) -> dict[str, Any]:
    """The data node's credentials and db from the URL (its host/port come from Sentinel)."""
    parsed: dict[str, Any] = parse_url(settings.redis_url)  # type: ignore[no-untyped-call, unused-ignore]
    out: dict[str, Any] = {"db": parsed.get("db", 0)}
    for name in ("username", "password"):
        if parsed.get(name):
            out[name] = parsed[name]
    if parsed.get("connection_class") is redis.SSLConnection:
        out["ssl"] = True
    return out


def _sentinel_kwargs(settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {
        "socket_timeout": settings.redis_sentinel_timeout_s,
        "socket_connect_timeout": settings.redis_sentinel_timeout_s,
    }
    password = settings.redis_sentinel_password.get_secret_value()
    if password:
        out["password"] = password
    return out


class SentinelConnection(sentinel.SentinelManagedConnection):
    """A Sentinel-managed connection that is never reused with a reply pending and always
    reconnects through the Sentinels (why: the module's docstring)."""

    def read_response(
        self,
        disable_decoding: bool = False,
        *,
        timeout: float | object = SENTINEL,
        disconnect_on_error: bool | None = True,
        push_request: bool | None = False,
    ) -> Any:
        # redis-py's Sentinel connection defaults `disconnect_on_error` to False: an
        # exception while waiting for a reply (GreenletExit from a killed greenlet, a gevent
        # Timeout, ...) left the reply in flight and the connection in the pool.
        return super().read_response(
            disable_decoding=disable_decoding,
            timeout=timeout,
            disconnect_on_error=disconnect_on_error,
            push_request=push_request,
        )

    def connect_to(self, address: tuple[str, int]) -> None:
        # The handshake (AUTH, SELECT, ...) reads replies too; redis-py closes the socket
        # only on a RedisError there.
        try:
            super().connect_to(address)  # type: ignore[no-untyped-call, unused-ignore]
        except BaseException:
            self.disconnect()  # type: ignore[no-untyped-call, unused-ignore]
            raise

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        # redis-py reconnects a dropped connection here with `connect_check_health()`, to
        # the host and port it last had: a retry after a failover went to the old primary.
        if not self._sock:
            self.connect()  # type: ignore[no-untyped-call]  # through the Sentinels
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call, unused-ignore]


class SentinelSSLConnection(SentinelConnection, sentinel.SentinelManagedSSLConnection):
    """`SentinelConnection` over TLS."""


class AsyncSentinelConnection(asentinel.SentinelManagedConnection):
    """The worker runtime's `SentinelConnection`: reconnects through the Sentinels (redis-py's
    asyncio Sentinel connection already disconnects on any read error, cancellation
    included)."""

    async def connect_to(self, address: tuple[str, int]) -> None:
        try:
            await super().connect_to(address)  # type: ignore[no-untyped-call, unused-ignore]
        except BaseException:
            await self.disconnect(nowait=True)
            raise

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self.is_connected:
            await self.connect()  # type: ignore[no-untyped-call]  # through the Sentinels
        await super().send_packed_command(command, check_health)


class AsyncSentinelSSLConnection(AsyncSentinelConnection, asentinel.SentinelManagedSSLConnection):
    """`AsyncSentinelConnection` over TLS."""


def _sentinel_connection_class(settings: Settings, *, asynchronous: bool = False) -> type[Any]:
    tls = bool(_node_kwargs(settings).get("ssl"))
    if asynchronous:
        return AsyncSentinelSSLConnection if tls else AsyncSentinelConnection
    return SentinelSSLConnection if tls else SentinelConnection


class SentinelBlockingConnectionPool(sentinel.SentinelConnectionPool, redis.BlockingConnectionPool):
    """A Sentinel-managed pool that waits for a free connection (the web's pool, under
    gevent) instead of failing beyond `max_connections`."""


def sync_client(
    settings: Settings,
    *,
    blocking: bool = False,
    retry_commands: bool = True,
    **kwargs: Any,
) -> redis.Redis:
    """A redis-py client of the data node. `blocking`: a BlockingConnectionPool (kwargs
    `max_connections`, `timeout` apply); other kwargs are connection options."""
    kwargs.setdefault("retry", _retry(settings, retry_commands))
    if not sentinel_enabled(settings):
        if blocking:
            return redis.Redis(
                connection_pool=redis.BlockingConnectionPool.from_url(settings.redis_url, **kwargs)
            )
        return redis.Redis.from_url(settings.redis_url, **kwargs)
    manager = sentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        settings.sentinel_nodes,
        sentinel_kwargs=_sentinel_kwargs(settings),
        **_node_kwargs(settings),
    )
    pool_class = SentinelBlockingConnectionPool if blocking else sentinel.SentinelConnectionPool
    kwargs.setdefault("connection_class", _sentinel_connection_class(settings))
    client: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        settings.redis_sentinel_master, connection_pool_class=pool_class, **kwargs
    )
    return client


def async_client(settings: Settings, *, retry_commands: bool = True, **kwargs: Any) -> aredis.Redis:
    """A redis.asyncio client of the data node (the worker runtime's)."""
    kwargs.setdefault("retry", _aretry(settings, retry_commands))
    if not sentinel_enabled(settings):
        return aredis.Redis.from_url(settings.redis_url, **kwargs)
    manager = asentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        settings.sentinel_nodes,
        sentinel_kwargs=_sentinel_kwargs(settings),
        **_node_kwargs(settings),
    )
    kwargs.setdefault("connection_class", _sentinel_connection_class(settings, asynchronous=True))
    client: aredis.Redis = manager.master_for(settings.redis_sentinel_master, **kwargs)
    return client


def celery_broker(settings: Settings) -> tuple[str, dict[str, Any]]:
    """Celery's broker URL and the transport options it needs: the Redis URL itself, or
    kombu's `sentinel://` transport (one URL per Sentinel, the data node's credentials and
    db in each) with `master_name` and the Sentinels' own connection options."""
    if not sentinel_enabled(settings):
        return settings.redis_url, {}
    node = _node_kwargs(settings)
    auth = ""
    if node.get("password"):
        auth = f"{quote(node.get('username', ''), safe='')}:{quote(node['password'], safe='')}@"
    urls = [
        f"sentinel://{auth}{'[' + h + ']' if ':' in h else h}:{p}/{node['db']}"
        for h, p in settings.sentinel_nodes
    ]
    options: dict[str, Any] = {
        "master_name": settings.redis_sentinel_master,
        "sentinel_kwargs": _sentinel_kwargs(settings),
    }
    return ";".join(urls), options
