"""Request models (pydantic). Fields a model does not know are ignored, as the official server
ignores them (a debug line names them); reserved, unsupported and invalid values are refused
with a 4xx naming the field."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import uuid
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.assistants.manager import AssistantSpec
from shared.assistants.model import AssistantPatch, OnConflict
from shared.runs.model import (
    CancelAction,
    CancelFilter,
    MultitaskStrategy,
    OnCompletion,
    OnDisconnect,
    PruneStrategy,
    RunRequest,
    RunStatus,
    ThreadStatus,
    ThreadTTL,
)
from shared.runs.reserved import check_no_reserved
from shared.vocab import STREAM_MODES, Durability
from shared.webhooks.policy import BadWebhookUrl, parse_url

# SDK fields we know but do not implement yet: refused with a clear message (A1).
UNSUPPORTED_RUN_FIELDS = {
    "feedback_keys": "feedback keys are not supported",
    "strict_resume": "strict_resume is not supported",
    "langsmith_tracer": "langsmith tracing is not supported",
}
ON_COMPLETION_ON_A_THREAD = (
    "on_completion: only for runs without a thread (POST /runs, /runs/stream, /runs/wait, or a"
    " /runs/batch item without thread_id); a thread you created stays until you delete it"
)
"""The official server ignores `on_completion` on a thread run; we refuse it (A3: never
silently ignored)."""
STATELESS_REFUSED = {
    "if_not_exists": "a run without a thread always gets a new thread of its own",
    "checkpoint": "a run without a thread starts on a new thread, which has no checkpoint",
    "checkpoint_id": "a run without a thread starts on a new thread, which has no checkpoint",
}
log = logging.getLogger(__name__)
PG_BIGINT_MAX = 2**63 - 1  # larger offsets fail in PostgreSQL (found by the fuzzer)


ThreadField = Literal[
    "thread_id", "created_at", "updated_at", "metadata", "status", "values", "interrupts"
]
"""The fields of a thread object a search can `select` (the SDK's ThreadSelectField, less
`config` and `context`, which threads here do not have)."""


class Strict(BaseModel):
    """Base: unknown fields are ignored (named in a debug line); known ones are validated.

    The official server ignores request fields it does not know (an SDK newer or older than
    the server, a client sending another server's options such as `order_by`); refusing them
    broke such clients for no guarantee. What a field must not be is still refused: the SDK
    fields not implemented here (UNSUPPORTED_RUN_FIELDS), reserved keys, invalid values.
    """

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _log_ignored(cls, data: Any) -> Any:
        if isinstance(data, dict):
            ignored = [str(k) for k in data if k not in cls.model_fields]
            if ignored:
                log.debug("%s: ignored unknown fields %s", cls.__name__, ", ".join(ignored))
        return data


TTL_MINUTES_MAX = 100 * 365 * 24 * 60
"""The longest TTL a thread may have (a century; beyond, timestamps overflow)."""


class ThreadTTLIn(Strict):
    """A thread's `ttl` (P6) as the SDK sends it: `{"strategy": ..., "ttl": minutes}`; a bare
    number of minutes is accepted too (strategy `delete`, as the SDK makes it)."""

    strategy: PruneStrategy = PruneStrategy.DELETE
    ttl: float = Field(gt=0, le=TTL_MINUTES_MAX, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _minutes(cls, data: Any) -> Any:
        if isinstance(data, bool):
            raise ValueError("must be a number of minutes or {strategy, ttl}")
        if isinstance(data, int | float):
            return {"ttl": data}
        return data

    @field_validator("ttl", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError("must be a number of minutes")
        return v

    def to_ttl(self) -> ThreadTTL:
        """The store's value."""
        return ThreadTTL(self.strategy, float(self.ttl))


class ThreadCreate(Strict):
    """POST /threads."""

    thread_id: uuid.UUID | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    if_exists: Literal["raise", "do_nothing"] = "raise"
    ttl: ThreadTTLIn | None = None  # None: `checkpointer.ttl.default_ttl`, if any


class ThreadPatch(Strict):
    """PATCH /threads/{id}."""

    metadata: dict[str, Any]
    ttl: ThreadTTLIn | None = None  # None: the thread keeps its TTL (its expiry restarts)


class ThreadGetQuery(Strict):
    """GET /threads/{id}: `include=ttl` adds the thread's `ttl` (as the official server)."""

    include: list[Literal["ttl"]] = Field(default_factory=list)

    @field_validator("include", mode="before")
    @classmethod
    def _comma_separated(cls, v: Any) -> Any:
        # `include=ttl,x` or `include=ttl&include=x` (every value is checked, not the first).
        if isinstance(v, str):
            v = [v]
        if isinstance(v, list) and all(isinstance(item, str) for item in v):
            return [part.strip() for item in v for part in item.split(",") if part.strip()]
        return v


THREAD_QUERY_MAX_CHARS = 200
"""The longest `query` of POST /threads/search (a title search, not a document search)."""


class ThreadSearch(Strict):
    """POST /threads/search."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    ids: list[uuid.UUID] | None = None
    status: ThreadStatus | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=PG_BIGINT_MAX)
    sort_by: Literal["thread_id", "status", "created_at", "updated_at", "activity"] = Field(
        default="created_at",
        description="`activity` (a threadrun extension): by the thread's newest run, else"
        " its creation (a metadata PATCH, e.g. a rename, moves `updated_at`, not this).",
    )
    sort_order: Literal["asc", "desc"] = "desc"
    select: list[ThreadField] | None = Field(default=None, min_length=1)
    query: str | None = Field(
        default=None,
        min_length=1,
        max_length=THREAD_QUERY_MAX_CHARS,
        description="threadrun extension: text the thread's `metadata.title` or (among the"
        " user's newest THREADRUN_THREAD_SEARCH_SCAN_THREADS threads) one of its messages"
        " contains, case-insensitively (no wildcards: `%` and `_` match themselves).",
    )

    @field_validator("query")
    @classmethod
    def _query_has_text(cls, value: str | None) -> str | None:
        if value is None:
            return None
        text = value.strip()
        if not text:
            raise ValueError("query must contain text (not only spaces)")
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            raise ValueError("query must not contain control characters")
        return text


class ThreadCount(Strict):
    """POST /threads/count."""

    metadata: dict[str, Any] = Field(default_factory=dict)
    status: ThreadStatus | None = None


class ThreadCopy(Strict):
    """POST /threads/{id}/copy (no fields; the SDK sends no body)."""


class ThreadPrune(Strict):
    """POST /threads/prune."""

    thread_ids: list[uuid.UUID] = Field(max_length=1000)
    strategy: PruneStrategy = PruneStrategy.DELETE


class CheckpointRef(BaseModel):
    """A checkpoint reference as the SDK sends it."""

    model_config = ConfigDict(extra="allow")

    thread_id: str | None = None
    checkpoint_ns: str | None = ""
    checkpoint_id: str | None = None
    checkpoint_map: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """Only the fields that select a checkpoint."""
        return {"checkpoint_ns": self.checkpoint_ns or "", "checkpoint_id": self.checkpoint_id}


class StateUpdate(Strict):
    """POST /threads/{id}/state."""

    values: Any = None
    as_node: str | None = None
    checkpoint: CheckpointRef | None = None
    checkpoint_id: str | None = None


class StateAtCheckpoint(Strict):
    """POST /threads/{id}/state/checkpoint."""

    checkpoint: CheckpointRef
    subgraphs: bool = False


class HistoryRequest(Strict):
    """POST /threads/{id}/history."""

    limit: int = Field(default=10, ge=1, le=1000)
    before: CheckpointRef | str | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: CheckpointRef | None = None


class RunConfig(Strict):
    """The run's RunnableConfig (the parts a client may set; other keys are ignored)."""

    configurable: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    recursion_limit: int | None = Field(default=None, ge=1, le=10_000)
    max_concurrency: int | None = Field(default=None, ge=1)
    run_name: str | None = None
    durability: Durability | None = None
    """An assistant's default for its runs (a run's own `durability` wins); taken out of the
    config at admission (`RunRequest.on_assistant`), the graph never sees it."""

    @field_validator("configurable")
    @classmethod
    def _no_reserved_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_no_reserved(v)  # LangGraph's runtime keys are not a client's
        return v

    def given(self) -> dict[str, Any]:
        """Only the keys the client gave (no empty defaults), so that an assistant's values
        under the run's are replaced only by the run's own."""
        return self.model_dump(exclude_unset=True, exclude_none=True)


class RunCommand(Strict):
    """A LangGraph Command: resume an interrupt, update state, or go to nodes."""

    resume: Any = None
    update: Any = None
    goto: Any = None


class RunCreate(Strict):
    """POST /threads/{id}/runs, /runs/stream, /runs/wait (and the WebSocket `run.create`)."""

    assistant_id: str = Field(min_length=1, max_length=256)
    input: Any = None
    command: RunCommand | None = None
    config: RunConfig | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    stream_mode: list[str] = Field(default_factory=lambda: ["values"])
    stream_subgraphs: bool = False
    stream_resumable: bool = True  # accepted; our streams are always resumable
    multitask_strategy: MultitaskStrategy | None = None
    on_disconnect: OnDisconnect = OnDisconnect.CONTINUE
    if_not_exists: Literal["create", "reject"] = "reject"
    checkpoint: CheckpointRef | None = None
    checkpoint_id: str | None = None
    checkpoint_during: bool | None = None
    durability: Durability | None = None
    interrupt_before: Literal["*"] | list[str] | None = None
    interrupt_after: Literal["*"] | list[str] | None = None
    after_seconds: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    webhook: str | None = Field(default=None, max_length=65_536)
    """POSTed the run when it ends (shared/webhooks/); the length and egress limits of the
    deployment are checked at admission (RunManager)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, why in UNSUPPORTED_RUN_FIELDS.items():
                if data.get(key) is not None:
                    raise ValueError(f"{key}: {why}")
            if "on_completion" not in cls.model_fields and data.get("on_completion") is not None:
                raise ValueError(ON_COMPLETION_ON_A_THREAD)
        return data

    @field_validator("stream_mode", mode="before")
    @classmethod
    def _modes(cls, v: Any) -> Any:
        if v is None:
            return ["values"]
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not v:
            raise ValueError("must be a stream mode or a non-empty list of them")
        for mode in v:
            if not isinstance(mode, str) or mode not in STREAM_MODES:  # a dict: TypeError, 500
                raise ValueError(
                    f"unsupported stream mode {mode!r}; supported: {', '.join(sorted(STREAM_MODES))}"
                )
        return list(dict.fromkeys(v))

    @field_validator("webhook")
    @classmethod
    def _webhook(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_url(v)
            except BadWebhookUrl as exc:
                raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _checks(self) -> RunCreate:
        if self.input is not None and self.command is not None:
            raise ValueError("input and command are mutually exclusive")
        return self

    def effective_durability(self) -> Durability | None:
        """`durability`, or the deprecated `checkpoint_during` mapped onto it."""
        if self.durability:
            return self.durability
        if self.checkpoint_during is not None:
            return "async" if self.checkpoint_during else "exit"
        return None

    def requested_checkpoint_id(self) -> str | None:
        """The checkpoint to start from, if any."""
        if self.checkpoint_id:
            return self.checkpoint_id
        return self.checkpoint.checkpoint_id if self.checkpoint else None

    def to_request(self, thread_id: str) -> RunRequest:
        """The typed request `RunManager.admit` takes (HTTP and WebSocket build it alike)."""
        return RunRequest(
            thread_id=thread_id,
            assistant_id=self.assistant_id,
            input=self.input,
            command=self.command.model_dump(exclude_none=True) if self.command else None,
            config=self.config.given() if self.config else {},
            context=self.context,
            metadata=self.metadata,
            kwargs={
                "stream_mode": self.stream_mode,
                "stream_subgraphs": self.stream_subgraphs,
                "interrupt_before": self.interrupt_before,
                "interrupt_after": self.interrupt_after,
                "durability": self.effective_durability(),
                "checkpoint_id": self.requested_checkpoint_id(),
            },
            on_disconnect=self.on_disconnect,
            multitask_strategy=self.multitask_strategy,
            create_thread=self.if_not_exists == "create",
            after_seconds=self.after_seconds or 0.0,
            webhook=self.webhook,
        )


class StatelessRunCreate(RunCreate):
    """POST /runs, /runs/stream, /runs/wait: a run on a new temporary thread of the caller."""

    on_completion: OnCompletion = OnCompletion.DELETE

    @property
    def has_thread(self) -> bool:
        """Whether the run goes on a thread the client names (only a batch item may)."""
        return False

    @model_validator(mode="after")
    def _stateless(self) -> Self:
        if self.has_thread:
            if "on_completion" in self.model_fields_set:
                raise ValueError(ON_COMPLETION_ON_A_THREAD)
            return self
        for name, why in STATELESS_REFUSED.items():
            if name in self.model_fields_set:
                raise ValueError(f"{name}: {why}")
        if self.command is not None and self.command.resume is not None:
            raise ValueError("command.resume: a run without a thread has no interrupt to resume")
        return self

    def to_request(self, thread_id: str | None = None) -> RunRequest:
        """The typed request on a new temporary thread (`thread_id`: its id; new if None)."""
        request = super().to_request(thread_id or str(uuid.uuid4()))
        return dataclasses.replace(request, create_thread=True, on_completion=self.on_completion)


class BatchRunCreate(StatelessRunCreate):
    """One item of POST /runs/batch: a run on its `thread_id`, or without a thread."""

    thread_id: uuid.UUID | None = None

    @property
    def has_thread(self) -> bool:
        """Whether the item names its thread."""
        return self.thread_id is not None

    def to_request(self, thread_id: str | None = None) -> RunRequest:
        """The typed request: on the item's thread, else on a new temporary one."""
        if self.thread_id is None:
            return super().to_request(thread_id)
        return RunCreate.to_request(self, str(self.thread_id))


class RunsCancel(Strict):
    """POST /runs/cancel: runs of one thread by id, or every inflight run of the caller by status."""

    thread_id: uuid.UUID | None = None
    run_ids: list[uuid.UUID] | None = Field(default=None, min_length=1, max_length=1000)
    status: CancelFilter | None = None

    @model_validator(mode="after")
    def _one_selection(self) -> Self:
        if self.status is not None:
            if self.thread_id is not None or self.run_ids is not None:
                raise ValueError("status: give either status, or thread_id and run_ids, not both")
        elif self.thread_id is None or self.run_ids is None:
            raise ValueError("give either status, or both thread_id and run_ids")
        return self


class CancelManyQuery(Strict):
    """POST /runs/cancel query string."""

    action: CancelAction = CancelAction.INTERRUPT


class CancelQuery(Strict):
    """POST …/cancel query string."""

    wait: bool = False
    action: CancelAction = CancelAction.INTERRUPT

    @field_validator("wait", mode="before")
    @classmethod
    def _bool(cls, v: Any) -> Any:
        return {"1": True, "0": False, "true": True, "false": False}.get(str(v).lower(), v)


class RunListQuery(Strict):
    """GET /threads/{id}/runs query string."""

    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=PG_BIGINT_MAX)
    status: RunStatus | None = None
    select: str | None = None


class JoinStreamQuery(Strict):
    """GET …/runs/{run_id}/stream query string."""

    cancel_on_disconnect: bool = False
    stream_mode: list[str] | None = None
    last_event_id: str | None = None

    @field_validator("cancel_on_disconnect", mode="before")
    @classmethod
    def _bool(cls, v: Any) -> Any:
        return {"1": True, "0": False, "true": True, "false": False}.get(str(v).lower(), v)


class ThreadStreamQuery(Strict):
    """GET /threads/{thread_id}/stream query string (the SDK's `threads.join_stream`)."""

    stream_mode: list[Literal["run_modes", "lifecycle", "state_update"]] | None = None
    last_event_id: str | None = None


def _flag(v: Any) -> Any:
    """A query-string boolean: `true`/`false`/`1`/`0` in any case."""
    return {"1": True, "0": False, "true": True, "false": False}.get(str(v).lower(), v)


AssistantSortBy = Literal["assistant_id", "graph_id", "name", "created_at", "updated_at"]
AssistantField = Literal[
    "assistant_id",
    "graph_id",
    "name",
    "description",
    "config",
    "context",
    "created_at",
    "updated_at",
    "metadata",
    "version",
]
"""The SDK's `AssistantSelectField`: `shared.assistants.model.ASSISTANT_FIELDS` (a unit test
keeps the two spellings equal)."""
NAME_MAX = 1_000
DESCRIPTION_MAX = 10_000
PG_INT_MAX = 2**31 - 1


class AssistantCreate(Strict):
    """POST /assistants."""

    graph_id: str = Field(min_length=1, max_length=256)
    assistant_id: uuid.UUID | None = None
    config: RunConfig | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    if_exists: OnConflict = OnConflict.RAISE
    name: str | None = Field(default=None, max_length=NAME_MAX)
    description: str | None = Field(default=None, max_length=DESCRIPTION_MAX)

    @field_validator("context")
    @classmethod
    def _no_reserved_context_keys(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        check_no_reserved(v)  # an assistant's context becomes its config.configurable
        return v

    def to_spec(self) -> AssistantSpec:
        """The typed request `AssistantManager.create` takes."""
        return AssistantSpec(
            graph_id=self.graph_id,
            assistant_id=str(self.assistant_id) if self.assistant_id else None,
            name=self.name,
            description=self.description,
            metadata=self.metadata or {},
            config=self.config.given() if self.config else {},
            context=self.context,
            if_exists=self.if_exists,
        )


class AssistantUpdate(Strict):
    """PATCH /assistants/{id}: a new version; what is not given is kept."""

    graph_id: str | None = Field(default=None, min_length=1, max_length=256)
    config: RunConfig | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    name: str | None = Field(default=None, max_length=NAME_MAX)
    description: str | None = Field(default=None, max_length=DESCRIPTION_MAX)

    @field_validator("context")
    @classmethod
    def _no_reserved_context_keys(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        check_no_reserved(v)  # an assistant's context becomes its config.configurable
        return v

    def to_patch(self) -> AssistantPatch:
        """The typed patch `AssistantManager.patch` takes."""
        return AssistantPatch(
            graph_id=self.graph_id,
            name=self.name,
            description=self.description,
            metadata=self.metadata,
            config=self.config.given() if self.config else None,
            context=self.context,
        )


class AssistantSearch(Strict):
    """POST /assistants/search."""

    graph_id: str | None = None
    name: str | None = Field(default=None, max_length=NAME_MAX)
    metadata: dict[str, Any] | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=PG_BIGINT_MAX)
    sort_by: AssistantSortBy | None = None
    sort_order: Literal["asc", "desc"] | None = None
    select: list[AssistantField] | None = None


class AssistantCount(Strict):
    """POST /assistants/count."""

    graph_id: str | None = None
    name: str | None = Field(default=None, max_length=NAME_MAX)
    metadata: dict[str, Any] | None = None


class AssistantVersionsQuery(Strict):
    """POST /assistants/{id}/versions."""

    metadata: dict[str, Any] | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=PG_BIGINT_MAX)


class AssistantLatest(Strict):
    """POST /assistants/{id}/latest."""

    version: int = Field(ge=1, le=PG_INT_MAX)


class AssistantDeleteQuery(Strict):
    """DELETE /assistants/{id} query string."""

    delete_threads: bool = False

    @field_validator("delete_threads", mode="before")
    @classmethod
    def _bool(cls, v: Any) -> Any:
        return _flag(v)


class AssistantGraphQuery(Strict):
    """GET /assistants/{id}/graph query string: `xray` true/false, or a depth >= 1."""

    xray: bool | int = False

    @field_validator("xray", mode="before")
    @classmethod
    def _xray(cls, v: Any) -> Any:
        if not isinstance(v, str):
            return v
        if v.lower() in ("true", "false"):
            return v.lower() == "true"
        try:
            depth = int(v)
        except ValueError:
            raise ValueError("must be true, false or a depth >= 1") from None
        if depth < 1:
            raise ValueError("must be true, false or a depth >= 1")
        return depth


class SubgraphsQuery(Strict):
    """GET /assistants/{id}/subgraphs query string."""

    recurse: bool = False

    @field_validator("recurse", mode="before")
    @classmethod
    def _bool(cls, v: Any) -> Any:
        return _flag(v)


# --- crons -----------------------------------------------------------------------------------------
CRON_REFUSED = {
    "on_disconnect": "a cron's runs have no client to disconnect",
    "if_not_exists": "a cron's thread exists (its runs go on it), or each firing gets a new one",
    "checkpoint": "each firing starts from the thread's latest state",
    "checkpoint_id": "each firing starts from the thread's latest state",
    "after_seconds": "the schedule says when a cron's runs start",
    "command": "a cron fires new input, it does not resume or command a run",
    "on_completion": "a cron without a thread says what happens to each run's thread with"
    " on_run_completed",
}
"""RunCreate fields that mean nothing for a fired run: refused (422 naming the field)."""
CRON_ONLY_FIELDS = {"schedule", "timezone", "end_time", "enabled", "on_run_completed"}
CronField = Literal[
    "cron_id",
    "assistant_id",
    "thread_id",
    "end_time",
    "schedule",
    "timezone",
    "created_at",
    "updated_at",
    "user_id",
    "payload",
    "next_run_date",
    "metadata",
    "now",
    "on_run_completed",
    "enabled",
]
"""The SDK's `CronSelectField` (`now`: the server's time, as the official server answers)."""
CronSortBy = Literal[
    "cron_id", "assistant_id", "thread_id", "created_at", "updated_at", "next_run_date", "end_time"
]


def _aware(value: datetime.datetime | None) -> datetime.datetime | None:
    """A naive end_time is UTC (what the SDK sends is `isoformat()` of the caller's value)."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=datetime.UTC)
    return value


class CronPayload(RunCreate):
    """The run a cron fires: validated by RunCreate (the same path as `POST …/runs`, so a field
    runs gain, a webhook, reaches crons unchanged), less what a fired run cannot have."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_for_crons(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, why in CRON_REFUSED.items():
                if data.get(key) is not None:
                    raise ValueError(f"{key}: {why}")
        return data

    def payload(self) -> dict[str, Any]:
        """The run fields the client gave, as JSON (what the cron shows as `payload`)."""
        given = self.model_fields_set - CRON_ONLY_FIELDS
        return self.model_dump(mode="json", include=given, exclude_unset=True, exclude_none=True)

    def to_cron_request(self, on_run_completed: OnCompletion | None) -> RunRequest:
        """The RunRequest each firing admits (its thread id set at firing time); without a
        thread, each firing creates its temporary thread with `on_run_completed` as its fate."""
        request = self.to_request("")
        if on_run_completed is None:
            return request
        return dataclasses.replace(request, create_thread=True, on_completion=on_run_completed)


class CronCreate(CronPayload):
    """POST /threads/{id}/runs/crons and POST /runs/crons (the SDK's `crons.create*`)."""

    schedule: str = Field(min_length=1, max_length=256)
    timezone: str | None = Field(default=None, min_length=1, max_length=64)
    end_time: datetime.datetime | None = None
    enabled: bool = True
    on_run_completed: OnCompletion | None = None

    @field_validator("end_time", mode="after")
    @classmethod
    def _end_time(cls, v: datetime.datetime | None) -> datetime.datetime | None:
        return _aware(v)


class CronUpdate(Strict):
    """PATCH /runs/crons/{id}: what is sent changes (`end_time: null` clears it); run fields
    are merged into the cron's payload, which is validated again as a whole."""

    schedule: str | None = Field(default=None, min_length=1, max_length=256)
    timezone: str | None = Field(default=None, min_length=1, max_length=64)
    end_time: datetime.datetime | None = None
    enabled: bool | None = None
    on_run_completed: OnCompletion | None = None
    input: Any = None
    metadata: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    webhook: Any = None
    interrupt_before: Any = None
    interrupt_after: Any = None
    stream_mode: Any = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    durability: Any = None
    multitask_strategy: Any = None

    @field_validator("end_time", mode="after")
    @classmethod
    def _end_time(cls, v: datetime.datetime | None) -> datetime.datetime | None:
        return _aware(v)

    def payload_changes(self) -> dict[str, Any]:
        """The run fields sent (not null), to merge into the cron's payload."""
        given = self.model_fields_set - CRON_ONLY_FIELDS
        return {k: v for k, v in self.model_dump(include=given).items() if v is not None}


class CronSearch(Strict):
    """POST /runs/crons/search."""

    assistant_id: str | None = Field(default=None, max_length=256)
    thread_id: uuid.UUID | None = None
    enabled: bool | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=PG_BIGINT_MAX)
    sort_by: CronSortBy = "created_at"
    sort_order: Literal["asc", "desc"] = "desc"
    select: list[CronField] | None = Field(default=None, min_length=1)


class CronCount(Strict):
    """POST /runs/crons/count."""

    assistant_id: str | None = Field(default=None, max_length=256)
    thread_id: uuid.UUID | None = None
    enabled: bool | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
