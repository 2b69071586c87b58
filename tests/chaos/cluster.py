"""The processes of a chaos run, each on its own host (network namespace).

Redis primary and replica (`replicaof`), three Sentinels, a PostgreSQL cluster of our own
(initdb into the run's directory with the Debian binaries, run as user `postgres`), gunicorn
web hosts and Celery worker hosts configured like a deployment (THREADRUN_* only; see
shared/tools/testing/cluster.py, whose `Proc`, `cluster_env` and `worker_argv` are reused). Every
process is started through `ip netns exec` (which execs it: the pid we hold is the server's)
and stopped by that pid.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import redis
from pydantic import SecretStr

from shared.settings import Settings
from shared.tools.devservices import parent_death_signal
from shared.tools.testing.cluster import PROJECT, Proc, cluster_env, worker_argv
from tests.chaos.net import Host, Network

REDIS_PORT = 6379
SENTINEL_PORT = 26379
PG_PORT = 5432
WEB_PORT = 8000
MASTER_NAME = "threadrun"
API_KEY = "key-chaos"
FAST_LEASES = {
    "THREADRUN_LEASE_TTL_S": "3",
    "THREADRUN_LEASE_RENEW_S": "1",
    "THREADRUN_CANCEL_POLL_S": "0.25",
    "THREADRUN_REAPER_INTERVAL_S": "0.5",
    "THREADRUN_DISPATCH_STALE_S": "1",
    "THREADRUN_SHUTDOWN_GRACE_S": "1",
}
"""Short leases and a fast reaper (as tests/e2e), so a run recovers within seconds."""


def sentinel_supported() -> bool:
    """Whether this checkout's Settings know Redis Sentinel (THREADRUN_REDIS_SENTINELS)."""
    return "redis_sentinels" in Settings.model_fields


def postgres_bin() -> Path:
    """The newest Debian PostgreSQL bin directory."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4])
    )
    if not found:
        raise RuntimeError("no /usr/lib/postgresql/*/bin/postgres (apt-get install postgresql)")
    return Path(found[-1]).parent


def as_postgres(argv: list[str]) -> list[str]:
    """`argv` run as the unprivileged user `postgres` (root cannot run a server); setpriv
    execs, so the pid stays the server's."""
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", *argv]


class ChaosCluster:
    """Every host and process of one run; `stop()` ends each process by its pid."""

    def __init__(
        self,
        net: Network,
        workdir: Path,
        *,
        webs: int,
        workers: int,
        sentinels: int,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.net = net
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        self.n_webs, self.n_workers, self.n_sentinels = webs, workers, sentinels
        self.sentinel = sentinel_supported()
        self.settings: Settings | None = None
        self.env: dict[str, str] = {}
        self.extra_env = dict(env or {})
        # Every process is forked by this one thread, which lives until stop(): the kernel
        # sends the parent-death signal when the *thread* that forked a child ends, so a
        # process the nemesis thread started (a replacement worker, the old primary back as
        # a replica) would otherwise be killed as soon as the nemesis finishes its schedule.
        self._spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spawner")

    # --- hosts --------------------------------------------------------------------------
    def make_hosts(self) -> None:
        """Every namespace, in a fixed order (addresses are stable for a layout)."""
        self.net.create()
        names = ["redis1", "redis2", *[f"sentinel{i + 1}" for i in range(self.n_sentinels)], "pg"]
        names += [f"web{i + 1}" for i in range(self.n_webs)]
        names += [f"worker{i + 1}" for i in range(self.n_workers)]
        names.append("client")
        for name in names:
            self.net.add_host(name)

    def host(self, name: str) -> Host:
        return self.net.hosts[name]

    @property
    def webs(self) -> list[Host]:
        return [h for n, h in self.net.hosts.items() if n.startswith("web")]

    @property
    def workers(self) -> list[Host]:
        return [h for n, h in self.net.hosts.items() if n.startswith("worker")]

    @property
    def redis_ips(self) -> list[str]:
        return [h.ip for n, h in self.net.hosts.items() if n.startswith(("redis", "sentinel"))]

    def urls(self) -> list[str]:
        return [f"http://{h.ip}:{WEB_PORT}" for h in self.webs]

    # --- processes ----------------------------------------------------------------------
    def spawn(
        self,
        host: Host,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        role: str = "",
    ) -> Proc:
        """Start `argv` inside `host` with its output in `<logs>/<name>.log`."""
        log = self.logs / f"{name}.log"

        def fork() -> subprocess.Popen[bytes]:
            with log.open("ab") as fh:
                return subprocess.Popen(
                    host.exec_argv(argv),
                    env=dict(env) if env is not None else None,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    cwd=PROJECT,
                    preexec_fn=parent_death_signal(signal.SIGKILL),
                )

        popen = self._spawner.submit(fork).result()
        proc = Proc(name, popen, log, role)
        proc.url = host.name
        self.procs.append(proc)
        return proc

    def proc(self, name: str) -> Proc | None:
        """The latest live process named `name`."""
        live = [p for p in self.procs if p.name == name and p.alive()]
        return live[-1] if live else None

    def wait_until(self, check: object, proc: Proc, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited while {what}:\n{proc.tail()}")
            with contextlib.suppress(Exception):
                if check():  # type: ignore[operator]
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{proc.name}: timed out {what}:\n{proc.tail()}")

    # --- Redis --------------------------------------------------------------------------
    def start_redis(self, name: str, replica_of: str | None = None) -> Proc:
        host = self.host(name)
        argv = ["redis-server", "--bind", host.ip, "--port", str(REDIS_PORT), "--save", "",
                "--appendonly", "no", "--protected-mode", "no", "--dir", str(self.workdir)]  # fmt: skip
        if replica_of:
            argv += ["--replicaof", replica_of, str(REDIS_PORT)]
        proc = self.spawn(host, name, argv, role="redis")
        client = redis.Redis(host=host.ip, port=REDIS_PORT, socket_timeout=1)
        self.wait_until(client.ping, proc, 20, "starting redis")
        client.close()
        return proc

    def start_sentinel(self, name: str) -> Proc:
        host = self.host(name)
        conf = self.workdir / f"{name}.conf"
        primary = self.host("redis1").ip
        conf.write_text(
            f"port {SENTINEL_PORT}\nbind {host.ip}\nprotected-mode no\ndir {self.workdir}\n"
            f"sentinel monitor {MASTER_NAME} {primary} {REDIS_PORT} 2\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} 2000\n"
            f"sentinel failover-timeout {MASTER_NAME} 10000\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n"
        )
        proc = self.spawn(host, name, ["redis-server", str(conf), "--sentinel"], role="sentinel")
        client = redis.Redis(host=host.ip, port=SENTINEL_PORT, socket_timeout=1)
        self.wait_until(client.ping, proc, 20, "starting sentinel")
        client.close()
        return proc

    # --- PostgreSQL ---------------------------------------------------------------------
    @property
    def pgdata(self) -> Path:
        return self.workdir / "pgdata"

    def init_postgres(self) -> None:
        """initdb (trust auth, user postgres) into the run's directory, owned by postgres."""
        os.chmod(self.workdir, 0o755)
        self.pgdata.mkdir()
        sock = self.workdir / "pgsock"
        sock.mkdir()
        shutil.chown(self.pgdata, "postgres", "postgres")
        shutil.chown(sock, "postgres", "postgres")
        bindir = postgres_bin()
        res = subprocess.run(
            as_postgres([str(bindir / "initdb"), "-D", str(self.pgdata), "-A", "trust", "-U", "postgres"]),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"initdb failed: {res.stderr}")
        with (self.pgdata / "pg_hba.conf").open("a") as fh:
            fh.write(f"host all all {self.net.subnet} trust\n")

    def start_postgres(self) -> Proc:
        host = self.host("pg")
        argv = as_postgres([
            str(postgres_bin() / "postgres"), "-D", str(self.pgdata), "-p", str(PG_PORT),
            "-c", f"listen_addresses={host.ip}", "-c", f"unix_socket_directories={self.workdir / 'pgsock'}",
            "-c", "max_connections=300", "-c", "fsync=off", "-c", "shared_buffers=64MB",
        ])  # fmt: skip
        proc = self.spawn(host, "pg", argv, role="pg")
        dsn = self.pg_dsn("postgres")
        self.wait_until(
            lambda: psycopg.connect(dsn, connect_timeout=2).close() or True,
            proc,
            30,
            "starting postgres",
        )
        return proc

    def pg_dsn(self, db: str = "threadrun") -> str:
        return f"postgresql://postgres@{self.host('pg').ip}:{PG_PORT}/{db}?connect_timeout=5"

    def restart_postgres(self, down_s: float) -> None:
        """Fast shutdown (SIGINT: every session is ended), `down_s` down, start again."""
        proc = self.proc("pg")
        if proc is not None:
            proc.stop(signal.SIGINT, timeout=30)
        time.sleep(down_s)
        self.start_postgres()

    # --- the app ------------------------------------------------------------------------
    def configure(self) -> Settings:
        """Create and migrate the database; every app process's environment."""
        from shared.db.migrate import migrate

        with psycopg.connect(self.pg_dsn("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE threadrun")
        primary = self.host("redis1").ip
        settings = Settings().model_copy(
            update={
                "database_url": SecretStr(self.pg_dsn()),
                "redis_url": f"redis://{primary}:{REDIS_PORT}/0",
                "redis_prefix": "trchaos:",
                "data_dir": self.workdir / "data",
            }
        )
        migrate(settings)
        extra = {
            **FAST_LEASES,
            "THREADRUN_API_KEYS": f"{API_KEY}:chaos",
            "THREADRUN_ALLOWED_HOSTS": "*",
            "PYTHONPATH": f"{PROJECT}:{PROJECT / 'clients' / 'python'}",
            **self.extra_env,
        }
        if self.sentinel:
            sentinels = [h for n, h in self.net.hosts.items() if n.startswith("sentinel")]
            extra["THREADRUN_REDIS_SENTINELS"] = ",".join(
                f"{h.ip}:{SENTINEL_PORT}" for h in sentinels
            )
            extra["THREADRUN_REDIS_SENTINEL_MASTER"] = MASTER_NAME
        self.env = cluster_env(settings, extra)
        self.settings = settings
        return settings

    def start_web(self, host: Host) -> Proc:
        argv = [sys.executable, "-m", "gunicorn", "-c", "python:app.gunicorn_conf"]
        env = {
            **self.env,
            "THREADRUN_HOST": host.ip,
            "THREADRUN_PORT": str(WEB_PORT),
            "THREADRUN_WEB_WORKERS": "1",
            "THREADRUN_WEB_THREADS": "64",
            "THREADRUN_WEB_GRACEFUL_TIMEOUT_S": "3",
            "THREADRUN_DB_POOL_MAX": "8",
        }
        proc = self.spawn(host, host.name, argv, env, role="web")
        url = f"http://{host.ip}:{WEB_PORT}/ok"
        self.wait_until(
            lambda: httpx.get(url, timeout=2).status_code == 200, proc, 90, "starting web"
        )
        return proc

    def spawn_worker(self, host: Host, concurrency: int = 4) -> Proc:
        env = {**self.env, "THREADRUN_WORKER_CONCURRENCY": str(concurrency)}
        argv = worker_argv(host.name, concurrency)
        return self.spawn(host, host.name, argv, env, role="worker")

    def wait_worker(self, proc: Proc, timeout: float = 120) -> None:
        self.wait_until(lambda: "ready." in proc.output(), proc, timeout, "starting the worker")

    def start(self) -> None:
        """Every server, then the app processes (workers boot while the webs do); initdb
        (no network needed) runs while the hosts and Redis come up."""
        with ThreadPoolExecutor(1) as side:
            initdb = side.submit(self.init_postgres)
            self.make_hosts()
            self.start_redis("redis1")
            self.start_redis("redis2", replica_of=self.host("redis1").ip)
            for i in range(self.n_sentinels):
                self.start_sentinel(f"sentinel{i + 1}")
            initdb.result()
        self.start_postgres()
        self.configure()
        booting = [self.spawn_worker(h) for h in self.workers]
        for h in self.webs:
            self.start_web(h)
        for p in booting:
            self.wait_worker(p)

    def live_worker_pids(self) -> set[int]:
        return {p.pid for p in self.procs if p.role == "worker" and p.alive()}

    def stop(self) -> None:
        """SIGCONT (a frozen process ignores SIGTERM until then), SIGTERM, wait, SIGKILL;
        the workload and app processes first, then the servers."""
        order = ("client", "web", "worker", "sentinel", "redis", "pg")
        for role in order:
            targets = [p for p in self.procs if p.role == role and p.alive()]
            for p in targets:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
                    p.popen.send_signal(signal.SIGINT if role == "pg" else signal.SIGTERM)
            deadline = time.monotonic() + 10
            for p in targets:
                try:
                    p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.popen.kill()
                    p.popen.wait(timeout=5)
        for p in self.procs:  # reap everything, also what died on its own
            with contextlib.suppress(Exception):
                p.popen.wait(timeout=1)
        self._spawner.shutdown(wait=False)
