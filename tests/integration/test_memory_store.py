"""Memory backends (M1, M6) and the debounced queue (M4, M5) on real Postgres and Redis."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from langchain_core.messages import AIMessage, HumanMessage

from shared.agent.model import BuiltinChatModel
from shared.db import make_pool
from shared.memory.base import AdmitOutcome, MemoryBackend, MemoryFactNotFound, NewFact
from shared.memory.inprocess import InProcessMemoryBackend
from shared.memory.manager import MemoryManager
from shared.memory.postgres import PostgresMemoryBackend
from shared.memory.queue import MemoryQueue
from shared.memory.stats import memory_stats
from shared.settings import Settings


@pytest.fixture(params=["postgres", "inprocess"])
def backend(request: pytest.FixtureRequest, settings: Settings) -> Iterator[MemoryBackend]:
    """Every backend passes the same conformance tests."""
    if request.param == "inprocess":
        yield InProcessMemoryBackend()
        return
    pool = make_pool(settings, name="test-memory", max_size=2)
    b = PostgresMemoryBackend(pool, owns_pool=True)
    yield b
    b.close()


def user() -> str:
    return f"u-{uuid.uuid4().hex[:8]}"


def test_m1_upsert_is_idempotent_per_bucket_and_lists_newest_first(backend: MemoryBackend) -> None:
    alice = user()
    facts = [NewFact("preference", "I prefer tea", 0.8), NewFact("fact", "Lives in Lyon", 0.6)]
    backend.upsert_facts("agent", alice, facts, source_thread_id="t1", trace_id="r1")
    # the same text again (a re-extracted batch): no copy, confidence only grows
    backend.upsert_facts(
        "agent",
        alice,
        [NewFact("preference", "i prefer tea.", 0.9)],
        source_thread_id="t2",
        trace_id=None,
    )
    listed = backend.list_facts("agent", alice, 10)
    assert [f.content for f in listed] == ["i prefer tea.", "Lives in Lyon"]
    assert listed[0].confidence == pytest.approx(0.9) and listed[0].source_thread_id == "t2"
    assert backend.list_facts("other-agent", alice, 10) == []
    assert len(backend.list_facts(None, alice, 10)) == 2
    assert backend.list_facts("agent", alice, 1) == listed[:1]


def test_m6_delete_only_your_own_fact(backend: MemoryBackend) -> None:
    alice, bob = user(), user()
    backend.upsert_facts(
        "a", alice, [NewFact("fact", "x", 1)], source_thread_id=None, trace_id=None
    )
    fact_id = backend.list_facts(None, alice, 1)[0].fact_id
    with pytest.raises(MemoryFactNotFound):
        backend.delete_fact(bob, fact_id)
    with pytest.raises(MemoryFactNotFound):
        backend.delete_fact(alice, "not-a-uuid")
    backend.delete_fact(alice, fact_id)
    assert backend.list_facts(None, alice, 10) == []
    with pytest.raises(MemoryFactNotFound):
        backend.delete_fact(alice, fact_id)


def test_m1_m4_a_correction_supersedes_the_facts_it_replaces(backend: MemoryBackend) -> None:
    """M1, M4: storing a fact that replaces others deletes them in the same step, but only
    this agent's facts of this user, and never a fact this step stores again."""
    alice, bob = user(), user()
    old = [NewFact("preference", "I prefer tea", 0.9), NewFact("fact", "Lives in Lyon", 0.6)]
    backend.upsert_facts("a", alice, old, source_thread_id=None, trace_id=None)
    backend.upsert_facts("a", bob, old[:1], source_thread_id=None, trace_id=None)
    backend.upsert_facts("b", alice, old[:1], source_thread_id=None, trace_id=None)
    tea = next(f for f in backend.list_facts("a", alice, 10) if f.content == "I prefer tea")
    bob_tea = backend.list_facts("a", bob, 10)[0]
    other_agent_tea = backend.list_facts("b", alice, 10)[0]
    ids = (tea.fact_id, bob_tea.fact_id, other_agent_tea.fact_id, "not-a-uuid")
    coffee = NewFact("preference", "I prefer coffee", 0.95, replaces=ids)
    assert backend.upsert_facts("a", alice, [coffee], source_thread_id=None, trace_id=None) == 1
    assert sorted(f.content for f in backend.list_facts("a", alice, 10)) == [
        "I prefer coffee",
        "Lives in Lyon",
    ]
    assert [f.content for f in backend.list_facts("a", bob, 10)] == ["I prefer tea"]
    assert [f.content for f in backend.list_facts("b", alice, 10)] == ["I prefer tea"]
    # Re-stating a fact while "replacing" it keeps it.
    again = NewFact("preference", "I prefer coffee", 0.95, replaces=(tea.fact_id,))
    coffee_id = next(f.fact_id for f in backend.list_facts("a", alice, 10) if "coffee" in f.content)
    keep = NewFact("preference", "i prefer coffee.", 0.9, replaces=(coffee_id,))
    backend.upsert_facts("a", alice, [again, keep], source_thread_id=None, trace_id=None)
    assert any("coffee" in f.content for f in backend.list_facts("a", alice, 10))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def queue_parts(
    redis_url: str, redis_prefix: str
) -> Iterator[tuple[MemoryQueue, Clock, redis.Redis]]:
    client = redis.Redis.from_url(redis_url)
    clock = Clock()
    prefix = f"{redis_prefix}mq{uuid.uuid4().hex[:6]}:"
    q = MemoryQueue(
        client, prefix, debounce_s=30, backlog_limit=3, claim_ttl_s=10, max_attempts=3, clock=clock
    )
    yield q, clock, client
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)
    client.close()


def manager(q: MemoryQueue) -> MemoryManager:
    return MemoryManager(InProcessMemoryBackend(), q, max_messages=40)


def said(text: str, i: int) -> list[HumanMessage | AIMessage]:
    return [HumanMessage(text, id=f"h{i}"), AIMessage(f"ok {i}", id=f"a{i}")]


def test_m4_burst_of_20_is_one_batch_latest_wins_messages_merged(
    queue_parts: tuple[MemoryQueue, Clock, redis.Redis],
) -> None:
    q, clock, _ = queue_parts
    m = manager(q)
    history: list[HumanMessage | AIMessage] = []
    outcomes = []
    for i in range(20):
        history += said("I prefer tea." if i == 3 else f"message {i}", i)
        outcomes.append(m.add("t1", history, "agent", "alice", trace_id=f"run{i}"))
        clock.now += 1  # each admission pushes the due time: debounce restarts
    assert outcomes[0] is AdmitOutcome.ADMITTED
    assert set(outcomes[1:]) == {AdmitOutcome.MERGED}
    assert q.claim_due(10) == []  # not due yet: 30 s after the last admission
    clock.now += 30
    tokens = q.claim_due(10)
    assert len(tokens) == 1
    from shared.memory.base import merge_updates

    merged = merge_updates(q.load(tokens[0]), 40)
    assert merged.trace_id == "run19" and merged.merged == 20
    assert len(merged.messages) == 40 and len({x["id"] for x in merged.messages}) == 40
    assert m.process(tokens[0], BuiltinChatModel()) == 1
    assert [f.content for f in m.list_facts("alice")] == ["I prefer tea"]
    assert q.backlog() == 0 and q.counters()["extracted"] == 1


def test_m4_a_stated_correction_replaces_the_old_preference(
    queue_parts: tuple[MemoryQueue, Clock, redis.Redis],
) -> None:
    """M4: the user corrects a preference in a later turn: extraction (the built-in model,
    shown the stored facts) stores the new one and supersedes the old, so injection never
    shows both; an unrelated preference stays."""
    q, clock, _ = queue_parts
    m = manager(q)
    history = said("I prefer reports with the conclusion first. I like green tea.", 1)
    m.add("t1", history, "agent", "alice", trace_id="run1")
    clock.now += 31
    assert m.process(q.claim_due(10)[0], BuiltinChatModel()) == 2
    history += said("No, that's wrong. I prefer reports with the details first.", 2)
    m.add("t1", history, "agent", "alice", trace_id="run2")
    clock.now += 31
    m.process(q.claim_due(10)[0], BuiltinChatModel())
    assert sorted(f.content for f in m.list_facts("alice")) == [
        "I like green tea",
        "I prefer reports with the details first",
    ]


def test_m4_debounce_never_postpones_a_bucket_past_its_max_wait(
    queue_parts: tuple[MemoryQueue, Clock, redis.Redis],
) -> None:
    q, clock, _ = queue_parts  # debounce 30 s, max wait 10 x debounce
    m = manager(q)
    deadline = clock.now + q.max_wait_s
    for i in range(15):  # an update every 20 s keeps the debounce window open
        m.add("chatty", said(f"message {i}", i), "agent", "alice")
        clock.now += 20
        if clock.now < deadline:
            assert q.claim_due(10) == []
    assert clock.now == deadline
    assert len(q.claim_due(10)) == 1


def test_m4_keeps_only_user_inputs_and_final_replies(
    queue_parts: tuple[MemoryQueue, Clock, redis.Redis],
) -> None:
    q, clock, _ = queue_parts
    tool_turn = AIMessage("", id="x", tool_calls=[{"name": "t", "args": {}, "id": "c"}])
    hidden = HumanMessage("<memory>", id="m", additional_kwargs={"threadrun_hidden": "memory"})
    m = manager(q)
    assert m.add("t", [hidden, AIMessage("hi", id="a")], "agent", "u") is AdmitOutcome.EMPTY
    m.add(
        "t",
        [hidden, HumanMessage("hi", id="h"), tool_turn, AIMessage("done", id="d")],
        "agent",
        "u",
    )
    clock.now += 31
    (token,) = q.claim_due(10)
    (update,) = q.load(token)
    assert [(x["role"], x["content"]) for x in update.messages] == [
        ("user", "hi"),
        ("assistant", "done"),
    ]


def test_m5_backpressure_skips_ordinary_and_admits_signals_and_urgent(
    queue_parts: tuple[MemoryQueue, Clock, redis.Redis], settings: Settings
) -> None:
    q, clock, client = queue_parts
    m = manager(q)
    got = [m.add(f"t{i}", said(f"message {i}", i), "agent", "alice") for i in range(5)]
    assert got == [AdmitOutcome.ADMITTED] * 3 + [AdmitOutcome.SKIPPED] * 2
    correction = m.add("t8", said("No, that's wrong: I prefer coffee.", 8), "agent", "alice")
    urgent = m.add("t9", said("message 9", 9), "agent", "alice", urgent=True)
    assert correction is AdmitOutcome.ADMITTED and urgent is AdmitOutcome.ADMITTED
    stats = memory_stats(settings.model_copy(update={"redis_prefix": q.keys.prefix}), client)
    assert stats["skipped"] == 2 and stats["backlog"] == 5
    assert m.add("t9", said("message 10", 10), "agent", "alice") is AdmitOutcome.SKIPPED


def test_m5_urgent_update_is_due_at_once_and_not_pushed_back(
    queue_parts: tuple[MemoryQueue, Clock, redis.Redis],
) -> None:
    q, clock, _ = queue_parts
    m = manager(q)
    assert m.add("t9", said("message 9", 9), "agent", "alice", urgent=True) is AdmitOutcome.ADMITTED
    assert m.add("t9", said("message 10", 10), "agent", "alice") is AdmitOutcome.MERGED
    (token,) = q.claim_due(10)
    assert [u.urgent for u in q.load(token)] == [True, False]


def test_m5_expired_lease_is_reclaimed_then_dropped_after_max_attempts(
    queue_parts: tuple[MemoryQueue, Clock, redis.Redis],
) -> None:
    q, clock, _ = queue_parts
    manager(q).add("t", said("I like jazz.", 1), "agent", "alice", urgent=True)
    (token,) = q.claim_due(10)
    assert q.reclaim_expired(10) == []  # lease still valid
    clock.now += 11
    assert q.reclaim_expired(10) == [token]  # worker died: re-sent, update still there
    assert len(q.load(token)) == 1
    clock.now += 11
    assert q.reclaim_expired(10) == [token]
    clock.now += 11
    assert q.reclaim_expired(10) == []  # third expiry reaches max_attempts=3: dropped
    assert q.load(token) == [] and q.counters()["dropped"] == 1 and q.backlog() == 0
