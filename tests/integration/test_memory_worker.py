"""The `memory` Celery queue with a real worker process (M4, M5): debounce and crash safety."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from shared.memory.manager import MemoryManager
from shared.memory.services import build_manager
from shared.settings import Settings
from tests.conftest import private_settings, settings_env

ROOT = Path(__file__).resolve().parents[2]
TOKEN_DELAY_MS = 150  # an extraction reply streams ~10 tokens: ~1.5 s per batch
FAST = {
    "THREADRUN_MEMORY_DEBOUNCE_S": "0.5",
    "THREADRUN_MEMORY_DRAIN_INTERVAL_S": "0.1",
    "THREADRUN_MEMORY_CLAIM_TTL_S": "3",
    "THREADRUN_BUILTIN_TOKEN_DELAY_MS": str(TOKEN_DELAY_MS),
}


class MemoryWorker:
    """A `celery worker -Q memory` child process with its log."""

    def __init__(self, settings: Settings, log: Path) -> None:
        env = {**os.environ, **settings_env(settings), **FAST}
        argv = [
            sys.executable, "-m", "celery", "-A", "workers.celery_app:celery", "worker",
            "-Q", "memory", "-P", "threads", "-c", "2", "-n", f"memory-{log.stem}@%h",
            "--without-gossip", "--without-mingle", "-l", "info",
        ]  # fmt: skip
        self.log = log
        with log.open("wb") as fh:
            self.proc = subprocess.Popen(
                argv, env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT
            )
        try:
            wait_for(lambda: "memory drain started" in self.text(), 60, self.text)
        except BaseException:
            self.stop(signal.SIGKILL)
            raise

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def wait_for(cond: Callable[[], Any], timeout: float, why: Callable[[], str] = lambda: "") -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s\n{why()[-3000:]}")


@pytest.fixture(scope="module")
def msettings(settings: Settings, redis_url: str) -> Iterator[Settings]:
    """A private database and prefix, with the fast memory numbers the worker uses."""
    with private_settings(settings, redis_url) as s:
        yield s.model_copy(update={"memory_debounce_s": 0.5, "memory_claim_ttl_s": 3.0})


@pytest.fixture(scope="module")
def manager(msettings: Settings) -> Iterator[MemoryManager]:
    m = build_manager(msettings)
    yield m
    m.backend.close()
    m.queue.redis.close()


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("memory-worker")


def turn(text: str, i: int) -> list[HumanMessage | AIMessage]:
    return [HumanMessage(text, id=f"h{i}"), AIMessage(f"noted {i}", id=f"a{i}")]


def test_m4_burst_of_20_updates_is_one_extraction_by_the_worker(
    msettings: Settings, manager: MemoryManager, logs: Path
) -> None:
    worker = MemoryWorker(msettings, logs / "burst.log")
    try:
        history: list[HumanMessage | AIMessage] = []
        for i in range(20):
            history += turn("I prefer answers in French." if i == 0 else f"message {i}", i)
            manager.add("burst-thread", history, "lead_agent", "burst-user", trace_id=f"r{i}")
        wait_for(lambda: manager.queue.counters()["extracted"] == 1, 30, worker.text)
        wait_for(lambda: manager.queue.backlog() == 0, 10, worker.text)
        counters = manager.queue.counters()
        assert counters["admitted"] == 1 and counters["merged"] == 19
        facts = manager.list_facts("burst-user")
        assert [f.content for f in facts] == ["I prefer answers in French"]
        assert facts[0].source_thread_id == "burst-thread"
        time.sleep(1.0)  # nothing else arrives: exactly one extraction
        assert manager.queue.counters()["extracted"] == 1
        assert worker.text().count("20 updates merged") == 1
    finally:
        worker.stop()


def test_m5_worker_killed_mid_batch_loses_no_admitted_update(
    msettings: Settings, manager: MemoryManager, logs: Path
) -> None:
    users = [f"kill-user-{i}" for i in range(6)]
    for i, u in enumerate(users):
        manager.add(f"kill-thread-{i}", turn(f"I like topic {i}.", i), "lead_agent", u)
    first = MemoryWorker(msettings, logs / "first.log")
    base = manager.queue.counters()["extracted"]
    try:
        # Two extractions at a time, ~1.5 s each: kill once some but not all are stored.
        wait_for(lambda: manager.queue.counters()["extracted"] > base, 30, first.text)
    finally:
        first.stop(signal.SIGKILL)
    done = manager.queue.counters()["extracted"] - base
    assert done < len(users), "the kill came too late to test anything"
    assert manager.queue.backlog() == len(users) - done, "unfinished batches stay admitted"

    second = MemoryWorker(msettings, logs / "second.log")
    try:
        wait_for(lambda: manager.queue.backlog() == 0, 60, second.text)
    finally:
        second.stop()
    for i, u in enumerate(users):
        assert [f.content for f in manager.list_facts(u)] == [f"I like topic {i}"]
    assert manager.queue.counters()["dropped"] == 0
