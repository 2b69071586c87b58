"""The `memory` Celery queue with a real worker process (M4, M5): debounce and crash safety."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from shared.memory.manager import MemoryManager
from shared.memory.services import build_manager
from shared.settings import Settings
from shared.tools.testing import Cluster, Proc, cluster_env, wait_for
from tests.conftest import private_settings

TOKEN_DELAY_MS = 150  # an extraction reply streams ~10 tokens: ~1.5 s per batch
FAST = {
    "THREADRUN_MEMORY_DEBOUNCE_S": "0.5",
    "THREADRUN_MEMORY_DRAIN_INTERVAL_S": "0.1",
    "THREADRUN_MEMORY_CLAIM_TTL_S": "3",
    "THREADRUN_BUILTIN_TOKEN_DELAY_MS": str(TOKEN_DELAY_MS),
}


@pytest.fixture(scope="module")
def msettings(settings: Settings, redis_url: str, template_database: str) -> Iterator[Settings]:
    """A private database and prefix, with the fast memory numbers the worker uses."""
    with private_settings(settings, redis_url, template_database) as s:
        yield s.model_copy(update={"memory_debounce_s": 0.5, "memory_claim_ttl_s": 3.0})


@pytest.fixture(scope="module")
def manager(msettings: Settings) -> Iterator[MemoryManager]:
    m = build_manager(msettings)
    yield m
    m.backend.close()
    m.queue.redis.close()


@pytest.fixture(scope="module")
def workers(msettings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Memory workers (`celery worker -Q memory`) on the private database, stopped at the end."""
    env = cluster_env(msettings, FAST)
    with Cluster(msettings, env, tmp_path_factory.mktemp("memory-worker")) as c:
        yield c


def memory_worker(workers: Cluster, name: str) -> Proc:
    """A memory worker with two threads, once it drains."""
    return workers.start_worker(name, 2, queues="memory", ready="memory drain started")


def turn(text: str, i: int) -> list[HumanMessage | AIMessage]:
    return [HumanMessage(text, id=f"h{i}"), AIMessage(f"noted {i}", id=f"a{i}")]


def test_m4_burst_of_20_updates_is_one_extraction_by_the_worker(
    manager: MemoryManager, workers: Cluster
) -> None:
    worker = memory_worker(workers, "burst")
    try:
        history: list[HumanMessage | AIMessage] = []
        for i in range(20):
            history += turn("I prefer answers in French." if i == 0 else f"message {i}", i)
            manager.add("burst-thread", history, "lead_agent", "burst-user", trace_id=f"r{i}")
        wait_for(lambda: manager.queue.counters()["extracted"] == 1, 30, 0.05, detail=worker.tail)
        wait_for(lambda: manager.queue.backlog() == 0, 10, 0.05, detail=worker.tail)
        counters = manager.queue.counters()
        assert counters["admitted"] == 1 and counters["merged"] == 19
        facts = manager.list_facts("burst-user")
        assert [f.content for f in facts] == ["I prefer answers in French"]
        assert facts[0].source_thread_id == "burst-thread"
        time.sleep(1.0)  # nothing else arrives: exactly one extraction
        assert manager.queue.counters()["extracted"] == 1
        assert worker.output().count("20 updates merged") == 1
    finally:
        worker.stop()


def test_m5_worker_killed_mid_batch_loses_no_admitted_update(
    manager: MemoryManager, workers: Cluster
) -> None:
    users = [f"kill-user-{i}" for i in range(6)]
    for i, u in enumerate(users):
        manager.add(f"kill-thread-{i}", turn(f"I like topic {i}.", i), "lead_agent", u)
    first = memory_worker(workers, "first")
    base = manager.queue.counters()["extracted"]
    try:
        # Two extractions at a time, ~1.5 s each: kill once some but not all are stored.
        wait_for(lambda: manager.queue.counters()["extracted"] > base, 30, 0.05, detail=first.tail)
    finally:
        first.stop(signal.SIGKILL)
    done = manager.queue.counters()["extracted"] - base
    assert done < len(users), "the kill came too late to test anything"
    assert manager.queue.backlog() == len(users) - done, "unfinished batches stay admitted"

    second = memory_worker(workers, "second")
    try:
        wait_for(lambda: manager.queue.backlog() == 0, 60, 0.05, detail=second.tail)
    finally:
        second.stop()
    for i, u in enumerate(users):
        assert [f.content for f in manager.list_facts(u)] == [f"I like topic {i}"]
    assert manager.queue.counters()["dropped"] == 0
