"""One run attempt as named phases, in order: claim -> prepare -> execute -> finalize.

Invariants (SPEC L1, L2, J5):
- nothing is published or finalized before the claim succeeded in Postgres (epoch+1)
  and the Redis lease carries that epoch;
- every publish is fenced by the lease (Lua), the terminal status by the epoch (SQL);
- a worker that lost its lease stops at the next safe point and finalizes nothing;
- finalize order: flush journal -> delivery receipt -> terminal status -> `end`.

`execute_run` walks the phases; each phase follows it, in that order, with the helpers
it alone uses. Kept apart so the phases read in one place: what an attempt is and how
it can end (workers/attempts.py), which user may take a slot (workers/fairness.py), what
each step of finalize must survive (workers/finalize_steps.py), and the renewal of the
attempt's lease while it runs (workers/lease_keeper.py: the runtime owns the keeper, the
executor holds the attempt there from its claim until it is over).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, cast

import redis
from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel
from langgraph.types import Command

from shared import logs, metrics, serde
from shared.agent.graphs import GraphConfigError, GraphNotFound
from shared.agent.tools import FILES_FENCE_KEY
from shared.authz.users import run_subject, stored_user
from shared.bridge.publisher import EventSink
from shared.errors import EventsUnpublished, LeaseLost
from shared.journal import RunJournal
from shared.model_errors import describe_model_error
from shared.runs.leases import lease_value
from shared.runs.model import JSONObject, Run, RunStatus, Sink, ThreadStatus
from shared.runs.reserved import without_reserved
from shared.runs.store import Claim, ClaimOutcome
from shared.state.accessor import ThreadHead
from shared.state.held_writes import HeldWrites
from shared.state.savers import GATE_KEY, HEAD_KEY, HELD_WRITES_KEY, LEASE_KEY, RUN_KEY, ReadHead
from shared.vocab import DEFAULT_STREAM_MODES, graph_modes
from workers.attempts import (
    INTERRUPTED,
    PERMANENT_ERRORS,
    TRANSIENT_ERRORS,
    AttemptOutcome,
    AttemptResult,
    GraphOutcome,
    RunAttempt,
    StopReason,
)
from workers.fairness import fair_share_cap, over_fair_share
from workers.finalize_steps import (
    count_finished,
    delete_temporary_thread,
    finish_once,
    head_copy_writer,
    keep_result,
    publish_end,
    record_failure,
    release_active,
    settle_journal,
)
from workers.protocol_events import PROTOCOL_TRANSFORMERS, ProtocolTranslator
from workers.public_ids import write_public_ids
from workers.runtime import WorkerRuntime
from workers.stopped import MODEL_NODE, PartialReplies
from workers.stream_modes import StreamTranslator

log = logging.getLogger(__name__)


async def execute_run(
    rt: WorkerRuntime, run_id: str, claimed: Claim | None = None, priority: int | None = None
) -> AttemptResult:
    """One attempt of the run, phase by phase: claim (unless `claimed` is the claim already
    made, `claim_at_once`) -> prepare -> execute -> finalize; returns what happened (for
    the task's log line). `priority` is the one the run was taken from the run queue at
    (None for a message naming the run). A lost lease or stream skips finalize; a shutdown
    or a service failure hands the run back instead."""
    if claimed is None and await over_fair_share(rt, run_id, priority):
        return AttemptResult(AttemptOutcome.PUT_BACK)
    attempt = await claim(rt, run_id, claimed)
    if attempt is None:
        return AttemptResult(AttemptOutcome.NOT_CLAIMED)
    metrics.run_started()
    n = attempt.run.attempt
    logs.bind(thread_id=attempt.thread_id, run_id=run_id, attempt=n, worker_id=rt.worker_id)
    # The attempt stays held until finalization is over, so a graceful shutdown
    # waits for it and the keeper keeps its lease alive meanwhile.
    rt.keeper.hold(attempt)
    try:
        if attempt.run.cancel_action:
            # A cancel recorded before this attempt (its predecessor died or handed the
            # run back before honouring it): honour it now instead of running the graph.
            open_sink(rt, attempt)
            attempt.cancel(attempt.run.cancel_action)
            outcome = INTERRUPTED
        else:
            outcome = await execute(rt, attempt, await prepare(rt, attempt))
        # Only a cancel that stopped the graph rolls back: one that lost the race with
        # completion leaves the run's outcome as it is (one terminal status, R5).
        if (
            attempt.stop_reason is StopReason.CANCEL_ROLLBACK
            and outcome.status is RunStatus.INTERRUPTED
        ):
            try:
                await restore_pre_run_state(rt, attempt)
            except LeaseLost:
                attempt.stop_reason = StopReason.LEASE_LOST
            except TRANSIENT_ERRORS as exc:
                # The request stays on the run row: the next attempt restores instead.
                return await hand_back(rt, attempt, f"rollback failed: {exc}")
        if attempt.stop_reason is StopReason.LEASE_LOST:
            log.warning("lease lost; skipping finalization", extra={"run_id": run_id})
            return AttemptResult(AttemptOutcome.LEASE_LOST)
        if attempt.stop_reason is StopReason.STREAM_LOST:
            # Like a lost lease: no finalization; the lease expires and the reaper's next
            # attempt re-runs the step whose events were lost (L4, L5, B5).
            log.warning(
                "events could not be published; skipping finalization", extra={"run_id": run_id}
            )
            return AttemptResult(AttemptOutcome.STREAM_LOST)
        if attempt.stop_reason is StopReason.SHUTDOWN:
            return await hand_back(rt, attempt, "worker shutdown")
        if (
            attempt.stop_reason is StopReason.INFRASTRUCTURE
            and attempt.run.attempt < rt.settings.max_attempts
        ):
            return await hand_back(rt, attempt, f"service failure: {outcome.error}")
        return await finalize(rt, attempt, outcome)
    except PERMANENT_ERRORS as exc:  # outside `execute` (a rollback's restore, a state read)
        return await end_failed(rt, attempt, exc)
    except Exception as exc:  # the lease expires and the reaper retries: it names the cause
        await record_failure(rt, attempt, _error_of(exc, rt), permanent=False)
        raise
    finally:
        rt.keeper.release(run_id)


async def end_failed(rt: WorkerRuntime, attempt: RunAttempt, exc: BaseException) -> AttemptResult:
    """End the run `error` with `exc`, which no other attempt can get past (G4); if even
    that fails, record it as the attempt's cause: the reaper then ends the run with it."""
    log.error("run failed: %s", exc, extra={"run_id": attempt.run_id})
    error = _error_of(exc)
    try:
        sink = attempt.sink if attempt.sink is not None else open_sink(rt, attempt)
        sink.emit("error", serde.dumps(error))
        return await finalize(rt, attempt, GraphOutcome(RunStatus.ERROR, error, ThreadStatus.ERROR))
    except Exception:
        await record_failure(rt, attempt, error, permanent=True)
        raise


# --- claim ------------------------------------------------------------------------------------
def claim_at_once(rt: WorkerRuntime, run_id: str) -> Claim | None:
    """The claim, made on the calling thread (the Celery pool thread the task arrived on)
    when the fair-share check cannot put the run back: the loop then gets the claimed run,
    and the claim costs no hop from the loop to a thread and back on the first token's path.
    None when the check has to look (`execute_run` then checks, then claims): the run's
    user already holds its share of this worker's slots. A busy worker looks up the run's
    user here too, so that a run of a user below the share does not wait for the loop
    (measured: seconds behind 30 other runs' work, `python -m bench.cron_load`)."""
    cap = fair_share_cap(rt)
    if len(rt.active) >= cap:
        owner = rt.store.run_owner(run_id)
        try:
            held = sum(1 for a in list(rt.active.values()) if a.run.user_id == owner)
        except RuntimeError:  # the loop changed the attempts while they were counted
            return None
        if owner is None or held >= cap:
            return None
    return rt.store.claim(run_id, rt.worker_id)


async def claim(rt: WorkerRuntime, run_id: str, claimed: Claim | None = None) -> RunAttempt | None:
    """The claim (epoch + 1 in Postgres; made here unless `claimed` is the one
    `claim_at_once` made), then the Redis lease with that epoch (L1, L3); None when the
    run was not claimed or a newer epoch holds the lease."""
    result = claimed
    if result is None:
        result = await asyncio.to_thread(rt.store.claim, run_id, rt.worker_id)
    if result.outcome is not ClaimOutcome.CLAIMED:
        log.info("run not claimed: %s", result.outcome.value, extra={"run_id": run_id})
        return None
    run = result.run
    assert run is not None  # CLAIMED carries the run
    value = lease_value(run.owner_epoch, rt.worker_id)
    # The thread's head is read while the lease is taken (`graph_input` uses it): a read,
    # safe once the claim committed, as the thread's earlier runs have all ended by then.
    head_read = asyncio.ensure_future(rt.state.ahead_tuple(run.thread_id))
    head_read.add_done_callback(_consume_error)  # unawaited if the attempt never runs the graph
    if not await rt.leases.acquire(run_id, run.owner_epoch, rt.worker_id):
        head_read.cancel()
        log.warning("a newer epoch holds the lease", extra={"run_id": run_id})
        return None
    return RunAttempt(run=run, lease=value, head_read=head_read)


def _consume_error(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("a background read or write of the attempt failed", exc_info=fut.exception())


# --- prepare ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Prepared:
    """What `prepare` sets up for `execute`: the attempt's graph, its config and stream
    options, the translation of its stream into events, and what a stop keeps."""

    sink: EventSink
    graph: AbstractAsyncContextManager[Pregel[Any, Any, Any, Any]]
    config: dict[str, Any]
    options: dict[str, Any]
    translator: StreamTranslator
    partials: PartialReplies
    held: HeldWrites | None


async def prepare(rt: WorkerRuntime, attempt: RunAttempt) -> Prepared:
    """Everything the graph runs with: the fenced sink (its `metadata` event first), the
    config (the run's identities, the fence, the stream gate, held writes, the journal),
    the graph bound to a saver and to the run's user (opened by `execute`: a factory is
    called there), and the stream options requested.

    The context is the run's, or `{}` as the official server passes it
    (`payload.get("context") or {}`): LangGraph coerces it into the graph's
    `context_schema`, so a dataclass or pydantic schema's defaults apply to a run that
    sends none (`runtime.context` is never None)."""
    run = attempt.run
    sink = open_sink(rt, attempt)
    await asyncio.sleep(0)  # let the batcher send it before the synchronous set-up below
    config = run_config(run)
    # L2 for checkpoints: the saver writes only while this epoch owns the run; and only
    # once the events emitted before the write are in the stream (B5).
    config["configurable"].update(fence(attempt))
    config["configurable"][GATE_KEY] = stream_gate(attempt, sink)
    # L2 for files: an artifact is written only while the attempt owns its run and its
    # thread exists, turn about with a delete of the thread (shared/agent/tools.py).
    config["configurable"][FILES_FENCE_KEY] = functools.partial(
        rt.store.files_fence,
        attempt.run_id,
        attempt.epoch,
        idle_s=rt.settings.fence_idle_timeout_s,
    )
    held = None
    if rt.settings.held_writes_linger_s > 0:  # a task's writes ride on its step's checkpoint
        held = config["configurable"][HELD_WRITES_KEY] = HeldWrites(
            rt.settings.held_writes_linger_s
        )
    if rt.settings.journal_enabled:
        attempt.journal = RunJournal(
            rt.events,
            run_id=attempt.run_id,
            thread_id=attempt.thread_id,
            flush_size=rt.settings.journal_flush_size,
            snapshot_interval_s=rt.settings.journal_snapshot_interval_s,
        )
        config["callbacks"] = [attempt.journal]
    partials = PartialReplies()  # what a stop keeps (workers/stopped.py)
    config["callbacks"] = [*config.get("callbacks", []), partials]
    context = run.context or {}
    graph = rt.run_graph(run.graph_id, rt.next_slot(), run.user_id, config, context)
    kwargs = run.kwargs  # StreamOptions (shared/vocab.py), as admitted
    requested = kwargs.get("stream_mode") or list(DEFAULT_STREAM_MODES)
    subgraphs = bool(kwargs.get("stream_subgraphs"))
    translator = StreamTranslator(requested, subgraphs=subgraphs)
    write_public_ids(rt, run, translator)  # A4: the events name the thread's public id
    options: dict[str, Any] = {
        "stream_mode": graph_modes(requested),
        "subgraphs": subgraphs,
        "interrupt_before": kwargs.get("interrupt_before"),
        "interrupt_after": kwargs.get("interrupt_after"),
    }
    if kwargs.get("durability"):
        options["durability"] = kwargs["durability"]
    options["context"] = context
    return Prepared(sink, graph, config, options, translator, partials, held)


def fence(attempt: RunAttempt) -> dict[str, str]:
    """configurable keys that fence this attempt's checkpoint writes (L2)."""
    return {RUN_KEY: attempt.run_id, LEASE_KEY: attempt.lease}


def run_config(run: Run) -> dict[str, Any]:
    """The RunnableConfig of the run: request config + identities in configurable/metadata."""
    requested = dict(run.config)
    identities = {
        "thread_id": run.thread_id,
        "run_id": run.run_id,
        "assistant_id": run.assistant_id,
        "graph_id": run.graph_id,
        "user_id": run.user_id,
    }
    # Reserved keys are refused at the API; an assistant stored before that still has them.
    own = without_reserved(requested.get("configurable"))
    configurable = {**own, **identities, "checkpoint_ns": ""}
    user = stored_user(configurable.get("langgraph_auth_user"))
    if user is not None:  # the project's user, with `.identity` and `["identity"]` (authz)
        configurable["langgraph_auth_user"] = user
    if run.kwargs.get("checkpoint_id") and run.attempt == 1:
        configurable["checkpoint_id"] = run.kwargs["checkpoint_id"]
    metadata = {**(requested.get("metadata") or {}), **run.metadata, **identities}
    metadata["attempt"] = run.attempt
    config: dict[str, Any] = {**requested, "configurable": configurable, "metadata": metadata}
    return config


def open_sink(rt: WorkerRuntime, attempt: RunAttempt) -> EventSink:
    """The attempt's fenced event sink; its first event is `metadata` with the attempt (L5)."""
    attempt.sink = EventSink(
        rt.batcher,
        attempt.run_id,
        attempt.lease,
        on_cancel=attempt.cancel,
        on_lost=lambda _exc: attempt.stop(StopReason.LEASE_LOST),
    )
    payload = {"run_id": attempt.run_id, "attempt": attempt.run.attempt}
    attempt.sink.emit("metadata", serde.dumps(payload))
    return attempt.sink


GATE_YIELDS = 3
"""Loop turns the stream gate lets pass before it counts the attempt's events: LangGraph
schedules a finished task's write in the same turn as it wakes our stream consumer, and the
last chunks it queued reach the sink only when the consumer runs."""


def stream_gate(attempt: RunAttempt, sink: EventSink) -> Callable[[], Awaitable[None]]:
    """The gate every fenced checkpoint write of the attempt awaits (B5, shared/state/
    savers.py): the rollback point is recorded (`record_pre_run`, R5) and the events
    emitted so far are in the stream, or the write does not happen
    and the attempt stops without finalizing, so the next one re-runs the step and streams
    it whole. A fenced publish (LeaseLost) already stopped the attempt (`on_lost`)."""

    async def gate() -> None:
        if attempt.pre_run_recorded is not None:
            # shield: a write cancelled meanwhile must not cancel the recording itself
            await asyncio.shield(attempt.pre_run_recorded)
        for _ in range(GATE_YIELDS):
            await asyncio.sleep(0)
        try:
            await sink.flush()
        except LeaseLost:
            raise
        except Exception as exc:
            attempt.stop(StopReason.STREAM_LOST)
            raise EventsUnpublished(
                f"run {attempt.run_id}: events could not be published ({exc}); "
                "the checkpoint is not written"
            ) from exc

    return gate


# --- execute ----------------------------------------------------------------------------------
async def execute(rt: WorkerRuntime, attempt: RunAttempt, prep: Prepared) -> GraphOutcome:
    """Open the attempt's graph (a factory is called and what it returns entered, exited
    when the attempt is over), then `run_graph`; a graph that cannot be loaded or built
    ends the run `error` with that error at once (G4), as any graph failure does."""
    try:
        async with prep.graph as graph:
            return await run_graph(rt, attempt, prep, graph)
    except Exception as exc:  # opening or closing the graph failed: run_graph has the rest
        where = {"run_id": attempt.run_id, "thread_id": attempt.thread_id}
        if isinstance(exc, (GraphConfigError, GraphNotFound)):
            log.error("run failed: %s", exc, extra=where)  # said once at start-up with its spec
        else:
            log.exception("run failed: its graph did not close", extra=where)
        error = _error_of(exc)
        prep.sink.emit("error", serde.dumps(error))
        return GraphOutcome(RunStatus.ERROR, error, ThreadStatus.ERROR)


async def _stream_protocol(
    graph: Pregel[Any, Any, Any, Any],
    inp: Any,
    config: dict[str, Any],
    options: dict[str, Any],
    sink: EventSink,
) -> None:
    """Drive the graph through LangGraph's protocol stream (v3) and publish its events
    (workers/protocol_events.py); v3 owns the stream modes and subgraphs."""
    translator = ProtocolTranslator()
    kwargs = {k: v for k, v in options.items() if k not in ("stream_mode", "subgraphs")}
    stream = await graph.astream_events(
        inp,
        cast(RunnableConfig, config),
        version="v3",
        transformers=list(PROTOCOL_TRANSFORMERS),
        **kwargs,
    )
    async with stream:
        async for event in stream:
            for name, params in translator.events(event):
                sink.emit(name, serde.dumps(params))


async def run_graph(
    rt: WorkerRuntime, attempt: RunAttempt, prep: Prepared, graph: Pregel[Any, Any, Any, Any]
) -> GraphOutcome:
    """Run the graph from this attempt's input (`graph_input`), publishing every chunk;
    returns how it ended."""
    run = attempt.run
    sink, config, options, translator = prep.sink, prep.config, prep.options, prep.translator
    partials = prep.partials
    try:
        inp = await graph_input(rt, attempt, config)

        async def _stream() -> None:
            if run.kwargs.get("protocol_events"):
                await _stream_protocol(graph, inp, config, options, sink)
                return
            if translator.wants_events:
                root = str(uuid.uuid4())  # the root run's id in the callback events
                events = graph.astream_events(
                    inp, cast(RunnableConfig, {**config, "run_id": root}), version="v2", **options
                )
                async for event in events:
                    for name, data in translator.callback_event(event, root):
                        sink.emit(name, serde.dumps(data))
                return
            async for item in graph.astream(inp, cast(RunnableConfig, config), **options):
                for name, data in translator.events(item):
                    sink.emit(name, serde.dumps(data))

        attempt.task = asyncio.create_task(_stream())
        if attempt.stop_reason is not None:
            attempt.task.cancel()
        deadline = asyncio.get_running_loop().call_later(
            time_left(rt, run), attempt.stop, StopReason.TIMEOUT
        )
        try:
            await attempt.task
        finally:
            deadline.cancel()
            if prep.held is not None:  # what no checkpoint took: before anything reads the state
                await prep.held.flush()
    except asyncio.CancelledError:
        if attempt.stop_reason is None:
            raise  # the whole worker is going down
        if attempt.stop_reason is StopReason.TIMEOUT:
            limit = rt.settings.run_timeout_s
            error: JSONObject = {
                "error": "RunTimeout",
                "message": f"the run exceeded the longest run time of {limit:g} s",
            }
            sink.emit("error", serde.dumps(error))
            await keep_stopped_answer(rt, attempt, partials)  # progress kept, the answer too
            return GraphOutcome(RunStatus.TIMEOUT, error, ThreadStatus.IDLE)
        # Interrupted at a safe point; checkpoints written so far are kept (R5). For a
        # lost lease or a shutdown the caller skips this outcome (no finalization).
        if attempt.stop_reason is StopReason.CANCEL_INTERRUPT:
            await keep_stopped_answer(rt, attempt, partials)
        return INTERRUPTED
    except LeaseLost:
        metrics.fenced_write(Sink.CHECKPOINT)
        attempt.stop(StopReason.LEASE_LOST)
        return GraphOutcome(RunStatus.ERROR, None, ThreadStatus.ERROR)
    except EventsUnpublished as exc:  # the gate stopped the attempt (B5)
        log.warning("%s", exc, extra={"run_id": attempt.run_id})
        attempt.stop(StopReason.STREAM_LOST)
        return GraphOutcome(RunStatus.ERROR, None, ThreadStatus.ERROR)
    except TRANSIENT_ERRORS as exc:
        # A service restart is not the graph's fault: hand the run to a new attempt that
        # resumes from the last checkpoint (L5) instead of failing it.
        log.warning(
            "run interrupted by a service failure: %s", exc, extra={"run_id": attempt.run_id}
        )
        attempt.stop_reason = StopReason.INFRASTRUCTURE
        return GraphOutcome(RunStatus.ERROR, _error_of(exc), ThreadStatus.ERROR)
    except Exception as exc:  # every graph failure becomes an `error` event (G4)
        log.exception(
            "run failed", extra={"run_id": attempt.run_id, "thread_id": attempt.thread_id}
        )
        error = _error_of(exc, rt)
        sink.emit("error", serde.dumps(error))
        return GraphOutcome(RunStatus.ERROR, error, ThreadStatus.ERROR)
    thread_status = ThreadStatus.IDLE
    head = None
    try:
        snap = await rt.state.aget_snapshot(attempt.thread_id, run.graph_id)
        if snap.next or snap.interrupts:
            thread_status = ThreadStatus.INTERRUPTED
        head = ThreadHead.of(snap)
    except Exception:  # the run succeeded; the thread status is a hint
        log.exception("could not read final state", extra={"run_id": attempt.run_id})
    return GraphOutcome(RunStatus.SUCCESS, None, thread_status, head)


async def graph_input(rt: WorkerRuntime, attempt: RunAttempt, config: dict[str, Any]) -> Any:
    """The input of this attempt: the request's, or None to resume from the checkpoint (L5).

    The first attempt that gets here records the pre-run rollback point (R5) before the
    graph writes anything: the head checkpoint's id ('' for a thread with none yet) and a
    copy of its pending writes. A later attempt that finds the head moved past that
    point resumes from the head. The head read here is handed to the graph's own first
    read under `HEAD_KEY` (one query and decode less before the first token).
    """
    run = attempt.run
    if attempt.head_read is not None:
        head = await attempt.head_read
    else:
        head = await rt.state.ahead_tuple(attempt.thread_id)
    config["configurable"][HEAD_KEY] = ReadHead(head)  # the graph's first read (savers.py)
    if run.pre_run_checkpoint_id is None:
        head_id, writes = rt.state.rollback_point(head)
        record_pre_run(rt, attempt, head_id or "", writes)
        attempt.run = dataclasses.replace(
            run, pre_run_checkpoint_id=head_id or "", pre_run_writes=writes
        )
    elif (str(head.checkpoint["id"]) if head else "") != run.pre_run_checkpoint_id:
        return None  # a previous attempt checkpointed progress: resume from it
    if run.command:
        return Command(**run.command)
    return run.input


def record_pre_run(
    rt: WorkerRuntime, attempt: RunAttempt, head_id: str, writes: list[list[str]]
) -> None:
    """Record the rollback point (R5) while the graph starts, off the first token's path:
    every fenced checkpoint write of the attempt awaits it first (`stream_gate`), so it is
    committed before the graph writes anything, as the next attempt and a rollback need.
    A failure reaches the graph through that write (a service failure: hand back, L5)."""
    task = asyncio.ensure_future(
        asyncio.to_thread(
            rt.store.set_pre_run_checkpoint, attempt.run_id, attempt.epoch, head_id, writes
        )
    )
    task.add_done_callback(_consume_error)  # awaited by the gate; may end unawaited
    attempt.pre_run_recorded = task


def time_left(rt: WorkerRuntime, run: Run) -> float:
    """Seconds the run may still execute under `run_timeout_s`, counted from its first
    start across attempts (0 when it is already over: it stops at its first safe point)."""
    started = run.started_at or dt.datetime.now(dt.UTC)
    elapsed = (dt.datetime.now(dt.UTC) - started).total_seconds()
    return max(0.0, rt.settings.run_timeout_s - elapsed)


def _error_of(exc: BaseException, rt: WorkerRuntime | None = None) -> JSONObject:
    """The run's `error` record of an exception (its type and a bounded message); a failed
    provider call gets the typed `ModelCallError` record (shared/agent/providers.py)."""
    if rt is not None:
        s = rt.settings
        described = describe_model_error(exc, max_retries=s.model_max_retries, model=s.model)
        if described is not None:
            return described
    return {"error": type(exc).__name__, "message": str(exc)[:2000]}


async def keep_stopped_answer(
    rt: WorkerRuntime, attempt: RunAttempt, partials: PartialReplies
) -> None:
    """A stop keeps the answer streamed so far (workers/stopped.py), fenced like every
    checkpoint write of the attempt; a fenced write means a newer owner: lease lost."""
    message = partials.partial()
    if message is None:
        return
    try:
        await rt.state.acommit_as_node(
            attempt.thread_id,
            attempt.run.graph_id,
            {"messages": [message]},
            as_node=MODEL_NODE,
            configurable=fence(attempt),
        )
    except LeaseLost:
        metrics.fenced_write(Sink.CHECKPOINT)
        attempt.stop_reason = StopReason.LEASE_LOST
    except Exception:  # the stop itself succeeded; only the partial answer is lost
        log.exception("keeping the stopped answer failed", extra={"run_id": attempt.run_id})


# --- after execute: the rollback before finalize (R5), or a hand-back instead -----------------
async def restore_pre_run_state(rt: WorkerRuntime, attempt: RunAttempt) -> None:
    """R5 rollback: the pre-run state becomes the thread's new head checkpoint.

    Runs before the terminal status, so the run stays `running` — and no later run of
    the thread can be claimed — until the restore is committed (the finalizing barrier).
    Fenced like every checkpoint write of the attempt.
    """
    pre = attempt.run.pre_run_checkpoint_id
    if pre is None:
        return  # the graph never started: nothing to undo
    if attempt.pre_run_recorded is not None:  # like every write of the attempt (stream_gate)
        await asyncio.shield(attempt.pre_run_recorded)
    restored = await rt.state.arollback(
        attempt.thread_id,
        attempt.run.graph_id,
        pre or None,
        pending_writes=rt.state.load_writes(attempt.run.pre_run_writes or []),
        configurable=fence(attempt),
        metadata={"threadrun_rollback_of": attempt.run_id, "threadrun_restored_from": pre},
    )
    log.info(
        "pre-run state restored",
        extra={"run_id": attempt.run_id, "checkpoint_id": restored, "restored_from": pre},
    )


async def hand_back(rt: WorkerRuntime, attempt: RunAttempt, reason: str) -> AttemptResult:
    """Give the run back as pending for another attempt to resume (R7 shutdown, a service
    failure). If even that cannot be written, the lease is left to expire and the reaper
    re-queues the run (L4)."""
    if attempt.journal is not None:
        try:
            await attempt.journal.flush()
        except Exception:  # the journal fails open
            log.exception("journal flush before hand-back failed", extra={"run_id": attempt.run_id})
    if attempt.sink is not None:
        try:
            await attempt.sink.drain()
        except Exception:
            log.exception("drain before hand-back failed", extra={"run_id": attempt.run_id})
    try:
        requeued = await asyncio.to_thread(rt.store.requeue, attempt.run_id, attempt.epoch, reason)
    except TRANSIENT_ERRORS:
        log.warning("hand-back failed; the lease will expire", extra={"run_id": attempt.run_id})
        return AttemptResult(AttemptOutcome.HAND_BACK_DEFERRED)
    await rt.leases.release(attempt.run_id, attempt.lease)
    if not requeued:  # the requeue is fenced on our epoch like the terminal status
        return AttemptResult(AttemptOutcome.FENCED, fenced=Sink.STATUS)
    await asyncio.to_thread(rt.dispatcher.dispatch_quietly, attempt.run_id)
    return AttemptResult(AttemptOutcome.HANDED_BACK)


# --- finalize (J5) ----------------------------------------------------------------------------
async def finalize(rt: WorkerRuntime, attempt: RunAttempt, outcome: GraphOutcome) -> AttemptResult:
    """J5, in order: flush the journal -> delivery receipt -> terminal status (fenced) -> `end`."""
    sink = attempt.sink
    assert sink is not None  # opened before the graph ran or the cancel was honoured
    # (1) journal flush (fails open) and (2) the idempotent, fenced delivery receipt.
    try:
        settled, usage = await settle_journal(rt, attempt, outcome)
    except LeaseLost:
        metrics.fenced_write(Sink.RECEIPT)
        log.warning("receipt fenced: a newer owner exists", extra={"run_id": attempt.run_id})
        return AttemptResult(AttemptOutcome.FENCED, fenced=Sink.RECEIPT)
    if settled.status is not outcome.status:
        sink.emit("error", serde.dumps(settled.error))  # G4: the client learns why
    # The stream is drained before the terminal status, so every event precedes it.
    try:
        await sink.drain()
    except LeaseLost:  # the publisher counted the fenced write
        return AttemptResult(AttemptOutcome.FENCED, fenced=Sink.STREAM)
    except Exception:  # the stream is not durable history (B8); go on: the events dropped
        # get a `lost` marker before the `end` (a gap for readers, B5; publish_end below)
        log.exception("stream drain failed", extra={"run_id": attempt.run_id})
    # (3) terminal status, fenced by the epoch (L2), with the thread's head copy.
    also = await head_copy_writer(rt, attempt, outcome)
    fin = await finish_once(
        rt,
        attempt,
        functools.partial(
            rt.store.finish,
            attempt.run_id,
            attempt.thread_id,
            attempt.epoch,
            status=settled.status,
            error=settled.error,
            thread_status=settled.thread_status,
            usage=usage,
            also=also,
        ),
    )
    if fin.fenced:
        log.warning("terminal write fenced: a newer owner exists", extra={"run_id": attempt.run_id})
        metrics.fenced_write(Sink.STATUS)
        return AttemptResult(AttemptOutcome.FENCED, fenced=Sink.STATUS)
    metrics.run_finished(settled.status, time.monotonic() - attempt.started, usage)
    await release_active(rt, run_subject(attempt.run.user_id, attempt.run.config), attempt.run_id)
    if fin.next_run_id:
        await asyncio.to_thread(rt.dispatcher.dispatch_quietly, fin.next_run_id)
    if attempt.run.webhook:  # right after the terminal commit (the sweep backs it)
        await asyncio.to_thread(rt.dispatcher.dispatch_webhook, attempt.run_id)
    if attempt.run.deletes_thread:
        await keep_result(rt, attempt, settled)
    # (4) `end`, after the status is committed (A1: no stream closes before that).
    end: JSONObject = {"run_id": attempt.run_id, "status": settled.status}
    if attempt.run.kwargs.get("protocol_events"):
        # How the run left its thread (an interrupt waits for input), which the thread
        # streaming protocol tells at the run's end, whenever it is read (its runs only:
        # the REST API's `end` keeps the shape it has always had).
        end["thread_status"] = settled.thread_status
    await publish_end(rt, attempt, sink, serde.dumps(end))
    await count_finished(rt, rt.worker_id, settled.status)  # the ops view's, after the end
    try:
        await rt.leases.release(attempt.run_id, attempt.lease, ended=True)
    except redis.RedisError:  # both expire by themselves
        log.warning("could not release the lease", extra={"run_id": attempt.run_id})
    if attempt.run.deletes_thread:
        await delete_temporary_thread(rt, attempt)
    return AttemptResult(AttemptOutcome.FINISHED, status=settled.status)
