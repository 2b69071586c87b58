"""One run attempt as named phases: claim -> prepare -> execute -> finalize.

Invariants (SPEC L1, L2, J5):
- nothing is published or finalized before the claim succeeded in Postgres (epoch+1)
  and the Redis lease carries that epoch;
- every publish is fenced by the lease (Lua), the terminal status by the epoch (SQL);
- a worker that lost its lease stops at the next safe point and finalizes nothing;
- finalize order: flush journal -> delivery receipt -> terminal status -> `end`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import psycopg
import redis
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command

from shared import logs, metrics, serde, workspaces
from shared.agent.providers import describe_model_error
from shared.bridge.publisher import EventSink
from shared.errors import EventsUnpublished, LeaseLost
from shared.journal import RunJournal, settle_delivery, write_delivery_receipt
from shared.leases import RenewOutcome, lease_value
from shared.redis_keys import ENDED_RUN_TTL_MS, LimitKeys
from shared.runs import temporary
from shared.runs.model import CancelAction, JSONObject, Run, RunStatus, Sink, ThreadStatus
from shared.runs.reserved import without_reserved
from shared.runs.result import final_result
from shared.runs.store import Claim, ClaimOutcome, Finish
from shared.state import head_copies
from shared.state.accessor import ThreadHead
from shared.state.held_writes import HeldWrites
from shared.state.savers import GATE_KEY, HEAD_KEY, HELD_WRITES_KEY, LEASE_KEY, RUN_KEY, ReadHead
from workers.runtime import WorkerRuntime
from workers.stopped import MODEL_NODE, PartialReplies
from workers.stream_modes import StreamTranslator, graph_modes

log = logging.getLogger(__name__)


class StopReason(enum.Enum):
    """Why an attempt stopped before the graph finished."""

    CANCEL_INTERRUPT = "interrupt"
    CANCEL_ROLLBACK = "rollback"  # stop, then restore the pre-run state (R5)
    LEASE_LOST = "lease_lost"
    STREAM_LOST = "stream_lost"  # events could not be published: checkpoints stop (B5)
    SHUTDOWN = "shutdown"
    INFRASTRUCTURE = "infrastructure"  # Postgres or Redis went away under the run
    TIMEOUT = "timeout"  # the run reached `run_timeout_s` (it ends `timeout`)


TRANSIENT_ERRORS = (psycopg.OperationalError, redis.ConnectionError, redis.TimeoutError)
"""Failures of our own services, not of the graph: the run is retried, not failed."""


class AttemptOutcome(enum.StrEnum):
    """How one attempt on this worker ended (the task's log line)."""

    NOT_CLAIMED = "not_claimed"  # duplicate delivery, not the head, or a newer lease (L3)
    FINISHED = "finished"  # the terminal status is committed and `end` published
    LEASE_LOST = "lease_lost"  # a newer owner exists: nothing was finalized
    STREAM_LOST = "stream_lost"  # events unpublished: nothing finalized, the lease expires
    FENCED = "fenced"  # a sink refused a write of this epoch (L2): a newer owner exists
    HANDED_BACK = "handed_back"  # requeued for another attempt (R7, a service failure)
    HAND_BACK_DEFERRED = "hand_back_deferred"  # could not requeue: the lease will expire (L4)
    PUT_BACK = "put_back"  # not claimed: its user holds their share while others wait


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """What `execute_run` reports: the outcome, the run's status, or the sink that refused."""

    outcome: AttemptOutcome
    status: RunStatus | None = None  # FINISHED: the committed terminal status
    fenced: Sink | None = None  # FENCED: which sink refused the write

    def __str__(self) -> str:
        if self.status is not None:
            return f"{self.outcome}: {self.status}"
        if self.fenced is not None:
            return f"{self.outcome}: {self.fenced}"
        return str(self.outcome)


@dataclass(frozen=True, slots=True)
class GraphOutcome:
    """How the graph ended for this attempt: the run's status, its error, the thread's status."""

    status: RunStatus
    error: JSONObject | None = None
    thread_status: ThreadStatus = ThreadStatus.IDLE
    head: ThreadHead | None = None  # the final head, when `execute` read it


INTERRUPTED = GraphOutcome(RunStatus.INTERRUPTED)
"""Stopped at a safe point; checkpoints written so far are kept (R5)."""


@dataclass
class RunAttempt:
    """The state of one attempt of one run on this worker."""

    run: Run
    lease: str
    sink: EventSink | None = None
    journal: RunJournal | None = None
    task: asyncio.Task[None] | None = None
    stop_reason: StopReason | None = None
    started: float = field(default_factory=time.monotonic)
    pre_run_recorded: asyncio.Future[None] | None = None  # see `record_pre_run`
    head_read: asyncio.Future[Any] | None = None  # the head checkpoint, see `claim`

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.run.run_id

    @property
    def thread_id(self) -> str:
        """The run's thread."""
        return self.run.thread_id

    @property
    def epoch(self) -> int:
        """The fencing token of this attempt."""
        return self.run.owner_epoch

    @property
    def fence(self) -> dict[str, str]:
        """configurable keys that fence this attempt's checkpoint writes (L2)."""
        return {RUN_KEY: self.run_id, LEASE_KEY: self.lease}

    def cancel(self, action: str) -> None:
        """A cancel request (R5) reached this attempt (`action` as stored or signalled)."""
        rollback = action == CancelAction.ROLLBACK
        self.stop(StopReason.CANCEL_ROLLBACK if rollback else StopReason.CANCEL_INTERRUPT)

    def stop(self, reason: StopReason) -> None:
        """Ask the graph task to stop at its next await (a safe point)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            if self.task is not None and not self.task.done():
                self.task.cancel()


def claim_at_once(rt: WorkerRuntime, run_id: str) -> Claim | None:
    """The claim, made on the calling thread (the Celery pool thread the task arrived on)
    when the fair-share check cannot put the run back: the loop then gets the claimed run,
    and the claim costs no hop from the loop to a thread and back on the first token's path.
    None when the check has to look (`execute_run` then checks, then claims)."""
    if len(rt.active) >= _fair_share_cap(rt):
        return None
    return rt.store.claim(run_id, rt.worker_id)


async def execute_run(
    rt: WorkerRuntime, run_id: str, claimed: Claim | None = None
) -> AttemptResult:
    """Claim (unless `claimed` is the claim already made, `claim_at_once`) and execute one
    run; returns what happened (for the task's log line)."""
    if claimed is None:
        if await over_fair_share(rt, run_id):
            return AttemptResult(AttemptOutcome.PUT_BACK)
        claimed = await asyncio.to_thread(rt.store.claim, run_id, rt.worker_id)
    attempt = await take_lease(rt, run_id, claimed)
    if attempt is None:
        return AttemptResult(AttemptOutcome.NOT_CLAIMED)
    metrics.run_started()
    n = attempt.run.attempt
    logs.bind(thread_id=attempt.thread_id, run_id=run_id, attempt=n, worker_id=rt.worker_id)
    # The attempt stays registered until finalization is over, so a graceful shutdown
    # waits for it and the keeper keeps its lease alive meanwhile.
    rt.active[run_id] = attempt
    ensure_lease_keeper(rt)
    try:
        if attempt.run.cancel_action:
            # A cancel recorded before this attempt (its predecessor died or handed the
            # run back before honouring it): honour it now instead of running the graph.
            open_sink(rt, attempt)
            attempt.cancel(attempt.run.cancel_action)
            outcome = INTERRUPTED
        else:
            outcome = await execute(rt, attempt)
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
    finally:
        rt.active.pop(run_id, None)


# --- fairness --------------------------------------------------------------------------------
async def over_fair_share(rt: WorkerRuntime, run_id: str) -> bool:
    """Whether to put the run back unclaimed: its user's runs hold `worker_user_share` of
    this worker's slots while another user, below that share here, has a run waiting. It
    is offered again after `fair_share_retry_s` (a countdown, so the freed slot goes to
    the waiting user's run first). Cheap when the worker is not that full: no query.

    Only users below the share count as waiting: two users at their share each leave the
    other slots to either of them rather than putting each other back for ever.
    """
    s = rt.settings
    cap = _fair_share_cap(rt)
    if len(rt.active) < cap:
        return False
    owner = await asyncio.to_thread(rt.store.run_owner, run_id)
    if owner is None:
        return False  # gone or not runnable: let claim say so
    held: dict[str | None, int] = {}
    for other in rt.active.values():
        held[other.run.user_id] = held.get(other.run.user_id, 0) + 1
    if held.get(owner, 0) < cap:
        return False
    waiting = await asyncio.to_thread(rt.store.waiting_owners, owner)
    if not any(held.get(user, 0) < cap for user in waiting):
        return False
    log.info("run put back: its user holds their share", extra={"run_id": run_id})
    await asyncio.to_thread(rt.dispatcher.dispatch_later, run_id, s.fair_share_retry_s)
    return True


def _fair_share_cap(rt: WorkerRuntime) -> int:
    """How many of this worker's slots one user's runs may hold while others wait."""
    s = rt.settings
    return max(1, int(s.worker_user_share * s.worker_concurrency))


# --- claim ---------------------------------------------------------------------------------
async def take_lease(rt: WorkerRuntime, run_id: str, result: Claim) -> RunAttempt | None:
    """After the claim (epoch + 1 in Postgres), the Redis lease with that epoch (L1, L3);
    None when the run was not claimed or a newer epoch holds the lease."""
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


_keepers: dict[int, asyncio.Task[None]] = {}


def ensure_lease_keeper(rt: WorkerRuntime) -> None:
    """Start the process-wide lease keeper on this loop if it is not running."""
    task = _keepers.get(id(rt))
    if task is None or task.done():
        _keepers[id(rt)] = asyncio.get_running_loop().create_task(keep_leases(rt))


async def keep_leases(rt: WorkerRuntime) -> None:
    """Renew every owned lease (compare-and-extend, one round trip) and relay cancel requests.

    The tick is the shorter of the cancel poll and the renew interval, so a cancel
    reaches an idle run (one waiting on a slow tool) within `cancel_poll_s`, and the
    lease is extended long before its TTL runs out.
    """
    s = rt.settings
    tick = min(s.cancel_poll_s, s.lease_renew_s)
    last_ok: dict[str, float] = {}
    while True:
        await asyncio.sleep(tick)
        attempts = list(rt.active.values())
        # What each sink was answered for before the renewal is sent: the stream has at
        # least that much unless a failover lost it (then the sink repairs its tail, B5).
        acked = [a.sink.acked_seq if a.sink is not None else 0 for a in attempts]
        now = time.monotonic()
        try:
            results = await rt.leases.renew_many(
                [(a.run_id, a.lease) for a in attempts], stream_seq=True
            )
        except Exception as exc:  # noqa: BLE001 - Redis hiccup: keep trying until a TTL runs out
            for a in attempts:
                if now - last_ok.get(a.run_id, a.started) > s.lease_ttl_s:
                    log.warning(
                        "lease renewal failing past its TTL: %s", exc, extra={"run_id": a.run_id}
                    )
                    a.stop(StopReason.LEASE_LOST)
            continue
        for a, was_acked, (outcome, cancel, stream_seq) in zip(
            attempts, acked, results, strict=True
        ):
            if outcome is RenewOutcome.LOST:
                a.stop(StopReason.LEASE_LOST)
                continue
            if a.sink is not None and stream_seq < was_acked:
                a.sink.check_tail()
            last_ok[a.run_id] = now
            if cancel:
                a.cancel(cancel)
        for run_id in set(last_ok) - {a.run_id for a in attempts}:
            del last_ok[run_id]


# --- prepare ---------------------------------------------------------------------------------
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
    if run.kwargs.get("checkpoint_id") and run.attempt == 1:
        configurable["checkpoint_id"] = run.kwargs["checkpoint_id"]
    metadata = {**(requested.get("metadata") or {}), **run.metadata, **identities}
    metadata["attempt"] = run.attempt
    config: dict[str, Any] = {**requested, "configurable": configurable, "metadata": metadata}
    return config


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


def _consume_error(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("a background read or write of the attempt failed", exc_info=fut.exception())


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
        configurable=attempt.fence,
        metadata={"threadrun_rollback_of": attempt.run_id, "threadrun_restored_from": pre},
    )
    log.info(
        "pre-run state restored",
        extra={"run_id": attempt.run_id, "checkpoint_id": restored, "restored_from": pre},
    )


# --- execute ---------------------------------------------------------------------------------
async def execute(rt: WorkerRuntime, attempt: RunAttempt) -> GraphOutcome:
    """Run the graph, publishing every chunk; returns how it ended."""
    run = attempt.run
    sink = open_sink(rt, attempt)
    await asyncio.sleep(0)  # let the batcher send it before the synchronous set-up below
    config = run_config(run)
    # L2 for checkpoints: the saver writes only while this epoch owns the run; and only
    # once the events emitted before the write are in the stream (B5).
    config["configurable"].update(attempt.fence)
    config["configurable"][GATE_KEY] = stream_gate(attempt, sink)
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
    graph = rt.run_graph(run.graph_id, rt.next_slot(), run.user_id)
    kwargs = run.kwargs
    requested: list[str] = kwargs.get("stream_mode") or ["values"]
    subgraphs = bool(kwargs.get("stream_subgraphs"))
    translator = StreamTranslator(requested, subgraphs=subgraphs)
    try:
        inp = await graph_input(rt, attempt, config)
        options: dict[str, Any] = {
            "stream_mode": graph_modes(requested),
            "subgraphs": subgraphs,
            "interrupt_before": kwargs.get("interrupt_before"),
            "interrupt_after": kwargs.get("interrupt_after"),
        }
        if kwargs.get("durability"):
            options["durability"] = kwargs["durability"]
        if run.context is not None:
            options["context"] = run.context

        async def _stream() -> None:
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
            if held is not None:  # what no checkpoint took: before anything reads the state
                await held.flush()
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
            configurable=attempt.fence,
        )
    except LeaseLost:
        metrics.fenced_write(Sink.CHECKPOINT)
        attempt.stop_reason = StopReason.LEASE_LOST
    except Exception:  # the stop itself succeeded; only the partial answer is lost
        log.exception("keeping the stopped answer failed", extra={"run_id": attempt.run_id})


# --- finalize (J5) ------------------------------------------------------------------------------
async def release_active(rt: WorkerRuntime, user_id: str | None, run_id: str) -> None:
    """The run ended: it no longer counts against its user's `max_active_runs` (A4).
    Best effort; the limiter prunes ended members when a set is full."""
    if user_id is None:
        return
    keys = LimitKeys(rt.keys.prefix)
    try:
        await rt.release_run(
            keys=[keys.active(user_id), keys.ended(user_id)], args=[ENDED_RUN_TTL_MS, run_id]
        )
    except redis.RedisError:
        log.warning("could not release the active-run slot", extra={"run_id": run_id})


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
    await release_active(rt, attempt.run.user_id, attempt.run_id)
    if fin.next_run_id:
        await asyncio.to_thread(rt.dispatcher.dispatch_quietly, fin.next_run_id)
    if attempt.run.webhook:  # right after the terminal commit (the sweep backs it)
        await asyncio.to_thread(rt.dispatcher.dispatch_webhook, attempt.run_id)
    if attempt.run.deletes_thread:
        await keep_result(rt, attempt, settled)
    # (4) `end`, after the status is committed (A1: no stream closes before that).
    end = {"run_id": attempt.run_id, "status": settled.status}
    await publish_end(rt, attempt, sink, serde.dumps(end))
    try:
        await rt.leases.release(attempt.run_id, attempt.lease, ended=True)
    except redis.RedisError:  # both expire by themselves
        log.warning("could not release the lease", extra={"run_id": attempt.run_id})
    if attempt.run.deletes_thread:
        await delete_temporary_thread(rt, attempt)
    return AttemptResult(AttemptOutcome.FINISHED, status=settled.status)


END_RETRY_MAX_DELAY_S = 5.0
"""Longest wait between two tries of a run's `end` while Redis is unreachable."""


async def publish_end(rt: WorkerRuntime, attempt: RunAttempt, sink: EventSink, data: bytes) -> bool:
    """Publish the run's `end` once Redis takes it (B7); False if it never did.

    The terminal status is committed: a stream without its `end` would leave its readers
    waiting until they give up with a gap, and every later reader too. So a publish that
    failed (Redis unreachable past the publisher's retries) is tried again until
    `stream_ttl_after_end_s` has passed; one that was fenced means the lease lapsed while
    Redis was unreachable. It is taken back for the same epoch, which is safe: the run is
    terminal under that epoch, so no newer owner can exist (a claim needs a run that is not
    terminal, L2). Never two `end`s: a retry numbers `end` as the first try did, and the
    publish script skips what it already added (shared/lua/publish.lua).
    """
    ids = {"run_id": attempt.run_id}
    deadline = time.monotonic() + rt.settings.stream_ttl_after_end_s
    delay = 0.5
    while True:
        fenced = False
        try:
            await sink.publish_end(data)
            return True
        except LeaseLost:
            fenced = True
        except Exception as exc:  # noqa: BLE001 - Redis unreachable: tried again below
            log.warning("publishing end failed: %s; retrying", exc, extra=ids)
        if time.monotonic() + delay > deadline:
            log.error("the run's end could not be published; readers get a gap", extra=ids)
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, END_RETRY_MAX_DELAY_S)
        if fenced:
            try:
                retaken = await rt.leases.acquire(attempt.run_id, attempt.epoch, rt.worker_id)
            except redis.RedisError:
                continue  # the next try fails again and comes back here
            if not retaken:  # a higher epoch: never publish past it
                log.error("a newer lease holds the ended run; no end published", extra=ids)
                return False
            log.warning("lease taken back to publish the end of the ended run", extra=ids)
        sink.rearm()


async def finish_once(
    rt: WorkerRuntime, attempt: RunAttempt, finish: Callable[[], Finish]
) -> Finish:
    """The fenced terminal write, through a PostgreSQL restart: a connection lost at the
    commit leaves it unknown whether the status was written. Retried while our lease
    lives (the write is fenced on our epoch and `running`, so a retry never writes twice);
    before each retry the row says whether the lost commit landed, in which case the run
    is ours to end (its `end` must still be published, or its streams end with a gap)."""
    deadline = time.monotonic() + rt.settings.lease_ttl_s
    delay = 0.2
    while True:
        try:
            return await asyncio.to_thread(finish)
        except TRANSIENT_ERRORS as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning(
                "terminal write failed, retrying: %s", exc, extra={"run_id": attempt.run_id}
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
        try:
            run = await asyncio.to_thread(rt.store.get_run_by_id, attempt.run_id)
        except TRANSIENT_ERRORS:
            continue
        if run is not None and run.terminal and run.owner_epoch == attempt.epoch:
            return Finish(fenced=False)  # it landed; a next run waits for the reaper (R4)


async def head_copy_writer(
    rt: WorkerRuntime, attempt: RunAttempt, outcome: GraphOutcome
) -> functools.partial[None] | None:
    """The write of the thread's head copy (the `values` and `interrupts` of thread objects,
    `shared.state.head_copies`) for the terminal transaction, where the epoch fences it.

    The head is final here: the graph has stopped, a rollback is done, and no other run
    of the thread or state update can start while this one is `running`. None when it
    cannot be read (reads then compute it from the checkpoint) or the thread is deleted
    with its run.
    """
    if attempt.run.deletes_thread:
        return None
    head = outcome.head
    if head is None:
        try:
            head = await rt.state.ahead(attempt.thread_id, attempt.run.graph_id)
        except Exception:  # a cache: the run finalizes without it
            log.exception("could not read the final head", extra={"run_id": attempt.run_id})
            return None
    if head is None or head.checkpoint_id is None:
        return None
    return functools.partial(
        head_copies.write_fenced,
        heads=[(attempt.thread_id, head)],
        max_bytes=rt.settings.thread_values_max_bytes,
    )


async def keep_result(rt: WorkerRuntime, attempt: RunAttempt, settled: GraphOutcome) -> None:
    """Store what `/wait` answers beside the stream, before `end`: the thread (and the
    checkpoints the answer is read from) is deleted right after the end."""
    try:
        values: Any = None
        interrupts: list[Any] = []
        if settled.status is not RunStatus.ERROR:
            snap = await rt.state.aget_snapshot(attempt.thread_id, attempt.run.graph_id)
            values = serde.to_jsonable(snap.values)
            interrupts = [serde.to_jsonable(i) for i in snap.interrupts]
        result = final_result(settled.status, settled.error, values, interrupts)
        ttl = rt.settings.stream_ttl_after_end_s
        await rt.redis.set(rt.keys.result(attempt.run_id), serde.dumps(result), ex=ttl)
    except Exception:  # the waiting client reads the thread instead, within the grace
        log.exception("storing the run's result failed", extra={"run_id": attempt.run_id})


async def delete_temporary_thread(rt: WorkerRuntime, attempt: RunAttempt) -> None:
    """on_completion=delete: the thread goes now that its run ended (if no other run is
    inflight on it); if this fails or the worker dies first, the recovery pass does it."""
    try:
        deleted = await asyncio.to_thread(
            temporary.delete_if_finished, rt.store, attempt.thread_id, rt.settings.workspace_dir
        )
    except Exception:  # the row stays: the recovery pass deletes it after the grace
        log.exception("deleting the temporary thread failed", extra={"run_id": attempt.run_id})
        return
    if deleted:
        log.info("temporary thread deleted", extra={"run_id": attempt.run_id})


async def settle_journal(
    rt: WorkerRuntime, attempt: RunAttempt, outcome: GraphOutcome
) -> tuple[GraphOutcome, JSONObject | None]:
    """J5 (1) flush the journal, failing open; (2) write the delivery receipt.

    Returns the outcome to commit and the run's usage: a success that produced output
    becomes `error` (and its thread `error`) when its receipt cannot be written after
    bounded retries.
    """
    ids = {"run_id": attempt.run_id, "thread_id": attempt.thread_id}
    journal = attempt.journal
    if journal is None:
        return outcome, None
    flushed = True
    try:
        await journal.flush()
    except Exception:  # G3: the journal fails open, finalization goes on
        flushed = False
        log.exception("journal flush failed; finalizing anyway", extra=ids)
    receipt = await asyncio.to_thread(
        write_delivery_receipt,
        rt.events,
        attempt.run_id,
        attempt.thread_id,
        attempt.run.attempt,
        journal.produced_output,
        journal.artifact_paths(),
        workspaces.owner_root(rt.settings.workspace_dir, attempt.run.user_id),
        attempts=rt.settings.delivery_receipt_attempts,
        backoff_s=rt.settings.delivery_receipt_backoff_s,
        epoch=attempt.epoch,  # L2: only the current owner writes the receipt
    )
    status, error = settle_delivery(outcome.status, outcome.error, journal.produced_output, receipt)
    settled = outcome
    if status != outcome.status:
        settled = GraphOutcome(RunStatus(status), error, ThreadStatus.ERROR)
    usage = journal.usage()
    if flushed and attempt.run.attempt > 1:  # a first attempt's journal holds all of it
        try:  # every attempt's usage, not just this one's
            usage = await asyncio.to_thread(rt.events.run_usage, attempt.run_id)
        except Exception:  # the attempt's own figures stand in
            log.exception("run usage query failed", extra=ids)
    return settled, usage


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
