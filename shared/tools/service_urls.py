"""The URLs and probes of the dev services: where a Redis or PostgreSQL server is, and
whether it answers (shared/tools/devservices.py decides which to use; embedded.py starts
its own)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from shared.errors import ConfigError
from shared.redaction import redact
from shared.settings import Settings

LOCAL_REDIS_URL = "redis://127.0.0.1:6379"
LOCAL_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432"
DEFAULT_DB_NAME = "threadrun"
MAINTENANCE_DB = "postgres"


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


def probe_pg_server(url: str) -> str | None:
    """Probe the server of ``url`` through its maintenance database."""
    return probe_postgres(with_database(url, MAINTENANCE_DB))


def _note(message: str) -> None:
    """Tell the user (stderr, so that stdout stays a list of export lines)."""
    print(f"devservices: {message}", file=sys.stderr, flush=True)
