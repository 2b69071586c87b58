"""`RunManager`: admission, dispatch after commit, and cancel requests (R2-R5)."""

from __future__ import annotations

import logging
import uuid
from typing import Protocol

import redis

from shared.assistants.model import Assistant
from shared.errors import ThreadBusy
from shared.redis_keys import CANCEL_TTL_S, Keys
from shared.runs.admission import AdmissionOutcome, CancelOutcome
from shared.runs.model import CancelAction, MultitaskStrategy, Run, RunRequest
from shared.runs.store import RunStore
from shared.taskqueue import Dispatcher

log = logging.getLogger(__name__)


class AssistantResolver(Protocol):
    """Finds the assistant a run runs on (`shared.assistants.manager.AssistantManager`)."""

    def resolve(self, owner: str, id_or_graph: str) -> Assistant:
        """The caller's or a system assistant (a graph name names its system assistant);
        AssistantNotFound (404) for anything else, another user's assistant included."""
        ...


class RunManager:
    """Decisions about runs; the edges (HTTP, WebSocket) call this, never the store."""

    def __init__(
        self,
        store: RunStore,
        dispatcher: Dispatcher,
        client: redis.Redis,
        keys: Keys,
        *,
        assistants: AssistantResolver | None = None,
        default_strategy: MultitaskStrategy = MultitaskStrategy.ENQUEUE,
    ) -> None:
        self.store = store
        self._dispatcher = dispatcher
        self._redis = client
        self._keys = keys
        self._assistants = assistants
        self._default_strategy = default_strategy

    def resolve_assistant(self, owner: str, request: RunRequest) -> tuple[RunRequest, str]:
        """The request on its assistant (the assistant's id, its current version's config
        and context under the run's own) and the graph id it runs; 404 for an assistant
        the caller cannot see."""
        if self._assistants is None:
            raise RuntimeError("this RunManager was built without assistants")
        assistant = self._assistants.resolve(owner, request.assistant_id)
        return assistant.apply_to(request), assistant.graph_id

    def admit(self, owner: str, request: RunRequest) -> Run:
        """Create a run atomically (R2), then dispatch it after commit (R4)."""
        strategy = request.multitask_strategy or self._default_strategy
        request, graph_id = self.resolve_assistant(owner, request)
        admission = self.store.admit(
            request,
            run_id=str(uuid.uuid4()),
            owner=owner,
            graph_id=graph_id,
            strategy=strategy,
        )
        if admission.decision.outcome is AdmissionOutcome.REJECTED:
            raise ThreadBusy(
                f"thread {request.thread_id} already has a run in progress"
                " (multitask_strategy=reject)"
            )
        for victim in admission.cancel_running:
            self._signal_cancel(victim, admission.cancel_action)
        for run_id in admission.dispatch:
            self._dispatcher.dispatch_quietly(run_id)
        run = admission.run
        assert run is not None  # created: every outcome but REJECTED
        log.info(
            "run admitted",
            extra={
                "thread_id": run.thread_id,
                "run_id": run.run_id,
                "outcome": admission.decision.outcome.value,
            },
        )
        return run

    def cancel(
        self, *, owner: str, thread_id: str, run_id: str, action: CancelAction
    ) -> CancelOutcome:
        """Ask a run to stop (R5): pending runs stop at once; running ones at the next safe point."""
        outcome, next_run = self.store.request_cancel(thread_id, run_id, owner, action)
        if outcome in (CancelOutcome.REQUESTED, CancelOutcome.ALREADY_REQUESTED):
            self._signal_cancel(run_id, action)
        if next_run:
            self._dispatcher.dispatch_quietly(next_run)
        return outcome

    def delete_thread(self, *, owner: str, thread_id: str) -> None:
        """Delete a thread and its runs; runs still executing are told to stop."""
        for run_id in self.store.delete_thread(thread_id, owner):
            self._signal_cancel(run_id, CancelAction.INTERRUPT)

    def is_terminal(self, run_id: str) -> bool:
        """Whether the run has a committed terminal status (or no longer exists)."""
        status = self.store.run_status(run_id)
        return status is None or status.terminal

    def _signal_cancel(self, run_id: str, action: CancelAction) -> None:
        # The row already records the request (durable); this key is how the owner,
        # on whatever worker, learns of it within one publish or poll.
        self._redis.set(self._keys.cancel(run_id), action.value, ex=CANCEL_TTL_S)
