"""The user-scoped store on LangGraph's PostgresStore (real PostgreSQL): the migration creates
its tables, and each user's view answers like a store of their own, whatever labels they pick
(PostgresStore scopes by text: LIKE on the joined labels and regexes for listings)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.store.base import GetOp, ListNamespacesOp, MatchCondition, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore

from shared.db import DictPool, make_pool
from shared.errors import LimitExceeded
from shared.settings import Settings
from shared.store import StoreConfig, WorkerStore, user_label, web_stores
from shared.store.postgres import UserStores

LABELS = ["a", "b", "a_b", "a%", "*", "threadrun:user:alice", "é"]
KEYS = ["k1", "k2"]


@pytest.fixture(scope="module")
def pool(settings: Settings) -> Iterator[DictPool]:
    """A small pool on the session's migrated database."""
    p = make_pool(settings, name="test-user-store", max_size=4)
    yield p
    p.close()


@pytest.fixture(scope="module")
def stores(pool: DictPool, settings: Settings) -> UserStores:
    """The web's views (default config: no index)."""
    return web_stores(pool, StoreConfig.from_file(settings.config))


def test_migrate_created_the_store_tables(pool: DictPool) -> None:
    with pool.connection() as conn:
        tables = {
            r["tablename"]
            for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
    assert {"store", "store_migrations"} <= tables


def test_rows_carry_the_users_label(stores: UserStores, pool: DictPool) -> None:
    user = f"u.{uuid.uuid4().hex[:8]}@x"
    stores.for_user(user).put(("m", "n"), "k", {"v": 1})
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT prefix FROM store WHERE prefix LIKE %s", (f"{user_label(user)}%",)
        ).fetchall()
    assert [r["prefix"] for r in rows] == [f"{user_label(user)}.m.n"]
    assert "." not in user_label(user)


def shape(result: Any) -> Any:
    """Results as sorted plain values: PostgresStore and InMemoryStore order differently."""
    if result is None:
        return None
    if isinstance(result, list):
        return sorted(shape(r) for r in result)
    if isinstance(result, tuple):
        return result
    return (result.namespace, result.key, str(sorted(result.value.items())))


def live(
    store: InMemoryStore, namespace: tuple[str, ...], max_depth: int | None
) -> tuple[str, ...] | None:
    """`namespace` if an item lives in it (or, cut to `max_depth`, below it). InMemoryStore
    keeps listing a namespace whose items were all deleted (or that only saw a delete);
    PostgresStore, like the API, lists only namespaces that hold items themselves, each cut
    to `max_depth`: one whose only items are in a namespace below it is listed as that one."""
    cut = max_depth is not None and len(namespace) == max_depth
    for item in store.search(namespace, limit=10_000):
        if item.namespace == namespace or (cut and item.namespace[:max_depth] == namespace):
            return namespace
    return None


namespaces = st.lists(st.sampled_from(LABELS), min_size=1, max_size=3).map(tuple)
ops = st.one_of(
    st.builds(
        PutOp,
        namespaces,
        st.sampled_from(KEYS),
        st.fixed_dictionaries({"n": st.integers(0, 2)}) | st.none(),
        index=st.none(),
        ttl=st.none(),
    ),
    st.builds(GetOp, namespaces, st.sampled_from(KEYS)),
    st.builds(
        SearchOp,
        st.lists(st.sampled_from(LABELS), max_size=2).map(tuple),
        st.none() | st.just({"n": 1}),
        limit=st.just(1000),
        offset=st.just(0),
        query=st.none(),
    ),
    st.builds(
        ListNamespacesOp,
        st.lists(
            st.builds(MatchCondition, st.sampled_from(["prefix", "suffix"]), namespaces),
            max_size=2,
        ).map(tuple),
        st.none() | st.integers(1, 3),
        limit=st.just(1000),
        offset=st.just(0),
    ),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.tuples(st.sampled_from([0, 1]), ops), max_size=20))
def test_each_user_sees_a_store_of_their_own(stores: UserStores, steps: list[Any]) -> None:
    """Two users (one with a `.` and a `%` in the id) interleave ops on PostgresStore; each
    user's answers equal those of a private in-memory store given only their ops."""
    tag = uuid.uuid4().hex[:8]
    users = [f"alice-{tag}", f"b.o%b-{tag}"]
    views = [stores.for_user(u) for u in users]
    own = [InMemoryStore(), InMemoryStore()]
    for who, op in steps:
        [got], [want] = views[who].batch([op]), own[who].batch([op])
        if isinstance(op, ListNamespacesOp):
            found = cast(list[tuple[str, ...]], want)
            listed = [live(own[who], ns, op.max_depth) for ns in found]
            want = [ns for ns in listed if ns is not None]
        assert shape(got) == shape(want), (users[who], op)


def test_worker_store_is_the_same_store(settings: Settings, stores: UserStores) -> None:
    """What a worker's async store writes for a user, the web's view of that user reads."""
    user = f"w-{uuid.uuid4().hex[:8]}"

    async def write() -> None:
        worker = await WorkerStore.open(settings)
        try:
            await worker.views.for_user(user).aput(("memories",), "k", {"from": "worker"})
            with pytest.raises(asyncio.InvalidStateError):
                worker.views.for_user(user).put(("memories",), "k2", {"v": 1})
        finally:
            await worker.close()

    asyncio.run(write())
    item = stores.for_user(user).get(("memories",), "k")
    assert item is not None and item.value == {"from": "worker"}
    assert stores.for_user(f"other-{user}").get(("memories",), "k") is None


def test_a3_the_item_quota_counts_new_keys_sync_and_async(
    pool: DictPool, settings: Settings
) -> None:
    """A3: with `max_store_items_per_user` 3, a user's fourth new key is a 429 naming the
    limit, from the web's sync store and from a graph's async store alike; replacing an
    item or deleting one is never refused, a deleted item frees its place, and another
    user (even one whose id holds LIKE's `%` and `_`) has a quota of its own."""
    quota_settings = settings.model_copy(update={"max_store_items_per_user": 3})
    web = web_stores(pool, StoreConfig.from_file(settings.config), max_items=3)
    alice = web.for_user(f"alice-{uuid.uuid4().hex[:6]}")
    for k in ("a", "b", "c"):
        alice.put(("notes",), k, {"v": k})
    with pytest.raises(LimitExceeded) as err:
        alice.put(("other",), "d", {"v": "d"})
    assert (err.value.limit, err.value.status) == ("max_store_items_per_user", 429)
    alice.put(("notes",), "a", {"v": "again"})  # a replacement: not a new item
    alice.batch([PutOp(("notes",), "a", {"v": "x"}), PutOp(("notes",), "b", {"v": "y"})])
    odd = web.for_user(f"u%_{uuid.uuid4().hex[:6]}")
    odd.put(("notes",), "a", {"v": 1})  # its own count, not alice's

    async def graph_side() -> None:
        worker = await WorkerStore.open(quota_settings)
        try:
            view = worker.views.for_user(alice.user_id)
            with pytest.raises(LimitExceeded):
                await view.aput(("notes",), "e", {"v": "e"})
            await view.adelete(("notes",), "c")
            await view.aput(("notes",), "e", {"v": "e"})  # the deleted one's place
        finally:
            await worker.close()

    asyncio.run(graph_side())
    assert alice.get(("notes",), "e") is not None and alice.get(("notes",), "c") is None
