"""Thread objects, copy and prune end to end, through the official langgraph-sdk (sync client)
against real processes: `values` and `interrupts` on every thread object that get, search,
create and update return; `threads.copy` (state, history, metadata; the caller's own thread
only); `threads.prune` with both strategies (A1, A4, S5).

The cluster serves `tests/graphs/langgraph.json`: the lead agent and `approval`, a graph that
pauses on `interrupt()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient
from langgraph_sdk.schema import Command

from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ALICE, BOB
from tests.graphs.approval import QUESTION

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def graphs(graphs_cluster: Cluster) -> Cluster:
    """The session's web process and runs worker serving the test graphs (conftest)."""
    return graphs_cluster


@pytest.fixture
def alice(graphs: Cluster) -> Iterator[SyncLangGraphClient]:
    client = get_sync_client(url=graphs.url, api_key=ALICE)
    yield client
    client.http.client.close()


@pytest.fixture
def bob(graphs: Cluster) -> Iterator[SyncLangGraphClient]:
    client = get_sync_client(url=graphs.url, api_key=BOB)
    yield client
    client.http.client.close()


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


KNOBS = {"configurable": {"tokens": 4}}


def turn(c: SyncLangGraphClient, tid: str, text: str) -> None:
    c.runs.wait(tid, "lead_agent", input=human(text), config=KNOBS)


def texts(values: Any) -> list[str]:
    return [m["content"] for m in values["messages"]]


def status_of(err: pytest.ExceptionInfo[httpx.HTTPStatusError]) -> int:
    return err.value.response.status_code


def test_a1_thread_objects_carry_the_head_values(alice: SyncLangGraphClient) -> None:
    """A1: a new thread's `values` is null; after a run, get, search, update and create
    (`do_nothing`) all return the head's values, the messages a chat list titles from."""
    thread = alice.threads.create(metadata={"suite": "values"})
    assert thread["values"] is None and thread["interrupts"] == {}
    tid = thread["thread_id"]
    turn(alice, tid, "first question")
    state = alice.threads.get_state(tid)
    got = alice.threads.get(tid)
    assert got["values"] == state["values"] and got["interrupts"] == {}
    assert texts(got["values"])[0] == "first question" and len(got["values"]["messages"]) == 2
    (found,) = alice.threads.search(ids=[tid])
    assert found["values"] == state["values"]
    page = alice.threads.search(metadata={"suite": "values"}, limit=100)
    assert [t["values"] for t in page if t["thread_id"] == tid] == [state["values"]]
    updated = alice.threads.update(tid, metadata={"title": "x"})
    assert updated["values"] == state["values"] and updated["metadata"]["title"] == "x"
    again = alice.threads.create(thread_id=tid, if_exists="do_nothing")
    assert again["values"] == state["values"]
    slim = alice.threads.search(ids=[tid], select=["thread_id", "status"])
    assert slim == [{"thread_id": tid, "status": "idle"}]


def test_a1_thread_objects_carry_pending_interrupts(alice: SyncLangGraphClient) -> None:
    """A1: a thread paused on `interrupt()` shows it under its task id on every thread
    object (as the official server does); answering it clears them."""
    tid = alice.threads.create()["thread_id"]
    alice.runs.wait(tid, "approval", input=human("go"))
    (task,) = alice.threads.get_state(tid)["tasks"]
    thread = alice.threads.get(tid)
    assert thread["status"] == "interrupted"
    assert list(thread["interrupts"]) == [task["id"]]
    (question,) = thread["interrupts"][task["id"]]
    assert question["value"] == QUESTION and question["id"] == task["interrupts"][0]["id"]
    (found,) = alice.threads.search(ids=[tid])
    assert found["interrupts"] == thread["interrupts"]
    assert alice.threads.update(tid, metadata={"k": 1})["interrupts"] == thread["interrupts"]
    alice.runs.wait(tid, "approval", command=Command(resume="yes"))
    thread = alice.threads.get(tid)
    assert thread["interrupts"] == {} and texts(thread["values"]) == ["go", "approved: yes"]


def test_a1_copy_has_the_same_state_and_history_and_runs_independently(
    alice: SyncLangGraphClient, bob: SyncLangGraphClient
) -> None:
    """A1/A4: the copy is a new thread of the caller with the source's metadata, values and
    history (same length); runs on each leave the other unchanged; another user's copy of
    it, or of a thread that does not exist, is a 404."""
    source = alice.threads.create(metadata={"suite": "copy"})["thread_id"]
    turn(alice, source, "one")
    turn(alice, source, "two")
    copy: Any = alice.threads.copy(source)
    assert copy["thread_id"] != source and copy["metadata"]["suite"] == "copy"
    assert copy["metadata"]["graph_id"] == "lead_agent" and copy["status"] == "idle"
    assert copy["values"] == alice.threads.get(source)["values"]
    cid = copy["thread_id"]
    src_history = alice.threads.get_history(source, limit=100)
    copy_history = alice.threads.get_history(cid, limit=100)
    assert len(copy_history) == len(src_history) > 2
    assert [h["checkpoint"]["checkpoint_id"] for h in copy_history] == [
        h["checkpoint"]["checkpoint_id"] for h in src_history
    ]
    turn(alice, cid, "copy only")
    turn(alice, source, "source only")
    assert texts(alice.threads.get(cid)["values"])[0::2] == ["one", "two", "copy only"]
    assert texts(alice.threads.get(source)["values"])[0::2] == ["one", "two", "source only"]
    with pytest.raises(httpx.HTTPStatusError) as err:
        bob.threads.copy(source)
    assert status_of(err) == 404
    with pytest.raises(httpx.HTTPStatusError) as err:
        alice.threads.copy("00000000-0000-4000-8000-000000000000")
    assert status_of(err) == 404
    assert all(t["metadata"].get("suite") != "copy" for t in bob.threads.search(limit=100))


def test_a1_copy_of_a_paused_or_busy_thread(alice: SyncLangGraphClient) -> None:
    """A1: a paused thread's copy waits on the same question and is answered on its own; a
    busy thread's copy holds a committed state of it and is idle (its runs are not copied)."""
    paused = alice.threads.create()["thread_id"]
    alice.runs.wait(paused, "approval", input=human("go"))
    copy: Any = alice.threads.copy(paused)
    assert copy["status"] == "interrupted" and copy["interrupts"]
    assert list(copy["interrupts"].values()) == list(
        alice.threads.get(paused)["interrupts"].values()
    )
    alice.runs.wait(copy["thread_id"], "approval", command=Command(resume="copy"))
    assert alice.threads.get(paused)["interrupts"]  # the source still waits
    busy = alice.threads.create()["thread_id"]
    turn(alice, busy, "before")
    run = alice.runs.create(
        busy,
        "lead_agent",
        input=human("slow"),
        config={"configurable": {"tokens": 300, "token_delay_ms": 10}},
    )
    wait_for(lambda: alice.threads.get(busy)["status"] == "busy", timeout=30)
    copy = alice.threads.copy(busy)
    assert copy["status"] == "idle"
    ids = {
        h["checkpoint"]["checkpoint_id"]
        for h in alice.threads.get_history(copy["thread_id"], limit=100)
    }
    alice.runs.join(busy, run["run_id"])
    src_ids = {h["checkpoint"]["checkpoint_id"] for h in alice.threads.get_history(busy, limit=100)}
    assert ids and ids <= src_ids
    turn(alice, copy["thread_id"], "after")
    assert texts(alice.threads.get(copy["thread_id"])["values"])[-2] == "after"


def test_a1_prune_keep_latest_and_delete(
    alice: SyncLangGraphClient, bob: SyncLangGraphClient, graphs: Cluster
) -> None:
    """A1/A4: keep_latest leaves one checkpoint with the same values (and the thread runs on);
    delete removes the threads as DELETE does; a list with another user's thread is a 404
    that touches nothing; the answer is `{"pruned_count": n}`."""
    kept = alice.threads.create()["thread_id"]
    for i in range(3):
        turn(alice, kept, f"turn {i}")
    values = alice.threads.get(kept)["values"]
    assert alice.threads.prune([kept], strategy="keep_latest") == {"pruned_count": 1}
    (head,) = alice.threads.get_history(kept, limit=100)
    assert head["values"] == values and alice.threads.get(kept)["values"] == values
    turn(alice, kept, "after")
    assert texts(alice.threads.get(kept)["values"])[-2] == "after"

    gone = [alice.threads.create()["thread_id"] for _ in range(2)]
    turn(alice, gone[0], "bye")
    theirs = bob.threads.create()["thread_id"]
    turn(bob, theirs, "mine")
    for strategy in ("delete", "keep_latest"):
        with pytest.raises(httpx.HTTPStatusError) as err:
            alice.threads.prune([*gone, theirs], strategy=strategy)  # type: ignore[arg-type]
        assert status_of(err) == 404
    assert len(bob.threads.get_history(theirs, limit=100)) > 1
    assert all(alice.threads.get(t) for t in gone)
    assert alice.threads.prune(gone) == {"pruned_count": 2}
    for tid in gone:
        with pytest.raises(httpx.HTTPStatusError) as err:
            alice.threads.get(tid)
        assert status_of(err) == 404
    assert alice.threads.prune([]) == {"pruned_count": 0}
    assert bob.threads.get(theirs)["values"]
    with httpx.Client(base_url=graphs.url, headers={"x-api-key": ALICE}, timeout=10) as raw:
        res = raw.post("/threads/prune", json={"thread_ids": [kept], "strategy": "all"})
        assert res.status_code == 422 and res.json()["field"] == "strategy"
        res = raw.post("/threads/prune", json={"thread_ids": [kept], "strateg": 1, "strategy": 2})
        assert res.status_code == 422 and res.json()["field"] == "strategy"  # strateg: ignored


def test_a1_prune_keep_latest_refuses_a_busy_thread(alice: SyncLangGraphClient) -> None:
    """A1/R5: keep_latest on a thread with a run in progress is a 409 (its run's rollback
    point may be an older checkpoint); once the run ends it prunes."""
    tid = alice.threads.create()["thread_id"]
    turn(alice, tid, "before")
    run = alice.runs.create(
        tid,
        "lead_agent",
        input=human("slow"),
        config={"configurable": {"tokens": 200, "token_delay_ms": 10}},
    )
    wait_for(lambda: alice.threads.get(tid)["status"] == "busy", timeout=30)
    with pytest.raises(httpx.HTTPStatusError) as err:
        alice.threads.prune([tid], strategy="keep_latest")
    assert status_of(err) == 409
    alice.runs.join(tid, run["run_id"])
    wait_for(lambda: alice.threads.get(tid)["status"] != "busy", timeout=30)
    assert alice.threads.prune([tid], strategy="keep_latest") == {"pruned_count": 1}
    assert len(alice.threads.get_history(tid, limit=100)) == 1
