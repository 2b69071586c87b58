"""The store a graph gets at run time under the project's `store.*` handlers
(shared/authz/store.py), on LangGraph's own in-memory store: the documentation's
per-user namespace rule, a refusing handler, and each kind of op."""

from __future__ import annotations

import asyncio

import pytest
from langgraph.store.memory import InMemoryStore
from langgraph_sdk import Auth

from shared.authz.decide import Authorizer, Denied
from shared.authz.store import AuthorizedStore
from shared.authz.users import AuthUser


def authorizer() -> Authorizer:
    auth = Auth()

    @auth.on.store
    async def per_user(ctx: Auth.types.AuthContext, value: dict) -> None:  # type: ignore[type-arg]
        if ctx.user.identity == "mallory":
            raise Auth.exceptions.HTTPException(status_code=403, detail="not you")
        value["namespace"] = (ctx.user.identity, *(value.get("namespace") or ()))

    return Authorizer(auth)


def stores() -> tuple[InMemoryStore, AuthorizedStore, AuthorizedStore]:
    inner = InMemoryStore()
    authz = authorizer()
    alice = AuthorizedStore(inner, authz, AuthUser({"identity": "alice"}))
    bob = AuthorizedStore(inner, authz, AuthUser({"identity": "bob"}))
    return inner, alice, bob


def test_the_namespace_rule_applies_to_every_op() -> None:
    """put/get/search/list/delete as Alice land under ("alice", ...); Bob sees none of it."""
    inner, alice, bob = stores()

    async def go() -> None:
        await alice.aput(("notes",), "k1", {"text": "secret"})
        # (listed first: InMemoryStore makes an empty namespace on a get of a missing one)
        assert await alice.alist_namespaces(prefix=("notes",)) == [("alice", "notes")]
        assert await bob.alist_namespaces(prefix=("notes",)) == []
        assert inner.get(("alice", "notes"), "k1") is not None
        item = await alice.aget(("notes",), "k1")
        assert item is not None and item.namespace == ("alice", "notes")
        assert await bob.aget(("notes",), "k1") is None
        assert [i.key for i in await alice.asearch(("notes",))] == ["k1"]
        assert await bob.asearch(("notes",)) == []
        await bob.adelete(("notes",), "k1")  # Bob's delete is of his own namespace
        assert inner.get(("alice", "notes"), "k1") is not None
        await alice.adelete(("notes",), "k1")
        assert inner.get(("alice", "notes"), "k1") is None

    asyncio.run(go())


def test_a_refusing_handler_raises_into_the_graph() -> None:
    """A refusal is `Denied` with the handler's status; nothing is written."""
    inner = InMemoryStore()
    mallory = AuthorizedStore(inner, authorizer(), AuthUser({"identity": "mallory"}))
    with pytest.raises(Denied) as info:
        asyncio.run(mallory.aput(("notes",), "k", {"v": 1}))
    assert info.value.status == 403 and info.value.detail == "not you"
    assert inner.search(()) == []


def test_sync_calls_outside_the_loop() -> None:
    """A sync node's store calls (a thread without a running loop) are decided too."""
    inner, alice, _ = stores()
    alice.put(("notes",), "k2", {"v": 2})
    assert inner.get(("alice", "notes"), "k2") is not None
    got = alice.get(("notes",), "k2")
    assert got is not None and got.value == {"v": 2}
