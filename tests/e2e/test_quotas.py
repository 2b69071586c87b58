"""A3: per-user quotas on what a user keeps, through the official SDK against real processes.

Threads (`max_threads_per_user`), assistants (`max_assistants_per_user`) and store items
(`max_store_item_bytes`, `max_store_items_per_user`): each refusal is a 429 or 413 naming the limit, every way a thread
is created counts (threads.create, a run that creates its thread, a copy), a create that
makes nothing new (an existing id) is not refused, another user is not affected, and
deleting frees the room.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_sync_client

from shared.tools.testing import Cluster
from tests.e2e.conftest import ALICE, BOB, ClusterFactory, human

pytestmark = pytest.mark.e2e

QUOTAS = {
    "THREADRUN_MAX_THREADS_PER_USER": "3",
    "THREADRUN_MAX_ASSISTANTS_PER_USER": "2",
    "THREADRUN_MAX_STORE_ITEM_BYTES": "1024",
    "THREADRUN_MAX_STORE_ITEMS_PER_USER": "3",
}


@pytest.fixture(scope="module")
def quota_cluster(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    with private_cluster("quotas", QUOTAS) as c:
        c.start_web()
        yield c


def refusal(call: Any) -> tuple[int, str | None]:
    """The status and `limit` an SDK call was refused with ((200, None) if it was not)."""
    try:
        call()
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code, exc.response.json().get("limit")
    return 200, None


def test_a3_thread_quota_counts_every_way_a_thread_is_made(quota_cluster: Cluster) -> None:
    """A3: 3 threads, then threads.create, a stateless run, a run that would create its
    thread and a copy are each 429 `max_threads_per_user`; re-creating an existing id is
    not; bob still creates; a deleted thread frees its place."""
    alice = get_sync_client(url=quota_cluster.url, api_key=ALICE)
    bob = get_sync_client(url=quota_cluster.url, api_key=BOB)
    made = [alice.threads.create()["thread_id"] for _ in range(3)]
    full = (429, "max_threads_per_user")
    assert refusal(lambda: alice.threads.create()) == full
    assert refusal(lambda: alice.runs.create(None, "lead_agent", input=human("x"))) == full
    new_id = "0b6ad0a4-6f0f-4c59-9a44-2f8a0d6c1a11"
    assert (
        refusal(
            lambda: alice.runs.create(
                new_id, "lead_agent", input=human("x"), if_not_exists="create"
            )
        )
        == full
    )
    assert refusal(lambda: alice.threads.copy(made[0])) == full
    again = alice.threads.create(thread_id=made[0], if_exists="do_nothing")
    assert again["thread_id"] == made[0]  # nothing new: not refused
    assert alice.threads.search(limit=10) and len(alice.threads.search(limit=10)) == 3
    assert bob.threads.create()["thread_id"]
    alice.threads.delete(made[1])
    assert alice.threads.create()["thread_id"]


def test_a3_assistant_quota(quota_cluster: Cluster) -> None:
    """A3: 2 assistants, the third is 429 `max_assistants_per_user`; an existing id with
    if_exists=do_nothing answers it; a deleted one frees its place."""
    alice = get_sync_client(url=quota_cluster.url, api_key=ALICE)
    first = alice.assistants.create("lead_agent", name="one")
    alice.assistants.create("lead_agent", name="two")
    assert refusal(lambda: alice.assistants.create("lead_agent")) == (
        429,
        "max_assistants_per_user",
    )
    same = alice.assistants.create(
        "lead_agent", assistant_id=first["assistant_id"], if_exists="do_nothing"
    )
    assert same["assistant_id"] == first["assistant_id"]
    alice.assistants.delete(first["assistant_id"])
    assert alice.assistants.create("lead_agent", name="three")["assistant_id"]


def test_a3_store_item_size(quota_cluster: Cluster) -> None:
    """A3: a store item larger than `max_store_item_bytes` is a 413 naming the limit and
    `value`, and nothing is written; one under it is stored."""
    url, headers = quota_cluster.url, {"x-api-key": ALICE}
    big = {"namespace": ["notes"], "key": "big", "value": {"text": "x" * 2000}}
    res = httpx.put(f"{url}/store/items", json=big, headers=headers)
    assert res.status_code == 413, res.text
    assert (res.json()["limit"], res.json()["field"]) == ("max_store_item_bytes", "value")
    got = httpx.get(
        f"{url}/store/items", params={"namespace": "notes", "key": "big"}, headers=headers
    )
    assert got.status_code == 200 and got.json() is None  # the official server's "no item"
    small = {"namespace": ["notes"], "key": "small", "value": {"text": "x" * 500}}
    assert httpx.put(f"{url}/store/items", json=small, headers=headers).status_code == 204


def test_a3_store_item_quota(quota_cluster: Cluster) -> None:
    """A3: bob's fourth new store item is a 429 naming `max_store_items_per_user`; a
    replacement is not; a deleted item frees its place."""
    bob = get_sync_client(url=quota_cluster.url, api_key=BOB)
    for key in ("a", "b", "c"):
        bob.store.put_item(["prefs"], key, {"v": key})
    assert refusal(lambda: bob.store.put_item(["prefs"], "d", {"v": "d"})) == (
        429,
        "max_store_items_per_user",
    )
    bob.store.put_item(["prefs"], "a", {"v": "again"})
    bob.store.delete_item(["prefs"], "b")
    bob.store.put_item(["prefs"], "d", {"v": "d"})
    assert bob.store.get_item(["prefs"], "d")["value"] == {"v": "d"}
