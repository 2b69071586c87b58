"""SQL for assistants and their versions. Only this module speaks SQL about them (STYLE 4).

Every read takes the caller and the graph ids of the config: a user sees their own
assistants and the system assistants of the graphs this deployment serves (`VISIBLE`);
anything else reads exactly like a missing assistant. Ids are per owner (A4): a read names
an assistant by its public id (`a.public_id`: the caller's own, or a system one), a write
after it goes by the row's key (`assistant_id`, its storage id); see model.storage_id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from shared import serde
from shared.assistants.model import (
    Assistant,
    AssistantContent,
    AssistantPatch,
    AssistantVersion,
    OnConflict,
    check_writable,
)
from shared.db import DictPool
from shared.errors import AssistantExists, AssistantNotFound, LimitExceeded
from shared.vocab import JSONObject

VISIBLE = "(a.owner = %(owner)s OR (a.owner IS NULL AND a.graph_id = ANY(%(graphs)s)))"
"""The assistants the caller may read: their own, and the system ones of the served graphs."""

_VERSION_COLUMNS = "assistant_id, version, graph_id, config, context, metadata, name, description"

# One statement writes the assistant and its version 1, or neither: a conflicting id
# inserts nothing (ON CONFLICT DO NOTHING waits for a concurrent insert of the same id
# to commit, so two processes upserting a system assistant at once both succeed).
CREATE_ASSISTANT_SQL = f"""
WITH a AS (
    INSERT INTO assistants (assistant_id, public_id, graph_id, owner, name, description,
                            metadata, config, context, version, created_at, updated_at)
    VALUES (%(assistant_id)s, %(public_id)s, %(graph_id)s, %(owner)s, %(name)s,
            %(description)s, %(metadata)s, %(config)s, %(context)s, 1, now(), now())
    ON CONFLICT DO NOTHING
    RETURNING *
), v AS (
    INSERT INTO assistant_versions ({_VERSION_COLUMNS}, created_at)
    SELECT {_VERSION_COLUMNS}, created_at FROM a
)
SELECT * FROM a
"""
ASSISTANT_QUOTA_SQL = """
SELECT (SELECT coalesce(sum(n), 0) FROM owner_counts
        WHERE kind = 'assistants' AND owner = %(owner)s) AS n,
       EXISTS (SELECT 1 FROM assistants WHERE owner = %(owner)s AND public_id = %(public_id)s)
           AS present
"""
"""How many assistants the owner has (its `owner_counts` shard rows, kept by triggers: see
migration 0017) and whether the id exists already (then the create makes no new assistant:
it answers it or 409)."""
GET_ASSISTANT_SQL = (
    f"SELECT a.* FROM assistants a WHERE a.public_id = %(assistant_id)s AND {VISIBLE}"
)
SYSTEM_ID_SQL = "SELECT 1 FROM assistants WHERE owner IS NULL AND assistant_id = %(public_id)s"
"""Whether an id is a system assistant's (the same for every user: no user may take it)."""
LOCK_ASSISTANT_SQL = GET_ASSISTANT_SQL + " FOR UPDATE"
NEXT_VERSION_SQL = """
SELECT coalesce(max(version), 0) + 1 AS version FROM assistant_versions
WHERE assistant_id = %(assistant_id)s
"""
INSERT_VERSION_SQL = f"""
INSERT INTO assistant_versions ({_VERSION_COLUMNS}, created_at)
VALUES (%(assistant_id)s, %(version)s, %(graph_id)s, %(config)s, %(context)s, %(metadata)s,
        %(name)s, %(description)s, now())
"""
GET_VERSION_SQL = """
SELECT * FROM assistant_versions WHERE assistant_id = %(assistant_id)s AND version = %(version)s
"""
SET_CURRENT_SQL = """
UPDATE assistants SET graph_id = %(graph_id)s, config = %(config)s, context = %(context)s,
       metadata = %(metadata)s, name = %(name)s, description = %(description)s,
       version = %(version)s, updated_at = now()
WHERE assistant_id = %(assistant_id)s
RETURNING *
"""
DELETE_ASSISTANT_SQL = """
DELETE FROM assistants WHERE assistant_id = %(assistant_id)s AND owner = %(owner)s
RETURNING assistant_id
"""
_FILTERS = f"""
WHERE {VISIBLE}
  AND (%(graph_id)s::text IS NULL OR a.graph_id = %(graph_id)s)
  AND (%(name)s::text IS NULL OR a.name ILIKE %(name)s ESCAPE '\\')
  AND a.metadata @> %(metadata)s
"""
SEARCH_ASSISTANTS_SQL = (
    "SELECT a.* FROM assistants a"
    + _FILTERS
    + "ORDER BY {order}, a.assistant_id\nLIMIT %(limit)s OFFSET %(offset)s"
)
COUNT_ASSISTANTS_SQL = "SELECT count(*) AS n FROM assistants a" + _FILTERS
LIST_VERSIONS_SQL = f"""
SELECT v.*, a.public_id FROM assistant_versions v JOIN assistants a USING (assistant_id)
WHERE a.public_id = %(assistant_id)s AND {VISIBLE} AND v.metadata @> %(metadata)s
ORDER BY v.version DESC
LIMIT %(limit)s OFFSET %(offset)s
"""
SORT_COLUMNS = frozenset({"assistant_id", "graph_id", "name", "created_at", "updated_at"})
_SORT_COLUMN = {"assistant_id": "public_id"}
"""A sort by id is by the id the caller sees."""


def _json(value: Any) -> Jsonb:
    return Jsonb(value, dumps=serde.dumps_str)


def _like(text: str | None) -> str | None:
    """A case-insensitive substring pattern with LIKE's wildcards escaped."""
    if text is None:
        return None
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


@dataclass(frozen=True, slots=True)
class AssistantFilter:
    """What search and count match: graph, a name substring, metadata containment."""

    graph_id: str | None = None
    name: str | None = None
    metadata: JSONObject | None = None


class AssistantStore:
    """Assistants and their versions in Postgres."""

    def __init__(self, pool: DictPool, *, max_per_owner: int | None = None) -> None:
        """`max_per_owner`: the assistants one owner may have (`max_assistants_per_user`,
        429 beyond; None: no quota). Counted in the creating statement's connection without
        a lock: concurrent creations of one owner may pass it by as many."""
        self._pool = pool
        self._max_per_owner = max_per_owner

    def create(
        self,
        assistant_id: str,
        owner: str,
        content: AssistantContent,
        *,
        if_exists: OnConflict,
        graphs: Sequence[str],
        storage_id: str | None = None,
    ) -> tuple[Assistant, bool]:
        """Create the assistant `assistant_id` (its public id; stored under `storage_id`,
        default the same) with its version 1; return it and whether it is new.

        Only the caller's own assistants and the system ones can conflict (A4): an id
        another user has is stored under another key, so it creates the caller's own
        assistant, exactly like a fresh id. An id that exists answers the existing
        assistant for `do_nothing`; otherwise AssistantExists (409).
        """
        params = {
            "assistant_id": storage_id or assistant_id,
            "public_id": assistant_id,
            "owner": owner,
            **_content(content),
        }
        with self._pool.connection() as conn:
            self._check_quota(conn, owner, assistant_id)
            row = None
            if conn.execute(SYSTEM_ID_SQL, params).fetchone() is None:
                row = conn.execute(CREATE_ASSISTANT_SQL, params).fetchone()
            if row is not None:
                return Assistant.from_row(row), True
            existing = conn.execute(GET_ASSISTANT_SQL, _who(assistant_id, owner, graphs)).fetchone()
        if existing is None or if_exists is OnConflict.RAISE:
            raise AssistantExists(f"assistant {assistant_id} already exists")
        return Assistant.from_row(existing), False

    def _check_quota(
        self, conn: psycopg.Connection[DictRow], owner: str, assistant_id: str
    ) -> None:
        limit = self._max_per_owner
        if limit is None:
            return
        row = conn.execute(
            ASSISTANT_QUOTA_SQL, {"owner": owner, "public_id": assistant_id}
        ).fetchone()
        if row is not None and int(row["n"]) >= limit and not row["present"]:
            raise LimitExceeded(
                "max_assistants_per_user", f"at most {limit} assistants per user: delete some first"
            )

    def ensure_system(self, contents: Mapping[str, AssistantContent]) -> list[str]:
        """Insert the system assistants (id -> content) that do not exist; return their ids.

        Idempotent and race-safe: every web process runs it at start, and an id that
        exists (from an earlier start, or another host) is left exactly as it is.
        """
        created = []
        with self._pool.connection() as conn:
            for assistant_id, content in contents.items():
                params = {
                    "assistant_id": assistant_id,
                    "public_id": assistant_id,
                    "owner": None,
                    **_content(content),
                }
                if conn.execute(CREATE_ASSISTANT_SQL, params).fetchone() is not None:
                    created.append(assistant_id)
        return created

    def get(self, assistant_id: str, owner: str, graphs: Sequence[str]) -> Assistant:
        """The assistant, or AssistantNotFound (also for another user's)."""
        with self._pool.connection() as conn:
            row = conn.execute(GET_ASSISTANT_SQL, _who(assistant_id, owner, graphs)).fetchone()
        if row is None:
            raise AssistantNotFound(f"assistant {assistant_id} not found")
        return Assistant.from_row(row)

    def patch(
        self, assistant_id: str, owner: str, graphs: Sequence[str], patch: AssistantPatch
    ) -> Assistant:
        """Write the patch as a new version and make it the current one.

        The assistant's row lock is taken first, so the next version number is read after
        any concurrent patch committed: concurrent patches get distinct versions.
        """
        with self._pool.connection() as conn, conn.transaction():
            current = _lock_writable(conn, assistant_id, owner, graphs)
            content = patch.applied_to(current)
            version = _next_version(conn, current.storage_id)
            fields = {"assistant_id": current.storage_id, "version": version, **_content(content)}
            conn.execute(INSERT_VERSION_SQL, fields)
            row = conn.execute(SET_CURRENT_SQL, fields).fetchone()
        assert row is not None  # locked above
        return Assistant.from_row(row)

    def set_latest(
        self, assistant_id: str, owner: str, graphs: Sequence[str], version: int
    ) -> Assistant:
        """Make an existing version the current one (its content becomes the assistant's)."""
        with self._pool.connection() as conn, conn.transaction():
            key = _lock_writable(conn, assistant_id, owner, graphs).storage_id
            found = conn.execute(
                GET_VERSION_SQL, {"assistant_id": key, "version": version}
            ).fetchone()
            if found is None:
                raise AssistantNotFound(f"version {version} of assistant {assistant_id} not found")
            target = AssistantVersion.from_row(found)
            row = conn.execute(
                SET_CURRENT_SQL,
                {"assistant_id": key, "version": version, **_content(_of(target))},
            ).fetchone()
        assert row is not None  # locked above
        return Assistant.from_row(row)

    def delete(self, assistant_id: str, owner: str, graphs: Sequence[str]) -> None:
        """Delete the caller's assistant and every version of it."""
        with self._pool.connection() as conn, conn.transaction():
            key = _lock_writable(conn, assistant_id, owner, graphs).storage_id
            conn.execute(DELETE_ASSISTANT_SQL, {"assistant_id": key, "owner": owner})

    def search(
        self,
        owner: str,
        graphs: Sequence[str],
        where: AssistantFilter,
        *,
        limit: int,
        offset: int,
        sort_by: str = "created_at",
        sort_order: str = "desc",
    ) -> list[Assistant]:
        """Visible assistants matching `where`, in the asked order (ties by id)."""
        if sort_by not in SORT_COLUMNS or sort_order not in ("asc", "desc"):
            raise ValueError(f"cannot sort assistants by {sort_by} {sort_order}")
        column = _SORT_COLUMN.get(sort_by, sort_by)
        sql = SEARCH_ASSISTANTS_SQL.format(order=f"a.{column} {sort_order.upper()}")
        params = {**_filter(owner, graphs, where), "limit": limit, "offset": offset}
        with self._pool.connection() as conn:
            return [Assistant.from_row(r) for r in conn.execute(sql, params)]

    def count(self, owner: str, graphs: Sequence[str], where: AssistantFilter) -> int:
        """How many visible assistants match `where`."""
        with self._pool.connection() as conn:
            row = conn.execute(COUNT_ASSISTANTS_SQL, _filter(owner, graphs, where)).fetchone()
        return int(row["n"]) if row else 0

    def versions(
        self,
        assistant_id: str,
        owner: str,
        graphs: Sequence[str],
        *,
        metadata: JSONObject,
        limit: int,
        offset: int,
    ) -> list[AssistantVersion]:
        """The assistant's versions, newest first; AssistantNotFound if it is not visible."""
        params = {
            **_who(assistant_id, owner, graphs),
            "metadata": _json(metadata),
            "limit": limit,
            "offset": offset,
        }
        with self._pool.connection() as conn:
            rows = conn.execute(LIST_VERSIONS_SQL, params).fetchall()
            # An empty page of a visible assistant is an empty list, not a 404.
            who = _who(assistant_id, owner, graphs)
            if not rows and conn.execute(GET_ASSISTANT_SQL, who).fetchone() is None:
                raise AssistantNotFound(f"assistant {assistant_id} not found")
        return [AssistantVersion.from_row(r) for r in rows]


def _who(assistant_id: str, owner: str | None, graphs: Sequence[str]) -> dict[str, Any]:
    return {"assistant_id": assistant_id, "owner": owner, "graphs": list(graphs)}


def _filter(owner: str, graphs: Sequence[str], where: AssistantFilter) -> dict[str, Any]:
    return {
        "owner": owner,
        "graphs": list(graphs),
        "graph_id": where.graph_id,
        "name": _like(where.name),
        "metadata": _json(where.metadata or {}),
    }


def _content(content: AssistantContent) -> dict[str, Any]:
    return {
        "graph_id": content.graph_id,
        "name": content.name,
        "description": content.description,
        "metadata": _json(content.metadata),
        "config": _json(content.config),
        "context": _json(content.context),
    }


def _of(version: AssistantVersion) -> AssistantContent:
    return AssistantContent(
        graph_id=version.graph_id,
        name=version.name,
        description=version.description,
        metadata=version.metadata,
        config=version.config,
        context=version.context,
    )


def _lock_writable(
    conn: psycopg.Connection[DictRow], assistant_id: str, owner: str, graphs: Sequence[str]
) -> Assistant:
    """The visible assistant, row-locked, if `owner` may change it (else 404 or 403)."""
    row = conn.execute(LOCK_ASSISTANT_SQL, _who(assistant_id, owner, graphs)).fetchone()
    if row is None:
        raise AssistantNotFound(f"assistant {assistant_id} not found")
    assistant = Assistant.from_row(row)
    check_writable(assistant, owner)
    return assistant


def _next_version(conn: psycopg.Connection[DictRow], assistant_id: str) -> int:
    row = conn.execute(NEXT_VERSION_SQL, {"assistant_id": assistant_id}).fetchone()
    assert row is not None  # an aggregate always answers one row
    return int(row["version"])
