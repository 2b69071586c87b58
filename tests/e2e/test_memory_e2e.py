"""Context that lasts, end to end (C1-C3, M1-M6): web, runs worker and memory worker processes.

Alice states a report-format preference in thread 1; after the debounce the memory
worker stores it; a new thread 2 gets it injected and the built-in model's report
follows it; Bob gets none of it. A long thread 3 is compacted through the API and its
next run still sees the summary.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared.agent.middleware.durable_context import context_block
from shared.tools.testing import Cluster, wait_for
from shared.workspaces import thread_workspace
from tests.e2e.conftest import ALICE, BOB, ClusterFactory

pytestmark = pytest.mark.e2e

PREFERENCE = "When you give me numbers, I prefer conclusion first, amounts in RMB"
MEMORY_ENV = {
    "THREADRUN_MEMORY_DEBOUNCE_S": "0.5",
    "THREADRUN_MEMORY_DRAIN_INTERVAL_S": "0.1",
}


@pytest.fixture(scope="module")
def mc(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """Web + runs worker + memory worker on a private database and prefix."""
    with private_cluster("memory-e2e", MEMORY_ENV) as c:
        c.side_by_side(
            c.start_web,
            lambda: c.start_worker("runs", concurrency=4),
            lambda: c.start_worker("memory", 2, queues="memory", ready="memory drain started"),
        )
        yield c


def api(c: Cluster, key: str) -> httpx.Client:
    return httpx.Client(base_url=c.url, headers={"x-api-key": key}, timeout=60)


def new_thread(client: httpx.Client) -> str:
    r = client.post("/threads", json={})
    assert r.status_code == 200, r.text
    return str(r.json()["thread_id"])


def run_wait(client: httpx.Client, tid: str, text: str) -> dict[str, Any]:
    body = {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": text}]},
    }
    r = client.post(f"/threads/{tid}/runs/wait", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def state(client: httpx.Client, tid: str) -> dict[str, Any]:
    r = client.get(f"/threads/{tid}/state")
    assert r.status_code == 200, r.text
    return dict(r.json())


def report(c: Cluster, user: str, tid: str) -> str:
    return (
        thread_workspace(c.settings.workspace_dir, user, tid) / "outputs" / "report.md"
    ).read_text()


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def events(client: httpx.Client, tid: str, category: str) -> list[dict[str, Any]]:
    r = client.get(f"/threads/{tid}/events", params={"category": category, "limit": 500})
    assert r.status_code == 200, r.text
    return list(r.json()["events"])


def test_m1_m6_preference_remembered_across_threads_for_its_user_only(mc: Cluster) -> None:
    alice, bob = api(mc, ALICE), api(mc, BOB)
    t1 = new_thread(alice)
    run_wait(alice, t1, PREFERENCE + ".")

    def alice_facts() -> list[dict[str, Any]]:
        return list(alice.get("/memory/facts").json()["facts"])

    (fact,) = wait_for(alice_facts, 30, what="the memory worker to store the preference")
    assert fact["content"] == PREFERENCE and fact["category"] == "preference"
    assert fact["source_thread_id"] == t1

    # M2: a new thread of Alice freezes the memory; the report follows the preference.
    t2 = new_thread(alice)
    run_wait(alice, t2, "Please write a report on Q3 sales.")
    text = report(mc, "alice", t2)
    assert text.index("## Conclusion") < text.index("## Details")
    assert "Amount: RMB 1,000.00" in text and PREFERENCE in text
    frozen = state(alice, t2)["values"]["memory_context"]
    assert PREFERENCE in frozen["text"]
    # J6: the journal holds the memory text's SHA-256, never the text.
    mem_events = events(alice, t2, "memory")
    assert sha256(frozen["text"]) in {e["payload"]["sha256"] for e in mem_events}
    assert all(PREFERENCE not in str(e["payload"]) for e in mem_events)

    # Bob: no memory, a plain report, and Alice's fact is invisible to him (404).
    tb = new_thread(bob)
    run_wait(bob, tb, "Please write a report on Q3 sales.")
    bob_text = report(mc, "bob", tb)
    assert "Preferences applied" not in bob_text and "RMB" not in bob_text
    assert bob.get("/memory/facts").json() == {"facts": []}
    assert bob.delete(f"/memory/facts/{fact['fact_id']}").status_code == 404
    r = alice.get("/memory/facts", params={"limit": 0})
    assert r.status_code == 422 and r.json()["field"] == "limit"

    assert alice.delete(f"/memory/facts/{fact['fact_id']}").status_code == 200
    assert alice_facts() == []
    assert alice.delete(f"/memory/facts/{fact['fact_id']}").status_code == 404


def test_c1_c2_manual_compact_and_the_next_run_sees_the_summary(mc: Cluster) -> None:
    alice, bob = api(mc, ALICE), api(mc, BOB)
    t3 = new_thread(alice)
    assert alice.post(f"/threads/{t3}/compact").json()["error"] == "nothing_to_compact"
    for i in range(5):
        run_wait(alice, t3, f"chapter {i}: the plot thickens")
    assert bob.post(f"/threads/{t3}/compact").status_code == 404

    r = alice.post(f"/threads/{t3}/compact")
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["outcome"] == "compacted"
    assert (result["summarized"], result["preserved"]) == (4, 6)
    after = state(alice, t3)
    assert after["next"] == [], "a compaction never starts an agent node"
    summary = after["values"]["summary_text"]
    assert summary.startswith('The user said "chapter 0') and "chapter 1" in summary
    assert len(after["values"]["messages"]) == 6
    assert result["output_sha256"] == sha256(summary)

    again = alice.post(f"/threads/{t3}/compact")
    assert again.status_code == 409 and again.json()["error"] == "nothing_to_compact"

    # A thread with nothing a summary can say (no user lines): "generation failed",
    # distinct from "nothing to compact", and the state is unchanged.
    t4 = new_thread(alice)
    said = [{"role": "assistant", "content": f"note {i}"} for i in range(8)]
    r = alice.post(
        f"/threads/{t4}/runs/wait",
        json={"assistant_id": "lead_agent", "input": {"messages": said}},
    )
    assert r.status_code == 200, r.text
    before = state(alice, t4)["values"]
    failed = alice.post(f"/threads/{t4}/compact")
    assert failed.status_code == 502 and failed.json()["error"] == "summary_failed"
    assert state(alice, t4)["values"] == before

    out = run_wait(alice, t3, "what happened so far?")
    assert out["summary_text"] == summary
    # The model call of that run got the summary in its hidden context block (C3).
    block = context_block(state(alice, t3)["values"])
    assert "<summary>" in block
    durable = [
        e for e in events(alice, t3, "memory") if e["payload"].get("source") == "durable_context"
    ]
    assert durable and durable[-1]["payload"]["sha256"] == sha256(block)
