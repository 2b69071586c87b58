"""A3: the per-user quotas count from `owner_counts` (migration 0017; the store's triggers
from `shared.store.quota.install_counts`), whose triggers keep each owner's count of
threads, assistants and store items equal to its rows, whatever wrote them.

Counting an owner's rows at each create read up to the quota's index entries (10,000
threads by default) for every new thread and stateless run; the quota statements now read
at most 16 count rows and none of the counted rows, whatever the owner has.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from langgraph.store.base import PutOp
from langgraph.store.postgres import PostgresStore
from psycopg.rows import dict_row

from shared.assistants.store import ASSISTANT_QUOTA_SQL
from shared.db import migrate
from shared.runs.store_base import THREAD_QUOTA_SQL
from shared.settings import Settings
from shared.store import quota as store_quota
from shared.store.namespaces import user_label
from tests.integration.test_s3_checkpoint_reads import rows_touched

SHARDS = 16


@pytest.fixture
def conn(settings: Settings) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(settings.dsn, autocommit=True, row_factory=dict_row) as c:
        yield c


def counted(conn: psycopg.Connection[Any], kind: str, owners: list[str]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT owner, sum(n)::int AS n FROM owner_counts WHERE kind = %s AND owner = ANY(%s)"
        " GROUP BY owner",
        (kind, owners),
    ).fetchall()
    return {r["owner"]: r["n"] for r in rows if r["n"]}


def threads_of(conn: psycopg.Connection[Any], owners: list[str]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT owner, count(*)::int AS n FROM threads WHERE owner = ANY(%s) GROUP BY owner",
        (owners,),
    ).fetchall()
    return {r["owner"]: r["n"] for r in rows}


def insert_threads(conn: psycopg.Connection[Any], owner: str, n: int) -> None:
    conn.execute(
        "INSERT INTO threads (thread_id, owner) SELECT gen_random_uuid(), %s"
        " FROM generate_series(1, %s)",
        (owner, n),
    )


# One write: (what, owner index, how many); a transaction: several writes, then commit or not.
WRITE = st.tuples(
    st.sampled_from(["insert", "delete", "delete_all_owners"]),
    st.integers(0, 2),
    st.integers(1, 4),
)
TRANSACTION = st.tuples(st.lists(WRITE, min_size=1, max_size=4), st.booleans())


@hsettings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(transactions=st.lists(TRANSACTION, min_size=1, max_size=6))
def test_a3_owner_counts_equal_the_rows_after_any_writes(
    conn: psycopg.Connection[Any], transactions: list[tuple[list[tuple[str, int, int]], bool]]
) -> None:
    """A3: after any mix of multi-row inserts and deletes (one owner's, or several owners' in
    one statement), in transactions committed or rolled back, each owner's counted threads
    equal its rows."""
    owners = [f"oc-{uuid.uuid4().hex[:12]}" for _ in range(3)]
    try:
        for writes, commit in transactions:
            with conn.transaction(force_rollback=not commit):
                for what, i, n in writes:
                    if what == "insert":
                        insert_threads(conn, owners[i], n)
                    elif what == "delete":
                        conn.execute(
                            "DELETE FROM threads WHERE thread_id IN (SELECT thread_id FROM"
                            " threads WHERE owner = %s LIMIT %s)",
                            (owners[i], n),
                        )
                    else:
                        conn.execute(
                            "DELETE FROM threads WHERE thread_id IN (SELECT thread_id FROM"
                            " threads WHERE owner = ANY(%s) ORDER BY thread_id LIMIT %s)",
                            (owners, n),
                        )
        assert counted(conn, "threads", owners) == threads_of(conn, owners)
    finally:
        conn.execute("DELETE FROM threads WHERE owner = ANY(%s)", (owners,))
    assert counted(conn, "threads", owners) == {}


def test_a3_concurrent_creators_of_one_owner_count_exactly(settings: Settings) -> None:
    """A3: eight connections creating and deleting one owner's threads at once (one API key
    at high concurrency) neither deadlock nor lose a count."""
    owner = f"oc-{uuid.uuid4().hex[:12]}"
    errors: list[BaseException] = []

    def creator(k: int) -> None:
        try:
            with psycopg.connect(settings.dsn, autocommit=True) as c:
                for j in range(40):
                    with c.transaction():
                        insert_threads(c, owner, 1 + (j % 3))  # type: ignore[arg-type]
                        if j % 4 == k % 4:
                            c.execute(
                                "DELETE FROM threads WHERE thread_id IN (SELECT thread_id"
                                " FROM threads WHERE owner = %s LIMIT 2)",
                                (owner,),
                            )
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    workers = [threading.Thread(target=creator, args=(k,)) for k in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    with psycopg.connect(settings.dsn, autocommit=True, row_factory=dict_row) as conn:
        try:
            assert errors == []
            have = threads_of(conn, [owner])
            assert have[owner] > 0
            assert counted(conn, "threads", [owner]) == have
            shards = conn.execute(
                "SELECT count(*) AS n FROM owner_counts WHERE kind = 'threads' AND owner = %s",
                (owner,),
            ).fetchone()
            assert shards is not None and 1 < shards["n"] <= SHARDS
        finally:
            conn.execute("DELETE FROM threads WHERE owner = %s", (owner,))


def test_a3_quota_statements_read_no_rows_to_count(conn: psycopg.Connection[Any]) -> None:
    """A3: with 3,000 threads and 300 assistants of one owner, the thread and assistant quota
    statements read no thread and no assistant to count them (counting read all 3,000 and
    300), at most 16 count rows, and give the exact counts."""
    owner = f"oc-{uuid.uuid4().hex[:12]}"
    insert_threads(conn, owner, 3_000)
    conn.execute(
        "INSERT INTO assistants (assistant_id, public_id, owner, graph_id, name)"
        " SELECT a, a, %s, 'lead_agent', 'q' FROM (SELECT gen_random_uuid() a"
        " FROM generate_series(1, 300)) q",
        (owner,),
    )
    try:
        conn.execute("ANALYZE threads")
        conn.execute("ANALYZE assistants")
        missing = str(uuid.uuid4())
        for sql, params, table in (
            (
                THREAD_QUOTA_SQL,
                {"owner": owner, "thread_id": missing, "public_id": missing},
                "threads",
            ),
            (ASSISTANT_QUOTA_SQL, {"owner": owner, "public_id": missing}, "assistants"),
        ):
            assert rows_touched(conn, sql, params, table) <= 1
            assert rows_touched(conn, sql, params, "owner_counts") <= SHARDS
        row = conn.execute(
            THREAD_QUOTA_SQL, {"owner": owner, "thread_id": missing, "public_id": missing}
        ).fetchone()
        assert row is not None and (int(row["n"]), row["present"]) == (3_000, False)
        row = conn.execute(ASSISTANT_QUOTA_SQL, {"owner": owner, "public_id": missing}).fetchone()
        assert row is not None and int(row["n"]) == 300
    finally:
        conn.execute("DELETE FROM assistants WHERE owner = %s", (owner,))
        conn.execute("DELETE FROM threads WHERE owner = %s", (owner,))
    assert counted(conn, "threads", [owner]) == {}
    assert counted(conn, "assistants", [owner]) == {}


def test_a3_migration_counts_what_was_there(settings: Settings) -> None:
    """A3: the migration, applied to a database that already has threads and assistants,
    starts every owner's counts at its rows (system assistants, with no owner, uncounted).
    Replayed in a transaction that is rolled back: the database is left as it was."""
    owners = [f"oc-{uuid.uuid4().hex[:12]}" for _ in range(2)]
    (mig,) = [m for m in migrate.migrations() if m.name == "owner_counts"]
    with (
        psycopg.connect(
            settings.dsn, autocommit=True, row_factory=dict_row, prepare_threshold=None
        ) as conn,
        conn.transaction(force_rollback=True),
    ):
        conn.execute(
            "DROP TABLE owner_counts CASCADE;"
            " DROP FUNCTION owner_counts_apply() CASCADE;"
            " DROP FUNCTION owner_counts_truncate() CASCADE"
        )
        insert_threads(conn, owners[0], 7)
        insert_threads(conn, owners[1], 2)
        conn.execute(mig.sql)
        assert counted(conn, "threads", owners) == {owners[0]: 7, owners[1]: 2}
        everyone = conn.execute(
            "SELECT (SELECT count(*) FROM threads) AS t, (SELECT coalesce(sum(n), 0)"
            " FROM owner_counts WHERE kind = 'threads') AS ct,"
            " (SELECT count(*) FROM assistants WHERE owner IS NOT NULL) AS a,"
            " (SELECT coalesce(sum(n), 0) FROM owner_counts WHERE kind = 'assistants') AS ca"
        ).fetchone()
        assert everyone is not None
        assert (everyone["t"], everyone["a"]) == (everyone["ct"], everyone["ca"])
        insert_threads(conn, owners[1], 3)
        assert counted(conn, "threads", owners) == {owners[0]: 7, owners[1]: 5}
    with psycopg.connect(settings.dsn, autocommit=True, row_factory=dict_row) as conn:
        assert threads_of(conn, owners) == {}


def test_a3_store_counts_follow_puts_replacements_and_deletes(settings: Settings) -> None:
    """A3: a user's counted store items are the items under their label through LangGraph's
    own store: a put of a new key counts, a put that replaces a key (its upsert) does not, a
    delete uncounts, and the quota's statement reads them from the counts alone."""
    user = f"oc-{uuid.uuid4().hex[:12]}"
    label = user_label(user)
    with psycopg.connect(
        settings.dsn, autocommit=True, row_factory=dict_row, prepare_threshold=None
    ) as conn:
        assert store_quota.install_counts(conn) is False  # the migration step installed them
        store = PostgresStore(conn)
        try:
            store.batch(
                [PutOp((label, "notes"), f"k{i}", {"i": i}) for i in range(5)]
                + [PutOp((label, "a", "b"), "deep", {"x": 1})]
            )
            store.put((label, "notes"), "k0", {"i": "again"})
            store.delete((label, "notes"), "k1")
            have = conn.execute(
                "SELECT count(*)::int AS n FROM store WHERE prefix LIKE %s", (label + ".%",)
            ).fetchone()
            assert have is not None and have["n"] == 5
            assert counted(conn, "store", [label]) == {label: 5}
            row = conn.execute(store_quota.COUNT_SQL, {"label": label}).fetchone()
            assert row is not None and int(row["n"]) == 5
            assert rows_touched(conn, store_quota.COUNT_SQL, {"label": label}, "store") == 0
        finally:
            conn.execute("DELETE FROM store WHERE prefix LIKE %s", (label + ".%",))
        assert counted(conn, "store", [label]) == {}
