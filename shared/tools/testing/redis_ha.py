"""A private Redis HA group for tests and benchmarks: a primary, a replica and three Sentinels,
real `redis-server` processes on free ports, stopped by PID (never by name).

    with RedisHA(tmp_path) as ha:
        settings = base.model_copy(update=ha.settings_update())
        ...
        ha.kill_primary()          # SIGKILL, as a node loss
        ha.wait_for_promotion()    # the replica is the master the Sentinels announce
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from pydantic import SecretStr

from shared.tools.devservices import free_port, parent_death_signal, pid_alive, stop_pid

MASTER = "threadrun"
DOWN_AFTER_MS = 1000
"""How long a Sentinel waits before calling the primary down (the failover's floor)."""


def redis_server() -> str:
    """The redis-server binary on PATH (Sentinel mode needs a real one)."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not on PATH")
    return exe


class RedisHA:
    """A primary, a replica and three Sentinels monitoring them as `MASTER`."""

    def __init__(
        self,
        workdir: Path,
        *,
        sentinels: int = 3,
        password: str = "",
        sentinel_password: str = "",
        sync_delay_s: int = 5,
    ) -> None:
        """`password`: the data nodes' (requirepass/masterauth); `sentinel_password`: the
        Sentinels' own (requirepass on them); `sync_delay_s`: the data nodes'
        `repl-diskless-sync-delay` (Redis's default, 5 s, is how long a primary waits for
        more replicas before a full sync: a test's group is up ~5 s sooner with 0)."""
        self.password = password
        self.sentinel_password = sentinel_password
        self.sync_delay_s = sync_delay_s
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.sentinel_count = sentinels
        self.primary = "node0"

    # --- lifecycle ---------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            preexec_fn=parent_death_signal(signal.SIGKILL),
        )
        log.close()

    def _node_argv(self, name: str, port: int, replica_of: int | None) -> list[str]:
        d = self.workdir / name
        d.mkdir(exist_ok=True)
        argv = [
            redis_server(),
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--dir", str(d),
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "no",
            "--repl-diskless-sync-delay", str(self.sync_delay_s),
        ]  # fmt: skip
        if self.password:
            argv += ["--requirepass", self.password, "--masterauth", self.password]
        if replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        return argv

    def start(self) -> RedisHA:
        """Start every process and wait until the Sentinels know the primary and replica."""
        try:
            for name in ("node0", "node1"):
                self.ports[name] = free_port()
            self._spawn("node0", self._node_argv("node0", self.ports["node0"], None))
            self._spawn("node1", self._node_argv("node1", self.ports["node1"], self.ports["node0"]))
            for i in range(self.sentinel_count):
                name = f"sentinel{i}"
                port = free_port()
                self.ports[name] = port
                conf = self.workdir / f"{name}.conf"
                conf.write_text(
                    f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.workdir}\n"
                    f"sentinel monitor {MASTER} 127.0.0.1 {self.ports['node0']} 2\n"
                    f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {MASTER} 10000\n"
                    f"sentinel parallel-syncs {MASTER} 1\n"
                    + (f"sentinel auth-pass {MASTER} {self.password}\n" if self.password else "")
                    + (f"requirepass {self.sentinel_password}\n" if self.sentinel_password else "")
                )
                self._spawn(name, [redis_server(), str(conf), "--sentinel"])
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                info = self.node("node1").info("replication")
                masters = [self._master_info(i) for i in range(self.sentinel_count)]
                if info.get("master_link_status") == "up" and all(
                    int(m.get("num-slaves", 0)) >= 1
                    and int(m.get("num-other-sentinels", 0)) >= self.sentinel_count - 1
                    for m in masters
                ):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the Redis HA group did not come up (logs in {self.workdir})")

    def _master_info(self, i: int) -> dict[str, Any]:
        info: Any = self.sentinel(i).execute_command("SENTINEL MASTER", MASTER)  # type: ignore[no-untyped-call]
        if isinstance(info, list):
            info = dict(zip(info[::2], info[1::2], strict=True))
        return {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in dict(info).items()
        }

    def stop(self) -> None:
        """Stop every process this group started, by PID."""
        for proc in self.procs.values():
            if proc.poll() is None:
                stop_pid(proc.pid, signal.SIGTERM, "redis-server", timeout=3)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
        self.procs.clear()

    def __enter__(self) -> RedisHA:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- access ------------------------------------------------------------------------
    def node(self, name: str) -> redis.Redis:
        """A direct client of one data node."""
        return redis.Redis(
            port=self.ports[name],
            password=self.password or None,
            socket_timeout=2,
            socket_connect_timeout=1,
        )

    def sentinel(self, i: int) -> redis.Redis:
        """A direct client of one Sentinel."""
        return redis.Redis(
            port=self.ports[f"sentinel{i}"],
            password=self.sentinel_password or None,
            socket_timeout=2,
            socket_connect_timeout=1,
        )

    @property
    def sentinels(self) -> str:
        """THREADRUN_REDIS_SENTINELS for this group."""
        return ",".join(
            f"127.0.0.1:{self.ports[f'sentinel{i}']}" for i in range(self.sentinel_count)
        )

    def settings_update(self, db: int = 0) -> dict[str, Any]:
        """Settings fields that point a process at this group through its Sentinels."""
        auth = f":{self.password}@" if self.password else ""
        return {
            "redis_sentinels": self.sentinels,
            "redis_sentinel_master": MASTER,
            "redis_sentinel_password": SecretStr(self.sentinel_password),
            # Host and port are the Sentinels' business; db (and a password) stay here.
            "redis_url": f"redis://{auth}127.0.0.1:{self.ports[self.primary]}/{db}",
        }

    def env(self, db: int = 0) -> dict[str, str]:
        """The same as THREADRUN_* environment variables (for child processes)."""
        return {
            f"THREADRUN_{k.upper()}": v.get_secret_value() if isinstance(v, SecretStr) else str(v)
            for k, v in self.settings_update(db).items()
        }

    def master_port(self) -> int | None:
        """The master port a Sentinel announces now (None if none answers)."""
        for i in range(self.sentinel_count):
            with contextlib.suppress(redis.RedisError):
                host_port: Any = self.sentinel(i).execute_command(  # type: ignore[no-untyped-call]
                    "SENTINEL GET-MASTER-ADDR-BY-NAME", MASTER
                )
                if host_port:
                    return int(host_port[1])
        return None

    def kill_primary(self) -> float:
        """SIGKILL the current primary (a node loss); returns the time.monotonic() of it."""
        proc = self.procs[self.primary]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        return time.monotonic()

    def wait_for_promotion(self, timeout: float = 15.0) -> str:
        """Wait until the Sentinels announce a new master and it accepts writes; its name."""
        old = self.ports[self.primary]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.master_port()
            if port is not None and port != old:
                name = next(n for n, p in self.ports.items() if p == port)
                with contextlib.suppress(redis.RedisError):
                    if self.node(name).info("replication").get("role") == "master":
                        self.primary = name
                        return name
            time.sleep(0.05)
        raise RuntimeError(f"no promotion within {timeout}s (logs in {self.workdir})")

    def restart_as_replica(self, name: str, timeout: float = 15.0) -> None:
        """Start a stopped data node again on its old port as a replica of the current
        primary (the old primary coming back after a failover, as the chaos nemesis heals
        it); returns once it answers."""
        if self.alive(name):
            raise RuntimeError(f"{name} still runs")
        self._spawn(name, self._node_argv(name, self.ports[name], self.ports[self.primary]))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if self.node(name).info("replication").get("role") == "slave":
                    return
            time.sleep(0.05)
        raise RuntimeError(f"{name} did not come back within {timeout}s (logs in {self.workdir})")

    def set_down_after(self, ms: int) -> None:
        """`down-after-milliseconds` on every Sentinel: a test that stalls the primary on
        purpose (`CLIENT PAUSE WRITE` also holds the Sentinels' hello PUBLISHes and the PINGs
        behind them) raises it first, or the Sentinels fail over."""
        for i in range(self.sentinel_count):
            self.sentinel(i).execute_command(  # type: ignore[no-untyped-call]
                "SENTINEL SET", MASTER, "down-after-milliseconds", ms
            )

    def alive(self, name: str) -> bool:
        """Whether the named process still runs."""
        proc = self.procs.get(name)
        return proc is not None and pid_alive(proc.pid)
