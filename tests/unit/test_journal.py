"""RunJournal, payload truncation and the delivery receipt (J1-J6); the in-process store's
pages are in the event store conformance suite (test_memory_event_store.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.config import get_config

from shared import serde
from shared.agent.model import BuiltinChatModel
from shared.errors import StoreError
from shared.journal import (
    DeliveryOutcome,
    MemoryEventStore,
    RunEvent,
    RunJournal,
    journal_from_config,
    parse_thread_cursor,
    settle_delivery,
    summarize_usage,
    truncate_payload,
    write_delivery_receipt,
)
from shared.journal.delivery import coverage
from shared.journal.journal import usage_of
from shared.journal.payload import encode_payload

RUN, THREAD = "run-1", "thread-1"


class FlakyStore(MemoryEventStore):
    """A memory store whose append_batch fails on the calls numbered in `fail_on` (1-based)."""

    def __init__(self, fail_on: Sequence[int] = (1,), **kw: Any) -> None:
        super().__init__(**kw)
        self.fail_on = set(fail_on)
        self.calls = 0

    def append_batch(self, events: Sequence[RunEvent]) -> list[RunEvent]:
        self.calls += 1
        if self.calls in self.fail_on:
            raise StoreError(f"injected failure on call {self.calls}")
        return super().append_batch(events)

    def append_receipt(self, event: RunEvent, *, epoch: int | None = None) -> RunEvent | None:
        self.calls += 1
        if self.calls in self.fail_on:
            raise StoreError(f"injected failure on call {self.calls}")
        return super().append_receipt(event, epoch=epoch)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def numbered(store: MemoryEventStore) -> list[int]:
    """The `n` of the `test.n` events of RUN in stored order."""
    page = store.list_run_events(RUN, categories=["workspace"], limit=10_000)
    return [ev.payload["n"] for ev in page.events]


def record_n(journal: RunJournal, start: int, stop: int) -> None:
    for n in range(start, stop):
        journal.record("workspace", "test.n", {"n": n})


# --- J3: batching, failures, order -------------------------------------------------------------
def test_j3_flushes_when_twenty_events_are_buffered() -> None:
    """J3: nothing is written before 20 events are buffered; the 20th writes them in order."""
    store = MemoryEventStore()
    journal = RunJournal(store, run_id=RUN, thread_id=THREAD, clock=FakeClock())
    record_n(journal, 0, 19)
    assert numbered(store) == [] and journal.pending == 19
    record_n(journal, 19, 20)
    assert numbered(store) == list(range(20)) and journal.pending == 0
    record_n(journal, 20, 23)
    assert journal.flush_sync() == 3
    seqs = [ev.seq for ev in store.list_run_events(RUN).events]
    assert seqs == list(range(1, 24))


def test_j3_a_failed_batch_is_kept_and_written_later_in_order() -> None:
    """J3: the store fails once; the batch goes back to the front, nothing is lost, order kept."""
    clock = FakeClock()
    store = FlakyStore(fail_on=[1])
    journal = RunJournal(store, run_id=RUN, thread_id=THREAD, clock=clock)
    record_n(journal, 0, 20)
    assert numbered(store) == [] and journal.pending == 20
    assert isinstance(journal.last_error, StoreError)
    # On back-off: more full batches do not hammer the failing store.
    record_n(journal, 20, 45)
    assert store.calls == 1 and journal.pending == 45
    assert journal.flush_sync() == 45
    assert numbered(store) == list(range(45)) and journal.pending == 0


def test_j3_flush_raises_and_keeps_the_failed_batch_at_the_front() -> None:
    """J3: flush writes in batches; a failing batch is put back first and the error raised."""
    store = FlakyStore(fail_on=[2, 3])
    journal = RunJournal(store, run_id=RUN, thread_id=THREAD, flush_size=20, clock=FakeClock())
    with journal._lock:  # buffer 45 events without triggering a write
        for n in range(45):
            journal._add("workspace", "test.n", {"n": n})
    with pytest.raises(StoreError):
        journal.flush_sync()
    assert numbered(store) == list(range(20)) and journal.pending == 25
    record_n(journal, 45, 46)  # back-off after the failure: buffered only
    with pytest.raises(StoreError):
        journal.flush_sync()
    assert journal.pending == 26
    assert journal.flush_sync() == 26
    assert numbered(store) == list(range(46))


def test_j3_background_writer_on_the_loop_then_flush_drains() -> None:
    """J3: on the event loop a full buffer starts a writer task; flush() waits for it, then drains."""
    store = FlakyStore(fail_on=[1])
    clock = FakeClock()
    journal = RunJournal(store, run_id=RUN, thread_id=THREAD, clock=clock, snapshot_interval_s=3600)

    async def scenario() -> None:
        record_n(journal, 0, 20)  # starts the writer; it fails once (kept)
        writer = journal._writer
        assert writer is not None
        await asyncio.wait([writer])
        assert journal.pending == 20 and journal.last_error is not None
        clock.now += 60  # past the back-off
        record_n(journal, 20, 41)  # writer again: two full batches
        await asyncio.wait([journal._writer])  # type: ignore[list-item]
        assert journal.pending == 1
        assert await journal.flush() == 1

    asyncio.run(scenario())
    assert numbered(store) == list(range(41))


def test_j3_progress_snapshots_are_throttled() -> None:
    """J3: at most one `run.progress` snapshot per 5 s, with counts and usage."""
    clock = FakeClock()
    store = MemoryEventStore()
    journal = RunJournal(store, run_id=RUN, thread_id=THREAD, clock=clock, snapshot_interval_s=5)
    for n in range(12):
        clock.now += 1.0
        record_n(journal, n, n + 1)
    journal.flush_sync()
    progress = store.list_run_events(RUN, categories=["lifecycle"]).events
    assert [p.type for p in progress] == ["run.progress", "run.progress"]
    assert progress[0].payload["events"] == 5 and progress[1].payload["events"] == 11
    assert progress[0].payload["usage"]["total"]["total_tokens"] == 0
    # the snapshots sit where they were taken, after the 5th and the 10th event
    kinds = [ev.type for ev in store.list_run_events(RUN).events]
    assert kinds.index("run.progress") == 5


# --- J1/J2: the callbacks -------------------------------------------------------------------------
def _result(text: str, usage: dict[str, int] | None) -> LLMResult:
    msg = AIMessage(content=text, usage_metadata=usage)  # type: ignore[arg-type]
    return LLMResult(generations=[[ChatGeneration(message=msg)]])


def test_j2_usage_is_attributed_to_the_innermost_tag_whatever_the_tag_order() -> None:
    """J2: LangChain sorts tags; the journal follows parent_run_id to the innermost tagged run."""
    journal = RunJournal(MemoryEventStore(), run_id=RUN, thread_id=THREAD, clock=FakeClock())
    root, outer, inner, m1, m2, m3 = (uuid.uuid4() for _ in range(6))
    journal.on_chain_start({}, {"messages": []}, run_id=root, tags=[])
    journal.on_chain_start({}, {}, run_id=outer, parent_run_id=root, tags=["subagent:zeta"])
    # inner introduces subagent:alpha, sorted before the inherited zeta
    journal.on_chain_start(
        {}, {}, run_id=inner, parent_run_id=outer, tags=["subagent:alpha", "subagent:zeta"]
    )
    journal.on_chat_model_start({}, [[]], run_id=m1, parent_run_id=inner, tags=["subagent:alpha"])
    usage = {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}
    journal.on_llm_end(_result("a", usage), run_id=m1)
    journal.on_chat_model_start({}, [[]], run_id=m2, parent_run_id=outer, tags=["subagent:zeta"])
    journal.on_llm_end(_result("b", usage), run_id=m2)
    journal.on_chat_model_start({}, [[]], run_id=m3, parent_run_id=root, tags=[])
    journal.on_llm_end(_result("c", {**usage, "input_tokens": 10, "total_tokens": 14}), run_id=m3)
    summary = journal.usage()
    assert summary["by_tag"] == {
        "lead_agent": {"input_tokens": 10, "output_tokens": 4, "total_tokens": 14},
        "subagent:alpha": usage,
        "subagent:zeta": usage,
    }
    assert summary["total"] == {"input_tokens": 16, "output_tokens": 12, "total_tokens": 28}


def test_j2_tags_through_real_langchain_runnables() -> None:
    """J2: with_config(tags=[subagent:…]) nested two deep, through LangChain's own callbacks."""
    model = BuiltinChatModel(tokens=3)

    def nest(outer: str, inner: str) -> dict[str, Any]:
        inner_model = model.with_config(tags=[inner])

        async def call(x: str, config: RunnableConfig) -> Any:
            return await inner_model.ainvoke("hi there", config)

        journal = RunJournal(MemoryEventStore(), run_id=RUN, thread_id=THREAD)
        runnable = RunnableLambda(call).with_config(tags=[outer])
        asyncio.run(runnable.ainvoke("x", {"callbacks": [journal]}))
        return journal.usage()["by_tag"]

    assert set(nest("subagent:alpha", "subagent:zeta")) == {"subagent:zeta"}
    assert set(nest("subagent:zeta", "subagent:alpha")) == {"subagent:alpha"}
    assert set(nest("subagent:zeta", "middleware:memory")) == {"middleware:memory"}


class Summarize(AgentMiddleware[Any, Any]):
    """A middleware whose before_model hook calls a model and updates the state."""

    def __init__(self) -> None:
        super().__init__()
        self.model = BuiltinChatModel(tokens=5)

    async def abefore_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        await self.model.ainvoke("summarize the conversation")
        journal = journal_from_config(get_config())
        assert journal is not None
        journal.record_memory_context("the user likes ducks")
        return {"messages": []}


def test_j1_j2_middleware_hook_is_billed_to_the_middleware_and_its_change_recorded() -> None:
    """J1/J2/J6: a model call inside `<Name>.before_model` goes to `middleware:<Name>`; the
    middleware finds the journal in its config and records its memory context as a hash."""
    agent = create_agent(
        BuiltinChatModel(tokens=4), [], middleware=[Summarize()], name="lead_agent"
    )
    store = MemoryEventStore()
    journal = RunJournal(store, run_id=RUN, thread_id=THREAD)

    async def run() -> None:
        await agent.ainvoke(
            {"messages": [{"role": "user", "content": "hi"}]}, {"callbacks": [journal]}
        )
        await journal.flush()

    asyncio.run(run())
    by_tag = journal.usage()["by_tag"]
    assert by_tag["middleware:Summarize"]["output_tokens"] == 5
    assert by_tag["lead_agent"]["output_tokens"] == 4
    changes = store.list_run_events(RUN, categories=["middleware"]).events
    assert [c.payload for c in changes] == [
        {"middleware": "Summarize", "hook": "before_model", "keys": ["messages"]}
    ]
    assert store.run_usage(RUN) == journal.usage()
    (memory,) = store.list_run_events(RUN, categories=["memory"]).events
    assert memory.payload["sha256"] == hashlib.sha256(b"the user likes ducks").hexdigest()
    assert journal_from_config({"callbacks": [journal]}) is journal
    assert journal_from_config({}) is None


def test_j1_tool_events_and_artifact() -> None:
    """J1: a tool call, its result, a handled error and the artifact it wrote."""
    store = MemoryEventStore()
    journal = RunJournal(store, run_id=RUN, thread_id=THREAD)
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    content = "# report\n"
    journal.on_tool_start(
        {"name": "write_artifact"},
        "",
        run_id=t1,
        inputs={"filename": "r.md", "content": content},
    )
    from langchain_core.messages import ToolMessage

    journal.on_tool_end(
        ToolMessage(content='{"path": "outputs/r.md", "size": 9}', tool_call_id="call_0"),
        run_id=t1,
    )
    journal.on_tool_start({"name": "read_artifact"}, "", run_id=t2, inputs={"filename": "x"})
    journal.on_tool_end(
        ToolMessage(content="no such artifact", tool_call_id="call_1", status="error"), run_id=t2
    )
    journal.flush_sync()
    kinds = [(e.category, e.type) for e in store.list_run_events(RUN).events]
    assert kinds == [
        ("tool", "tool.call"),
        ("tool", "tool.result"),
        ("artifact", "artifact.written"),
        ("tool", "tool.call"),
        ("tool", "tool.error"),
    ]
    artifact = store.list_run_events(RUN, categories=["artifact"]).events[0].payload
    assert artifact["path"] == "outputs/r.md" and artifact["tool_call_id"] == "call_0"
    assert artifact["sha256"] == hashlib.sha256(content.encode()).hexdigest()
    assert journal.artifact_paths() == ["outputs/r.md"] and journal.produced_output
    assert journal.counts()["tool_errors"] == 1


def test_j6_memory_context_is_recorded_only_as_a_hash() -> None:
    """J6: the memory text never reaches the journal, only its SHA-256."""
    store = MemoryEventStore()
    journal = RunJournal(store, run_id=RUN, thread_id=THREAD)
    secret = "Alice's card number is 4111 1111 1111 1111"
    digest = journal.record_memory_context(secret)
    journal.flush_sync()
    (event,) = store.list_run_events(RUN).events
    assert event.category == "memory" and event.payload["sha256"] == digest
    assert digest == hashlib.sha256(secret.encode()).hexdigest()
    assert "4111" not in serde.dumps_str(event.payload)


def test_usage_of_falls_back_to_llm_output() -> None:
    """J2: provider counts in llm_output are used when messages carry no usage_metadata."""
    result = _result("x", None)
    result.llm_output = {"token_usage": {"prompt_tokens": 5, "completion_tokens": 2}}
    assert usage_of(result) == {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}


def test_summarize_usage_counts_only_model_end() -> None:
    """J2: progress snapshots carry running totals; only model.end events are summed."""
    u = {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}
    events = [
        RunEvent(RUN, THREAD, "model", "model.end", {"tag": "lead_agent", "usage": u}),
        RunEvent(RUN, THREAD, "model", "model.end", {"tag": "subagent:x", "usage": u}),
        RunEvent(RUN, THREAD, "lifecycle", "run.progress", {"usage": {"total": u}}),
        RunEvent(RUN, THREAD, "model", "model.end", {"usage": u}),
    ]
    summary = summarize_usage(events)
    assert summary["by_tag"] == {"lead_agent": {k: 2 * v for k, v in u.items()}, "subagent:x": u}
    assert summary["total"]["total_tokens"] == 9


# --- J4: truncation, pages -------------------------------------------------------------------------
def test_j4_large_payloads_are_truncated_with_a_marker() -> None:
    """J4: past max bytes a payload becomes {_truncated, original_bytes, preview}."""
    payload = {"content": "x" * 5000}
    kept = truncate_payload(payload, 1024)
    assert kept["_truncated"] is True
    assert kept["original_bytes"] == len(serde.dumps(payload))
    assert serde.dumps_str(payload).startswith(kept["preview"])
    assert len(serde.dumps(kept)) <= 1024
    assert truncate_payload({"a": 1}, 1024) == {"a": 1}
    # multi-byte characters are cut on a character boundary
    assert truncate_payload({"c": "é" * 2000}, 512)["preview"].startswith('{"c":"éé')


def test_j4_nul_characters_are_replaced_but_escaped_backslashes_are_not() -> None:
    """J4: jsonb refuses \\u0000; the store replaces it and leaves a literal backslash-u0000 alone."""
    text = encode_payload({"a": "x\x00y", "b": "\\u0000"}, 1024)
    assert json.loads(text) == {"a": "x\ufffdy", "b": "\\u0000"}


def test_thread_cursor_parsing() -> None:
    """J4: a thread cursor is `<run_seq>:<seq>`."""
    assert parse_thread_cursor("12:7") == (12, 7)
    for bad in ("12", "a:1", "1:-2", ""):
        with pytest.raises(ValueError):
            parse_thread_cursor(bad)


# --- J5: delivery ------------------------------------------------------------------------------------
def test_j5_receipt_retries_then_is_idempotent(tmp_path: Path) -> None:
    """J5: two failures then success (with back-off); a second write finds the first receipt."""
    out = tmp_path / THREAD / "outputs"
    out.mkdir(parents=True)
    (out / "r.md").write_text("hello")
    store = FlakyStore(fail_on=[1, 2])
    sleeps: list[float] = []
    args = (store, RUN, THREAD, 1, True, ["outputs/r.md", "outputs/gone.md", "../../etc/passwd"])
    outcome = write_delivery_receipt(*args, tmp_path, sleep=sleeps.append)
    assert outcome is DeliveryOutcome.WRITTEN and sleeps == [0.1, 0.2]
    assert write_delivery_receipt(*args, tmp_path, sleep=sleeps.append) is (
        DeliveryOutcome.ALREADY_WRITTEN
    )
    receipt = store.get_receipt(RUN, 1)
    assert receipt is not None and receipt.type == "run.delivery"
    p = receipt.payload
    assert p["run_id"] == RUN and p["attempt"] == 1 and p["produced_output"] is True
    assert p["coverage"] == [
        {
            "path": "outputs/r.md",
            "exists": True,
            "size": 5,
            "sha256": hashlib.sha256(b"hello").hexdigest(),
        },
        {"path": "outputs/gone.md", "exists": False, "size": None, "sha256": None},
        {"path": "../../etc/passwd", "exists": False, "size": None, "sha256": None},
    ]
    assert len(store.list_run_events(RUN, categories=["delivery"]).events) == 1


def test_j5_receipt_failure_turns_a_producing_success_into_error(tmp_path: Path) -> None:
    """J5: bounded retries (3) all fail -> FAILED; a success that produced output becomes error."""
    store = FlakyStore(fail_on=[1, 2, 3, 4])
    outcome = write_delivery_receipt(
        store, RUN, THREAD, 2, True, [], tmp_path, sleep=lambda _s: None
    )
    assert outcome is DeliveryOutcome.FAILED and store.calls == 3
    status, error = settle_delivery("success", None, True, outcome)
    assert status == "error" and error is not None and error["error"] == "DeliveryReceiptFailed"
    assert settle_delivery("success", None, False, outcome) == ("success", None)
    assert settle_delivery("interrupted", None, True, outcome) == ("interrupted", None)
    assert settle_delivery("success", None, True, DeliveryOutcome.ALREADY_WRITTEN) == (
        "success",
        None,
    )


def test_coverage_does_not_follow_symlinks_out_of_the_workspace(tmp_path: Path) -> None:
    """J5: a presented path that resolves outside the workspace counts as missing."""
    secret = tmp_path / "secret.txt"
    secret.write_text("s")
    ws = tmp_path / "ws"
    (ws / "outputs").mkdir(parents=True)
    (ws / "outputs" / "link.md").symlink_to(secret)
    assert coverage(["outputs/link.md", "outputs"], ws) == [
        {"path": "outputs/link.md", "exists": False, "size": None, "sha256": None},
        {"path": "outputs", "exists": False, "size": None, "sha256": None},
    ]
