"""What one run attempt on this worker is, why it can stop, and how it can end.

The executor runs an attempt through its phases (workers/executor.py); the lease keeper
(workers/lease_keeper.py) stops it when its lease is lost and relays cancel requests to
it; the runtime holds the attempts in flight and the shutdown stops them
(workers/tasks.py). They all need these types, and none of them may import the executor
(it imports the runtime), so the types live here, below all four.

The configurable keys that fence an attempt's checkpoint writes (L2) are built by the
executor (`executor.fence`): they are the savers' contract, and the executor is the one
worker module besides the runtime that may import the savers (S5, tests/unit/
test_state_boundary.py).
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
import redis

from shared.agent.graphs import GraphConfigError, GraphNotFound
from shared.bridge.publisher import EventSink
from shared.journal import RunJournal
from shared.runs.model import CancelAction, JSONObject, Run, RunStatus, Sink, ThreadStatus
from shared.state.accessor import ThreadHead


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

PERMANENT_ERRORS = (GraphNotFound, GraphConfigError)
"""Failures no other attempt can get past: the graph is not served by this deployment, or
it cannot be imported or built. The run ends `error` with it at once, never retried."""


def attempt_cause(error: JSONObject, *, permanent: bool) -> JSONObject:
    """What an attempt that failed without ending its run records (its error record, and
    whether another attempt could succeed), for the reaper's final error."""
    return {"error": error.get("error"), "message": error.get("message"), "permanent": permanent}


def reaped_error(
    *, attempt: int, max_attempts: int, owner: str | None, cause: JSONObject | None
) -> JSONObject:
    """The error of a run the reaper ends: its last attempt's recorded cause when it had
    one that no retry gets past (that error as it is), else `MaxAttemptsExceeded` naming
    what ended the last attempt: its recorded cause, or the loss of its worker."""
    if cause is not None and cause.get("permanent"):
        return {"error": cause.get("error"), "message": cause.get("message")}
    who = f"worker {owner}" if owner else "its worker"
    if cause is not None:
        last = f"{cause.get('error')}: {cause.get('message')}"
        message = f"attempt {attempt} of {max_attempts} failed with {last}"
        return {"error": "MaxAttemptsExceeded", "message": message, "cause": dict(cause)}
    message = (
        f"owner lease expired after attempt {attempt} of {max_attempts}: {who} stopped "
        "renewing it (it died, froze or lost Redis)"
    )
    return {"error": "MaxAttemptsExceeded", "message": message}


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
