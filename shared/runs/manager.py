"""`RunManager`: admission, dispatch after commit, and cancel requests (R2-R5)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection, Sequence
from typing import Any, Protocol

import psycopg
import redis
from psycopg.rows import DictRow

from shared import lua
from shared.assistants.model import Assistant
from shared.authz.users import run_subject
from shared.errors import (
    AssistantNotFound,
    CheckpointNotFound,
    RunNotFound,
    ThreadBusy,
    ThreadNotFound,
    ValidationFailed,
)
from shared.redis_keys import (
    CANCEL_TTL_S,
    ENDED_RUN_TTL_MS,
    THREAD_RUNS_MAXLEN,
    THREAD_RUNS_TTL_S,
    Keys,
    LimitKeys,
)
from shared.runs.admission import AdmissionOutcome, CancelOutcome
from shared.runs.model import (
    INFLIGHT_STATUSES,
    CancelAction,
    MultitaskStrategy,
    Run,
    RunRequest,
    RunStatus,
)
from shared.runs.priority import FIRST_PRIORITY, REDISPATCH
from shared.runs.store import Admission, AdmitItem, RunStore
from shared.runs.taskqueue import Dispatcher
from shared.runs.threads_store import Purge
from shared.settings import Settings
from shared.webhooks.policy import BadWebhookUrl, EgressPolicy, admission_refusal, parse_url
from shared.webhooks.project_rules import WebhookRules, project_rules

log = logging.getLogger(__name__)


class AssistantResolver(Protocol):
    """Finds the assistant a run runs on (`shared.assistants.manager.AssistantManager`)."""

    def resolve(self, owner: str, id_or_graph: str) -> Assistant:
        """The caller's or a system assistant (a graph name names its system assistant);
        AssistantNotFound (404) for anything else, another user's assistant included."""
        ...


class CheckpointLookup(Protocol):
    """Whether a thread has a checkpoint (`shared.state.accessor.CheckpointStateAccessor`)."""

    def has_checkpoint(self, thread_id: str, checkpoint_id: str) -> bool:
        """Whether the thread (root namespace) has this checkpoint."""
        ...


def webhook_checks(settings: Settings) -> dict[str, Any]:
    """RunManager's webhook checks from the settings and the project file's `webhooks`: the
    same for every process that admits runs (the web, and the scheduler whose cron firings
    are admissions too), so a URL THREADRUN_WEBHOOK_ALLOW lets through at creation is not
    refused at firing, and the project's rules hold for both."""
    return {
        "webhook_policy": EgressPolicy.parse(settings.webhook_allow),
        "webhook_url_max": settings.webhook_url_max,
        "webhook_rules": project_rules(settings.config),
    }


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
        checkpoints: CheckpointLookup | None = None,
        default_strategy: MultitaskStrategy = MultitaskStrategy.ENQUEUE,
        max_after_s: float = 30 * 86_400,
        webhook_policy: EgressPolicy | None = None,
        webhook_url_max: int = 2048,
        webhook_rules: WebhookRules | None = None,
    ) -> None:
        self.store = store
        self._dispatcher = dispatcher
        self._redis = client
        self._release_run = lua.register(client, "limit_release_run")
        self._keys = keys
        self._assistants = assistants
        self._checkpoints = checkpoints
        self._default_strategy = default_strategy
        self._max_after_s = max_after_s
        self._webhook_policy = webhook_policy or EgressPolicy()
        self._webhook_url_max = webhook_url_max
        self._webhook_rules = webhook_rules or WebhookRules()  # langgraph.json `webhooks`

    def resolve_assistant(self, owner: str, request: RunRequest) -> tuple[RunRequest, str]:
        """The request on its assistant (the assistant's id, its current version's config
        and context under the run's own) and the graph id it runs; 404 for an assistant
        the caller cannot see."""
        if self._assistants is None:
            raise RuntimeError("this RunManager was built without assistants")
        assistant = self._assistants.resolve(owner, request.assistant_id)
        return request.on_assistant(assistant), assistant.graph_id

    def admit(self, owner: str, request: RunRequest, priority: int = FIRST_PRIORITY) -> Run:
        """Create a run atomically (R2), then dispatch it after commit (R4) at `priority`
        (shared/runs/priority.py)."""
        item = self.admit_item(owner, request)
        admission = self.store.admit(
            item.request,
            run_id=item.run_id,
            owner=owner,
            graph_id=item.graph_id,
            strategy=item.strategy,
        )
        if admission.decision.outcome is AdmissionOutcome.REJECTED:
            raise ThreadBusy(
                f"thread {request.thread_id} already has a run in progress"
                " (multitask_strategy=reject)"
            )
        return self._after_commit(admission, priority)

    def admit_item(self, owner: str, request: RunRequest) -> AdmitItem:
        """What admitting `request` writes: checked, on its assistant (404 for one the owner
        cannot see), with a new run id and the strategy in force."""
        self._check(request)
        self._check_checkpoint(owner, request)
        strategy = request.multitask_strategy or self._default_strategy
        request, graph_id = self.resolve_assistant(owner, request)
        return AdmitItem(request, str(uuid.uuid4()), graph_id, strategy)

    def admit_in(
        self, conn: psycopg.Connection[DictRow], owner: str, request: RunRequest
    ) -> Admission:
        """Admit inside the caller's transaction (a cron firing); the caller calls
        `after_commit` once it committed. REJECTED is returned, not raised."""
        return self.store.admit_in(conn, owner, self.admit_item(owner, request))

    def after_commit(self, admission: Admission, priority: int = FIRST_PRIORITY) -> Run | None:
        """What `admit` does once the admission committed: tell the owners of cancelled runs,
        dispatch (R4) at `priority`; the run, or None when it was rejected."""
        if admission.run is None:
            return None
        return self._after_commit(admission, priority)

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
            if (why := self._webhook_rules.refusal(url)) is not None:
                raise ValidationFailed(f"webhook: {why}", field="webhook")
            if (reason := admission_refusal(url, self._webhook_policy)) is not None:
                raise ValidationFailed(
                    f"webhook: {url.host} is a {reason} address, refused by the egress policy"
                    " (THREADRUN_WEBHOOK_ALLOW lists the exceptions)",
                    field="webhook",
                )

    def _check_checkpoint(self, owner: str, request: RunRequest) -> None:
        """A run from a checkpoint the thread does not have is a 404, not
        a new conversation. Checked on the caller's own thread only: another user's thread
        answers like a missing one (ThreadNotFound, or with if_not_exists=create a new
        thread, which has no checkpoint either)."""
        checkpoint_id = request.kwargs.get("checkpoint_id")
        if not checkpoint_id or self._checkpoints is None:
            return
        missing = CheckpointNotFound(
            f"checkpoint {checkpoint_id} not found in thread {request.thread_id}"
        )
        try:
            self.store.get_thread(request.thread_id, owner)
        except ThreadNotFound:
            if not request.create_thread:
                raise
            raise missing from None
        if not self._checkpoints.has_checkpoint(request.thread_id, str(checkpoint_id)):
            raise missing

    def admit_batch(
        self,
        owner: str,
        requests: Sequence[RunRequest],
        priorities: Sequence[int] | None = None,
    ) -> list[Run]:
        """Create several runs all or nothing (one transaction), then dispatch them, each at
        its priority (default: the first).

        An unknown assistant, a missing thread or a busy one under `reject` refuses the
        whole batch with the error of the first such item, naming its index.
        """
        items = []
        for index, request in enumerate(requests):
            self._check(request)
            strategy = request.multitask_strategy or self._default_strategy
            try:
                self._check_checkpoint(owner, request)
            except CheckpointNotFound as exc:
                raise CheckpointNotFound(f"item {index}: {exc}") from exc
            try:
                request, graph_id = self.resolve_assistant(owner, request)
            except AssistantNotFound as exc:
                raise AssistantNotFound(f"item {index}: {exc}") from exc
            items.append(AdmitItem(request, str(uuid.uuid4()), graph_id, strategy))
        admitted = self.store.admit_many(owner, items)
        wanted = list(priorities) if priorities is not None else [FIRST_PRIORITY] * len(admitted)
        return [self._after_commit(a, p) for a, p in zip(admitted, wanted, strict=True)]

    def _after_commit(self, admission: Admission, priority: int) -> Run:
        """Tell the owners of cancelled runs, dispatch what the admission says (R4): the
        admitted run at `priority`, any other run it lets start as a re-dispatch."""
        for victim in admission.cancel_running:
            self._signal_cancel(victim, admission.cancel_action)
        admitted = admission.run.run_id if admission.run is not None else None
        for run_id in admission.dispatch:
            self._dispatcher.dispatch_quietly(
                run_id, priority if run_id == admitted else REDISPATCH
            )
        for run_id in admission.ended:  # pending runs it ended: their webhooks are due
            self._dispatcher.dispatch_webhook(run_id)
        run = admission.run
        assert run is not None  # created: every outcome but REJECTED
        self._announce(run)
        log.info(
            "run admitted",
            extra={
                "thread_id": run.thread_id,
                "run_id": run.run_id,
                "outcome": admission.decision.outcome.value,
            },
        )
        return run

    def _announce(self, run: Run) -> None:
        """Wake the thread's followers (GET /threads/{id}/stream): one entry on the thread's
        admission stream, after the commit, so a follower that wakes finds the row.

        Best effort: a follower also polls the runs table every `thread_stream_poll_s`, so a
        notice lost to a Redis error delays it, never loses a run.
        """
        key = self._keys.thread_runs(run.thread_id)
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.xadd(key, {"r": run.run_id}, maxlen=THREAD_RUNS_MAXLEN, approximate=True)
            pipe.expire(key, THREAD_RUNS_TTL_S)
            pipe.execute()
        except redis.RedisError:
            log.warning("could not announce the run to thread followers", exc_info=True)

    def cancel(
        self, *, owner: str, thread_id: str, run_id: str, action: CancelAction
    ) -> CancelOutcome:
        """Ask a run to stop (R5): pending runs stop at once; running ones at the next safe point."""
        outcome, next_run = self.store.request_cancel(thread_id, run_id, owner, action)
        if outcome in (CancelOutcome.REQUESTED, CancelOutcome.ALREADY_REQUESTED):
            self._signal_cancel(run_id, action)
        elif outcome is CancelOutcome.CANCELLED:  # ended here, never claimed: what a
            # worker's finalize would do is ours, for whom the run counted (the project's
            # user under a tenant of `auth.path`, else the owner)
            ended = self.store.get_run_by_id(run_id)
            subject = run_subject(owner, ended.config if ended else None) or owner
            self.release_active(subject, [run_id])
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

    def delete_thread(self, *, owner: str, thread_id: str, purge: Purge | None = None) -> None:
        """Delete a thread and its runs; runs still executing are told to stop. `purge` runs
        in the delete's transaction (shared/retention/removal.py)."""
        for run_id in self.store.delete_thread(thread_id, owner, purge):
            self._signal_cancel(run_id, CancelAction.INTERRUPT)

    def stored_result(self, run_id: str) -> bytes | None:
        """The `/wait` answer (JSON) the worker stored for a run whose temporary thread it
        deletes when the run ends; None when there is none."""
        raw = self._redis.get(self._keys.result(run_id))
        return raw.encode() if isinstance(raw, str) else raw

    def release_active(self, owner: str, run_ids: Collection[str]) -> None:
        """Take ended runs out of the owner's active-run set (`max_active_runs`,
        A4). Best effort: the limiter prunes ended members when the set is full."""
        if not run_ids:
            return
        keys = LimitKeys(self._keys.prefix)
        try:
            self._release_run(
                keys=[keys.active(owner), keys.ended(owner)], args=[ENDED_RUN_TTL_MS, *run_ids]
            )
        except redis.RedisError:
            log.warning("could not release active-run slots", extra={"user_id": owner})

    def ended_among(self, run_ids: Collection[str]) -> set[str]:
        """Those of `run_ids` that have ended or are gone (one query)."""
        return self.store.ended_among(run_ids)

    def unstarted_end(self, run_id: str) -> str | None:
        """The status of a run that ended without starting (cancelled while pending), whose
        subscribers get an `end` with it rather than a gap."""
        status = self.store.unstarted_end(run_id)
        return None if status is None else status.value

    def is_terminal(self, run_id: str) -> bool:
        """Whether the run has a committed terminal status (or no longer exists)."""
        status = self.store.run_status(run_id)
        return status is None or status.terminal

    def _signal_cancel(self, run_id: str, action: CancelAction) -> None:
        # The row already records the request (durable); this key is how the owner,
        # on whatever worker, learns of it within one publish or poll.
        self._redis.set(self._keys.cancel(run_id), action.value, ex=CANCEL_TTL_S)
