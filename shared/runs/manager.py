"""`RunManager`: admission, dispatch after commit, and cancel requests (R2-R5)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import redis

from shared.errors import ThreadBusy
from shared.redis_keys import CANCEL_TTL_S, Keys
from shared.runs.admission import AdmissionOutcome
from shared.runs.store import TERMINAL, CancelOutcome, RunStore
from shared.taskqueue import Dispatcher

log = logging.getLogger(__name__)


class RunManager:
    """Decisions about runs; the edges (HTTP, WebSocket) call this, never the store."""

    def __init__(
        self, store: RunStore, dispatcher: Dispatcher, client: redis.Redis, keys: Keys
    ) -> None:
        self.store = store
        self._dispatcher = dispatcher
        self._redis = client
        self._keys = keys

    def admit(
        self,
        *,
        owner: str,
        thread_id: str,
        assistant_id: str,
        graph_id: str,
        fields: dict[str, Any],
        strategy: str,
        if_not_exists: str,
    ) -> dict[str, Any]:
        """Create a run atomically (R2), then dispatch it after commit (R4)."""
        run = {
            "run_id": str(uuid.uuid4()),
            "assistant_id": assistant_id,
            "graph_id": graph_id,
            **fields,
        }
        admission = self.store.admit(
            thread_id=thread_id,
            owner=owner,
            run=run,
            strategy=strategy,
            create_thread=if_not_exists == "create",
        )
        if admission.decision.outcome is AdmissionOutcome.REJECTED:
            raise ThreadBusy(
                f"thread {thread_id} already has a run in progress (multitask_strategy=reject)"
            )
        for victim in admission.cancel_running:
            self._signal_cancel(victim, admission.cancel_action)
        for run_id in admission.dispatch:
            self._dispatch(run_id)
        assert admission.run is not None
        log.info(
            "run admitted",
            extra={
                "thread_id": thread_id,
                "run_id": run["run_id"],
                "outcome": admission.decision.outcome.value,
            },
        )
        return admission.run

    def cancel(self, *, owner: str, thread_id: str, run_id: str, action: str) -> CancelOutcome:
        """Ask a run to stop (R5): pending runs stop at once; running ones at the next safe point."""
        outcome, next_run = self.store.request_cancel(thread_id, run_id, owner, action)
        if outcome in (CancelOutcome.REQUESTED, CancelOutcome.ALREADY_REQUESTED):
            self._signal_cancel(run_id, action)
        if next_run:
            self._dispatch(next_run)
        return outcome

    def delete_thread(self, *, owner: str, thread_id: str) -> None:
        """Delete a thread and its runs; runs still executing are told to stop."""
        for run_id in self.store.delete_thread(thread_id, owner):
            self._signal_cancel(run_id, "interrupt")

    def is_terminal(self, run_id: str) -> bool:
        """Whether the run has a committed terminal status (or no longer exists)."""
        status = self.store.run_status(run_id)
        return status is None or status in TERMINAL

    def _signal_cancel(self, run_id: str, action: str) -> None:
        # The row already records the request (durable); this key is how the owner,
        # on whatever worker, learns of it within one publish or poll.
        self._redis.set(self._keys.cancel(run_id), action, ex=CANCEL_TTL_S)

    def _dispatch(self, run_id: str) -> None:
        try:
            self._dispatcher.dispatch_run(run_id)
        except Exception:  # noqa: BLE001 - the reaper re-dispatches (R4)
            log.exception("dispatch failed; the reaper will retry", extra={"run_id": run_id})
