"""`RunManager`: admission, dispatch after commit, and cancel requests (R2-R5)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection, Sequence
from typing import Protocol

import redis

from shared.assistants.model import Assistant
from shared.errors import AssistantNotFound, RunNotFound, ThreadBusy, ValidationFailed
from shared.redis_keys import CANCEL_TTL_S, Keys
from shared.runs.admission import AdmissionOutcome, CancelOutcome
from shared.runs.model import (
    INFLIGHT_STATUSES,
    CancelAction,
    MultitaskStrategy,
    Run,
    RunRequest,
    RunStatus,
)
from shared.runs.store import Admission, AdmitItem, RunStore
from shared.taskqueue import Dispatcher
from shared.webhooks.policy import BadWebhookUrl, EgressPolicy, admission_refusal, parse_url

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
        max_after_s: float = 30 * 86_400,
        webhook_policy: EgressPolicy | None = None,
        webhook_url_max: int = 2048,
    ) -> None:
        self.store = store
        self._dispatcher = dispatcher
        self._redis = client
        self._keys = keys
        self._assistants = assistants
        self._default_strategy = default_strategy
        self._max_after_s = max_after_s
        self._webhook_policy = webhook_policy or EgressPolicy()
        self._webhook_url_max = webhook_url_max

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
        self._check(request)
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
        return self._after_commit(admission)

    def _check(self, request: RunRequest) -> None:
        """Refuse what the schema cannot know: a delay beyond the deployment's limit, a
        webhook URL too long or on a literal IP the egress policy refuses (422)."""
        if request.after_seconds > self._max_after_s:
            raise ValidationFailed(
                f"after_seconds: at most {self._max_after_s:g} seconds", field="after_seconds"
            )
        if request.webhook is not None:
            try:
                url = parse_url(request.webhook, max_length=self._webhook_url_max)
            except BadWebhookUrl as exc:
                raise ValidationFailed(f"webhook: {exc}", field="webhook") from None
            if (reason := admission_refusal(url, self._webhook_policy)) is not None:
                raise ValidationFailed(
                    f"webhook: {url.host} is a {reason} address, refused by the egress policy"
                    " (THREADRUN_WEBHOOK_ALLOW lists the exceptions)",
                    field="webhook",
                )

    def admit_batch(self, owner: str, requests: Sequence[RunRequest]) -> list[Run]:
        """Create several runs all or nothing (one transaction), then dispatch them.

        An unknown assistant, a missing thread or a busy one under `reject` refuses the
        whole batch with the error of the first such item, naming its index.
        """
        items = []
        for index, request in enumerate(requests):
            self._check(request)
            strategy = request.multitask_strategy or self._default_strategy
            try:
                request, graph_id = self.resolve_assistant(owner, request)
            except AssistantNotFound as exc:
                raise AssistantNotFound(f"item {index}: {exc}") from exc
            items.append(AdmitItem(request, str(uuid.uuid4()), graph_id, strategy))
        return [self._after_commit(a) for a in self.store.admit_many(owner, items)]

    def _after_commit(self, admission: Admission) -> Run:
        """Tell the owners of cancelled runs, dispatch what the admission says (R4)."""
        for victim in admission.cancel_running:
            self._signal_cancel(victim, admission.cancel_action)
        for run_id in admission.dispatch:
            self._dispatcher.dispatch_quietly(run_id)
        for run_id in admission.ended:  # pending runs it ended: their webhooks are due
            self._dispatcher.dispatch_webhook(run_id)
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
        elif outcome is CancelOutcome.CANCELLED:  # ended here, not by a worker: its webhook
            self._dispatcher.dispatch_webhook(run_id)
        if next_run:
            self._dispatcher.dispatch_quietly(next_run)
        return outcome

    def cancel_many(
        self,
        *,
        owner: str,
        action: CancelAction,
        statuses: Collection[RunStatus] | None = None,
        thread_id: str | None = None,
        run_ids: Sequence[str] | None = None,
    ) -> dict[str, CancelOutcome]:
        """Cancel the owner's runs in `statuses` (default: pending and running), on
        `thread_id`, among `run_ids`, each exactly as `cancel` does one (R5), newest first;
        RunNotFound when none is inflight (the official server's 404), ThreadNotFound for
        another user's thread."""
        if thread_id is not None:
            self.store.get_thread(thread_id, owner)
        outcomes: dict[str, CancelOutcome] = {}
        selected = self.store.inflight_runs(
            owner, statuses or INFLIGHT_STATUSES, thread_id=thread_id, run_ids=run_ids
        )
        for run in selected:
            try:
                outcomes[run.run_id] = self.cancel(
                    owner=owner, thread_id=run.thread_id, run_id=run.run_id, action=action
                )
            except RunNotFound:
                continue  # its thread was deleted meanwhile: nothing left to cancel
        if not outcomes:
            raise RunNotFound("no pending or running run matches: nothing to cancel")
        return outcomes

    def delete_thread(self, *, owner: str, thread_id: str) -> None:
        """Delete a thread and its runs; runs still executing are told to stop."""
        for run_id in self.store.delete_thread(thread_id, owner):
            self._signal_cancel(run_id, CancelAction.INTERRUPT)

    def stored_result(self, run_id: str) -> bytes | None:
        """The `/wait` answer (JSON) the worker stored for a run whose temporary thread it
        deletes when the run ends; None when there is none."""
        raw = self._redis.get(self._keys.result(run_id))
        return raw.encode() if isinstance(raw, str) else raw

    def is_terminal(self, run_id: str) -> bool:
        """Whether the run has a committed terminal status (or no longer exists)."""
        status = self.store.run_status(run_id)
        return status is None or status.terminal

    def _signal_cancel(self, run_id: str, action: CancelAction) -> None:
        # The row already records the request (durable); this key is how the owner,
        # on whatever worker, learns of it within one publish or poll.
        self._redis.set(self._keys.cancel(run_id), action.value, ex=CANCEL_TTL_S)
