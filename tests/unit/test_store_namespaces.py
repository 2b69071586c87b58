"""The store's user prefix: round trips, no collisions, and a scoped store that behaves, for
each user, exactly like a store of their own (examples, then properties)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore

from shared.errors import LimitExceeded
from shared.store import UserScopedStore, check_namespace, scope, unscope, user_label
from shared.store.namespaces import (
    USER_LABEL_PREFIX,
    ForeignNamespace,
    check_key,
    label_user,
    scope_op,
)
from shared.store.postgres import UserStores

# --- strategies -------------------------------------------------------------------------

users = st.text(max_size=12) | st.sampled_from(["alice", "bob", "a.b", "a%2Eb", "threadrun:user:x"])
labels = st.text(min_size=1, max_size=6).filter(lambda s: "." not in s and "\x00" not in s)
namespaces = st.lists(labels, max_size=4).map(tuple)
small_labels = st.sampled_from(["a", "b", "*", "threadrun:user:alice", "langgraph"])
small_namespaces = st.lists(small_labels, min_size=1, max_size=3).map(tuple)


def texts(user: str, namespace: tuple[str, ...]) -> str:
    """How PostgresStore keeps a namespace: its labels joined with `.`."""
    return ".".join(scope(user, namespace))


# --- the label --------------------------------------------------------------------------


def test_label_examples() -> None:
    assert user_label("alice") == "threadrun:user:alice"
    assert user_label("bob.smith@example.com") == "threadrun:user:bob%2Esmith%40example%2Ecom"
    assert scope("alice", ("memories", "x")) == ("threadrun:user:alice", "memories", "x")
    assert unscope("alice", ("threadrun:user:alice", "memories")) == ("memories",)
    with pytest.raises(ForeignNamespace):
        unscope("alice", ("threadrun:user:bob", "memories"))
    with pytest.raises(ForeignNamespace):
        unscope("alice", ())


@given(users)
def test_label_is_one_ascii_label_that_names_its_user(user: str) -> None:
    label = user_label(user)
    assert label.startswith(USER_LABEL_PREFIX) and label.isascii()
    assert "." not in label and "\x00" not in label
    assert label_user(label) == user


@given(users, users)
def test_two_users_never_share_a_label(a: str, b: str) -> None:
    assert (user_label(a) == user_label(b)) == (a == b)


@given(users, namespaces)
def test_strip_of_add_is_identity(user: str, namespace: tuple[str, ...]) -> None:
    assert unscope(user, scope(user, namespace)) == namespace
    # and the stored text splits back into exactly those labels (no label holds a `.`)
    assert tuple(texts(user, namespace).split(".")) == scope(user, namespace)


@given(users, users, namespaces, namespaces)
def test_no_namespace_of_one_user_reaches_another(
    a: str, b: str, ns_a: tuple[str, ...], ns_b: tuple[str, ...]
) -> None:
    """PostgresStore scopes a search to `p = path OR p LIKE path || '.%'`: neither arm can
    join two users' stored texts, whatever namespaces they pick."""
    if a == b:
        return
    ta, tb = texts(a, ns_a), texts(b, ns_b)
    assert ta != tb
    assert not ta.startswith(tb + ".") and not tb.startswith(ta + ".")
    with pytest.raises(ForeignNamespace):
        unscope(a, scope(b, ns_b))


# --- what the API accepts -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "kwargs"),
    [
        (("a.b",), {}),
        (("",), {}),
        (("a", ""), {}),
        (("a\x00",), {}),
        ((), {"required": True}),
        ((), {"writing": True}),
        (("langgraph", "x"), {"writing": True}),
        (("x" * 1025,), {}),
    ],
)
def test_refused_namespaces(namespace: tuple[str, ...], kwargs: dict[str, bool]) -> None:
    with pytest.raises(InvalidNamespaceError):
        check_namespace(namespace, **kwargs)


def test_accepted_namespaces_and_keys() -> None:
    check_namespace(())  # a search over everything of the caller
    check_namespace(("langgraph", "x"), required=True)  # reading under it is harmless
    check_namespace(("memories", "*", "é"), writing=True)
    check_key("k")
    for bad in ("", "k" * 1025):
        with pytest.raises(ValueError, match="key"):
            check_key(bad)


def test_listing_anchors_on_the_label_deep_enough_for_the_suffix() -> None:
    op = ListNamespacesOp(
        (MatchCondition("prefix", ("a",)), MatchCondition("suffix", ("x", "y"))), max_depth=2
    )
    out = scope_op("u", op)
    assert isinstance(out, ListNamespacesOp)
    label = user_label("u")
    assert out.match_conditions == (
        MatchCondition("prefix", (label, "a")),
        MatchCondition("suffix", ("x", "y")),
        MatchCondition("prefix", (label, "*", "*")),
    )
    assert out.max_depth == 3


def test_put_op_without_namespace_is_refused() -> None:
    with pytest.raises(InvalidNamespaceError):
        scope_op("u", PutOp((), "k", {"v": 1}))
    with pytest.raises(InvalidNamespaceError):
        scope_op("u", GetOp(("a.b",), "k"))


# --- the scoped store against a store of one's own -----------------------------------------


def shape(result: Any) -> Any:
    """Results without timestamps (they differ between two stores)."""
    if result is None:
        return None
    if isinstance(result, list):
        return [shape(r) for r in result]
    if isinstance(result, tuple):
        return result
    return (result.namespace, result.key, result.value)


USERS = ["alice", "bob", "a.b"]
values = st.fixed_dictionaries({"n": st.integers(0, 3)})
ops = st.one_of(
    st.builds(
        PutOp,
        small_namespaces,
        st.sampled_from(["k1", "k2"]),
        values | st.none(),
        index=st.none(),
        ttl=st.none(),
    ),
    st.builds(GetOp, small_namespaces, st.sampled_from(["k1", "k2"])),
    st.builds(
        SearchOp,
        st.lists(small_labels, max_size=2).map(tuple),
        st.none() | st.just({"n": 1}) | st.just({"n": {"$gt": 1}}),
        st.integers(1, 5),
        st.integers(0, 2),
        query=st.none(),
    ),
    st.builds(
        ListNamespacesOp,
        st.lists(
            st.builds(MatchCondition, st.sampled_from(["prefix", "suffix"]), small_namespaces),
            max_size=2,
        ).map(tuple),
        st.none() | st.integers(1, 3),
        st.integers(1, 10),
        st.integers(0, 2),
    ),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(USERS), ops), max_size=25))
def test_each_user_sees_exactly_a_store_of_their_own(steps: list[tuple[str, Any]]) -> None:
    """Two or three users interleave ops on one shared store; each user's answers equal
    those of a private store given only that user's ops (isolation and transparency)."""
    shared = InMemoryStore()
    own = {u: InMemoryStore() for u in USERS}
    views = {u: UserScopedStore(shared, u) for u in USERS}
    for user, op in steps:
        got = views[user].batch([op])
        want = own[user].batch([op])
        assert shape(got) == shape(want), (user, op)


def test_async_and_sync_paths_agree() -> None:
    inner = InMemoryStore()
    store = UserStores(lambda: inner, semantic=False).for_user("alice")

    async def go() -> None:
        await store.aput(("m",), "k", {"v": 1})
        item = await store.aget(("m",), "k")
        assert item is not None and item.namespace == ("m",) and item.value == {"v": 1}
        assert await store.alist_namespaces() == [("m",)]

    asyncio.run(go())
    assert [i.key for i in store.search(("m",))] == ["k"]
    assert inner.get((user_label("alice"), "m"), "k") is not None
    assert UserScopedStore(inner, "bob").get(("m",), "k") is None


def test_reserved_root_is_refused_like_langgraph_does() -> None:
    store = UserScopedStore(InMemoryStore(), "alice")
    with pytest.raises(InvalidNamespaceError):
        store.put(("langgraph", "x"), "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError):
        store.put((), "k", {"v": 1})


def test_a3_a_put_over_the_item_size_is_refused_whole_sync_and_async() -> None:
    """A3: a batch with one value over `max_item_bytes` (a graph's abatch as the API's
    put) is a 413 naming `max_store_item_bytes`, and none of its ops is written."""
    inner = InMemoryStore()
    view = UserScopedStore(inner, "alice", max_item_bytes=100)
    view.put(("notes",), "small", {"t": "x" * 10})
    ops = [PutOp(("notes",), "a", {"t": "ok"}), PutOp(("notes",), "b", {"t": "x" * 200})]
    with pytest.raises(LimitExceeded) as err:
        view.batch(ops)
    assert (err.value.limit, err.value.status, err.value.field) == (
        "max_store_item_bytes",
        413,
        "value",
    )
    with pytest.raises(LimitExceeded):
        asyncio.run(view.abatch(ops))
    assert view.get(("notes",), "a") is None and view.get(("notes",), "small") is not None
    view.batch([PutOp(("notes",), "b", None)])  # a delete carries no value: never refused
