"""A1: thread objects read `values` and `interrupts` from a stored copy of the head
(`thread_heads`, shared/state/head_copies.py) instead of computing every head from its
checkpoint. Every path that moves a thread's head is driven here through the official
langgraph-sdk against real processes, and after each one

- the copy in the database names the head checkpoint `get_state` reports (the path wrote
  it itself: it is checked before any thread read could fill it in lazily), and
- the thread object of get, search and update has exactly `get_state`'s values and the
  interrupts of its tasks.

A copy from before the migration (none), or one a path did not refresh (a stale
checkpoint id), is never shown: reads fall back to the checkpoint and refresh it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient
from langgraph_sdk.schema import Command

from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ALICE, human

pytestmark = pytest.mark.e2e

KNOBS = {"configurable": {"tokens": 4}}


@pytest.fixture(scope="module")
def graphs(graphs_cluster: Cluster) -> Cluster:
    """The session's web process and runs worker serving the test graphs (conftest)."""
    return graphs_cluster


@pytest.fixture
def alice(graphs: Cluster) -> Iterator[SyncLangGraphClient]:
    client = get_sync_client(url=graphs.url, api_key=ALICE)
    yield client
    client.http.client.close()


def stored_copy(c: Cluster, tid: str) -> str | None:
    """The head checkpoint id the thread's stored copy was made from (None: no copy)."""
    with psycopg.connect(c.settings.dsn) as conn:
        row = conn.execute(
            "SELECT checkpoint_id FROM thread_heads WHERE thread_id = %s", (tid,)
        ).fetchone()
    return None if row is None else str(row[0])


def check(c: Cluster, alice: SyncLangGraphClient, tid: str, *, copied: bool = True) -> Any:
    """The copy (when `copied`) is of `get_state`'s head, and every thread object of the
    thread shows that head's values and interrupts; returns the state."""
    state: Any = alice.threads.get_state(tid)
    head = state["checkpoint"]["checkpoint_id"]
    if copied:
        assert head is not None and stored_copy(c, tid) == head
    values = state["values"] if head is not None else None
    interrupts = {t["id"]: t["interrupts"] for t in state["tasks"] if t["interrupts"]}
    (found,) = alice.threads.search(ids=[tid])
    for obj in (alice.threads.get(tid), found, alice.threads.update(tid, metadata={})):
        assert obj["values"] == values
        assert obj["interrupts"] == interrupts
    return state


def turn(alice: SyncLangGraphClient, tid: str, text: str) -> None:
    alice.runs.wait(tid, "lead_agent", input=human(text), config=KNOBS)


def test_issue14_every_head_move_keeps_the_thread_objects_equal_to_get_state(
    graphs: Cluster, alice: SyncLangGraphClient
) -> None:
    """A1: runs (success, interrupt, resume, cancel, rollback), state updates (plain
    and forked from an earlier checkpoint), compaction, copy and prune keep_latest each
    leave a copy of the new head, and thread objects equal `get_state` after each."""
    tid = alice.threads.create()["thread_id"]
    check(graphs, alice, tid, copied=False)  # no checkpoint: values null, no copy
    assert stored_copy(graphs, tid) is None

    turn(alice, tid, "first")  # a run's finalize
    first = check(graphs, alice, tid)
    turn(alice, tid, "second")
    check(graphs, alice, tid)

    alice.threads.update_state(tid, {"title": "edited"})  # POST /threads/{id}/state
    assert check(graphs, alice, tid)["values"]["title"] == "edited"
    fork = first["checkpoint"]["checkpoint_id"]  # a state update on an earlier checkpoint
    alice.threads.update_state(tid, {"title": "forked"}, checkpoint_id=fork)
    state = check(graphs, alice, tid)
    assert state["values"]["title"] == "forked" and len(state["values"]["messages"]) == 2

    for i in range(3):  # enough messages to compact (keep 6)
        turn(alice, tid, f"more {i}")
    with httpx.Client(base_url=graphs.url, headers={"x-api-key": ALICE}, timeout=60) as http:
        r = http.post(f"/threads/{tid}/compact")
    assert r.status_code == 200 and r.json()["outcome"] == "compacted", r.text
    assert check(graphs, alice, tid)["values"]["summary_text"]

    copy: Any = alice.threads.copy(tid)  # the copy's copy is written with it
    assert copy["values"] == check(graphs, alice, copy["thread_id"])["values"]

    alice.threads.prune([tid], strategy="keep_latest")
    check(graphs, alice, tid)

    # A run cancelled midway keeps what it wrote; one rolled back restores the head.
    slow = {"configurable": {"tokens": 400, "token_delay_ms": 10}}
    for action in ("interrupt", "rollback"):
        before = alice.threads.get_state(tid)
        run = alice.runs.create(tid, "lead_agent", input=human(f"slow {action}"), config=slow)
        moved = before["checkpoint"]["checkpoint_id"]
        wait_for(
            lambda m=moved: alice.threads.get_state(tid)["checkpoint"]["checkpoint_id"] != m,
            timeout=30,
        )
        alice.runs.cancel(tid, run["run_id"], wait=True, action=action)  # type: ignore[arg-type]
        after = check(graphs, alice, tid)
        if action == "rollback":
            assert after["values"]["messages"] == before["values"]["messages"]

    paused = alice.threads.create()["thread_id"]
    alice.runs.wait(paused, "approval", input=human("go"))  # interrupt()
    assert check(graphs, alice, paused)["tasks"][0]["interrupts"]
    assert alice.threads.get(paused)["interrupts"]
    alice.runs.wait(paused, "approval", command=Command(resume="yes"))  # the answer
    check(graphs, alice, paused)
    assert alice.threads.get(paused)["interrupts"] == {}


def test_issue14_a_missing_or_stale_copy_is_never_shown(
    graphs: Cluster, alice: SyncLangGraphClient
) -> None:
    """A1: a thread with no copy (written before the migration) or a copy of an older
    head (a path that did not refresh it) shows the checkpoint's head, and the read stores
    a current copy for the next one."""
    tid = alice.threads.create()["thread_id"]
    turn(alice, tid, "one")
    old = alice.threads.get_state(tid)["checkpoint"]["checkpoint_id"]
    turn(alice, tid, "two")
    with psycopg.connect(graphs.settings.dsn) as conn:
        conn.execute("DELETE FROM thread_heads WHERE thread_id = %s", (tid,))
    check(graphs, alice, tid, copied=False)
    head = alice.threads.get_state(tid)["checkpoint"]["checkpoint_id"]
    assert stored_copy(graphs, tid) == head  # filled in by the read
    with psycopg.connect(graphs.settings.dsn) as conn:
        conn.execute(
            "UPDATE thread_heads SET checkpoint_id = %s, values_json = '{\"stale\": true}'"
            " WHERE thread_id = %s",
            (old, tid),
        )
    check(graphs, alice, tid, copied=False)
    assert stored_copy(graphs, tid) == head
