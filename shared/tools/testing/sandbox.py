"""Private databases and Redis key prefixes for tests and benchmarks, removed exactly.

Tests and benchmarks share the machine's PostgreSQL and Redis with developers and CI, so
each makes a database and a key prefix of its own and deletes exactly those at the end.
"""

from __future__ import annotations

import uuid

import psycopg
import redis
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import SecretStr

from shared.settings import Settings
from shared.tools.devservices import MAINTENANCE_DB

DELETE_BATCH = 500


def server_dsn(database_url: str, dbname: str) -> str:
    """The server of `database_url` (its host, user and options) with database `dbname`."""
    params = conninfo_to_dict(database_url)
    params["dbname"] = dbname
    return make_conninfo(**params)  # type: ignore[arg-type]


def create_database(server_url: str, name: str, *, template: str | None = None) -> str:
    """CREATE DATABASE `name` on the server of `server_url` (a copy of the database
    `template` if given: nobody may be connected to that one); return its URL."""
    query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        query += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with psycopg.connect(server_dsn(server_url, MAINTENANCE_DB), autocommit=True) as conn:
        conn.execute(query)
    return server_dsn(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    """DROP DATABASE `name` if it exists, forcing out leftover connections."""
    with psycopg.connect(server_dsn(server_url, MAINTENANCE_DB), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    """Delete every key under `prefix` (SCAN, in batches); return how many."""
    n = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        batch.append(key)
        if len(batch) >= DELETE_BATCH:
            n += int(client.delete(*batch))
            batch.clear()
    if batch:
        n += int(client.delete(*batch))
    return n


class Sandbox:
    """A private, migrated database and a Redis key prefix, removed exactly by `destroy()`.

    Named `threadrun_<kind>_<tag>` and `tr<kind>:<tag>:` so that a leftover says who made it.
    With `uses_redis=False` nothing is deleted in Redis (for users of PostgreSQL alone).
    With `template` (a migrated database nobody is connected to) the database is a copy of
    it, which is faster than running every migration again; `migrate` still runs (a no-op
    when the template is current).
    """

    def __init__(
        self,
        base: Settings,
        kind: str = "bench",
        *,
        tag: str | None = None,
        uses_redis: bool = True,
        template: str | None = None,
    ) -> None:
        self.tag = tag or uuid.uuid4().hex[:10]
        self.db_name = f"threadrun_{kind}_{self.tag}"
        self.prefix = f"tr{kind}:{self.tag}:"
        self._base = base
        self._redis = uses_redis
        self._template = template
        self._created = False

    def create(self, *, async_commit: bool = False) -> Settings:
        """Create and migrate the database; the settings of `base` pointed at the sandbox.

        `async_commit` turns synchronous_commit off in it (no disk flush per commit).
        """
        from shared.db.migrate import migrate

        server = self._base.dsn
        url = create_database(server, self.db_name, template=self._template)
        self._created = True
        if async_commit:
            with psycopg.connect(server_dsn(server, MAINTENANCE_DB), autocommit=True) as conn:
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(
                        sql.Identifier(self.db_name)
                    )
                )
        settings = self._base.model_copy(
            update={"database_url": SecretStr(url), "redis_prefix": self.prefix}
        )
        migrate(settings)
        return settings

    def destroy(self) -> int:
        """Drop the database and delete the prefix's keys; return how many keys went."""
        if self._created:
            drop_database(self._base.dsn, self.db_name)
            self._created = False
        if not self._redis:
            return 0
        client = redis.Redis.from_url(self._base.redis_url)
        try:
            return delete_prefix(client, self.prefix)
        finally:
            client.close()

    def __enter__(self) -> Settings:
        return self.create()

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()
