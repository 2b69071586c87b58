"""The records of runs and threads: the typed `RunRequest` and the frozen `Run` / `Thread`.

Every layer speaks these types: the store builds them from rows (`Run.from_row`), the
manager admits a typed `RunRequest`, the executor and the reaper read `Run` fields, and the
API turns them into the SDK's JSON shapes. Their statuses and strategies are the ground
floor's (`shared/vocab.py`), re-exported here for the code that reads both.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.assistants.model import Assistant, merged_config, merged_context
from shared.vocab import (
    DEFAULT_DURABILITY,
    INFLIGHT_STATUSES,
    TERMINAL_STATUSES,
    CancelAction,
    CancelFilter,
    JSONObject,
    MultitaskStrategy,
    OnCompletion,
    OnDisconnect,
    PruneStrategy,
    RunRef,
    RunStatus,
    Sink,
    StreamOptions,
    ThreadStatus,
    stream_options,
)

__all__ = [
    "INFLIGHT_STATUSES",
    "TERMINAL_STATUSES",
    "CancelAction",
    "CancelFilter",
    "JSONObject",
    "MultitaskStrategy",
    "OnCompletion",
    "OnDisconnect",
    "PruneStrategy",
    "Run",
    "RunRef",
    "RunRequest",
    "RunStatus",
    "Sink",
    "StreamOptions",
    "Thread",
    "ThreadStatus",
    "ThreadTTL",
]


@dataclass(frozen=True, slots=True)
class ThreadTTL:
    """A thread's time to live (SPEC P6): what the sweep does once it has passed
    (`delete` the thread, or `keep_latest` checkpoint only), after `minutes` without activity."""

    strategy: PruneStrategy
    minutes: float

    def params(self) -> dict[str, Any]:
        """The `ttl_strategy` / `ttl_minutes` parameters of the thread statements."""
        return {"ttl_strategy": self.strategy.value, "ttl_minutes": self.minutes}

    @staticmethod
    def no_params() -> dict[str, Any]:
        """The parameters of a thread without a TTL (it never expires)."""
        return {"ttl_strategy": None, "ttl_minutes": None}


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True, slots=True)
class RunRequest:
    """A validated request for a new run, as the HTTP view and the WebSocket build it."""

    thread_id: str  # the storage id (shared/runs/thread_ids.py)
    assistant_id: str
    input: Any = None
    command: JSONObject | None = None
    config: JSONObject = field(default_factory=dict)
    context: JSONObject | None = None
    metadata: JSONObject = field(default_factory=dict)
    kwargs: StreamOptions = field(default_factory=lambda: StreamOptions())
    on_disconnect: OnDisconnect = OnDisconnect.CONTINUE
    multitask_strategy: MultitaskStrategy | None = None  # None: the deployment's default
    create_thread: bool = False  # `if_not_exists=create`, or the thread of a stateless run
    on_completion: OnCompletion | None = None  # set only for a run without a thread
    webhook: str | None = None  # POSTed the run once it ended (shared/webhooks/)
    public_thread_id: str | None = None  # the client's id of a thread it makes; None: thread_id

    @property
    def stateless(self) -> bool:
        """Whether the run came without a thread and runs on a temporary one of its own."""
        return self.on_completion is not None

    after_seconds: float = 0.0  # a delayed run: not started before this many seconds

    def on_assistant(self, assistant: Assistant) -> RunRequest:
        """This request on `assistant`: its id, and its config and context under the
        request's own (`merged_config`, `merged_context`); its `durability` the request's,
        else the config's (`config.durability`, the assistant's default), else LangGraph's."""
        config = merged_config(assistant.config, self.config)
        default = config.pop("durability", None)  # never the graph's: LangGraph has no such key
        durability = self.kwargs.get("durability") or default
        return dataclasses.replace(
            self,
            assistant_id=assistant.assistant_id,
            config=config,
            context=merged_context(assistant.context, self.context),
            kwargs={**self.kwargs, "durability": durability or DEFAULT_DURABILITY},
        )


@dataclass(frozen=True, slots=True)
class Run:
    """One run row (R1). `user_id` is the thread owner, set only where the row was joined."""

    run_id: str
    thread_id: str
    assistant_id: str
    graph_id: str
    status: RunStatus
    multitask_strategy: MultitaskStrategy
    on_disconnect: OnDisconnect
    created_at: dt.datetime
    updated_at: dt.datetime
    input: Any = None
    command: JSONObject | None = None
    config: JSONObject = field(default_factory=dict)
    context: JSONObject | None = None
    metadata: JSONObject = field(default_factory=dict)
    kwargs: StreamOptions = field(default_factory=lambda: StreamOptions())
    seq: int = 0
    dispatched_at: dt.datetime | None = None
    due_at: dt.datetime | None = None  # a delayed run starts at this time, not before
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    owner: str | None = None  # the worker that holds (or last held) the run
    owner_epoch: int = 0
    attempt: int = 0
    pre_run_checkpoint_id: str | None = None
    pre_run_writes: list[Any] | None = None
    cancel_action: CancelAction | None = None
    error: JSONObject | None = None
    usage: JSONObject | None = None
    on_completion: OnCompletion | None = None  # a run without a thread: its thread's fate
    user_id: str | None = None
    webhook: str | None = None  # the URL its end is POSTed to (shared/webhooks/)
    thread_public_id: str | None = None  # its thread's public id, where the row was joined

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Run:
        """The run of a `runs` row (a dict row of psycopg; extra columns are ignored)."""
        cancel = row.get("cancel_action")
        on_completion = row.get("on_completion")
        return cls(
            run_id=str(row["run_id"]),
            thread_id=str(row["thread_id"]),
            assistant_id=row["assistant_id"],
            graph_id=row["graph_id"],
            status=RunStatus(row["status"]),
            multitask_strategy=MultitaskStrategy(row["multitask_strategy"]),
            on_disconnect=OnDisconnect(row["on_disconnect"]),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            input=row.get("input"),
            command=row.get("command"),
            config=row.get("config") or {},
            context=row.get("context"),
            metadata=row.get("metadata") or {},
            kwargs=stream_options(row.get("kwargs")),
            seq=int(row.get("seq") or 0),
            dispatched_at=row.get("dispatched_at"),
            due_at=row.get("due_at"),
            started_at=row.get("started_at"),
            ended_at=row.get("ended_at"),
            owner=row.get("owner"),
            owner_epoch=int(row.get("owner_epoch") or 0),
            attempt=int(row.get("attempt") or 0),
            pre_run_checkpoint_id=row.get("pre_run_checkpoint_id"),
            pre_run_writes=row.get("pre_run_writes"),
            cancel_action=CancelAction(cancel) if cancel else None,
            error=row.get("error"),
            usage=row.get("usage"),
            on_completion=OnCompletion(on_completion) if on_completion else None,
            user_id=_opt_str(row.get("user_id")),
            webhook=row.get("webhook"),
            thread_public_id=_opt_str(row.get("thread_public_id")),
        )

    @property
    def terminal(self) -> bool:
        """Whether the run has ended."""
        return self.status.terminal

    @property
    def deletes_thread(self) -> bool:
        """Whether the run's temporary thread is deleted once every run on it ended."""
        return self.on_completion is OnCompletion.DELETE


@dataclass(frozen=True, slots=True)
class Thread:
    """One thread row: its owner, metadata and status. `thread_id` is its storage id,
    `public_id` the one its owner sees (the same unless the client chose it:
    shared/runs/thread_ids.py)."""

    thread_id: str
    owner: str
    status: ThreadStatus
    created_at: dt.datetime
    updated_at: dt.datetime
    metadata: JSONObject = field(default_factory=dict)
    public_id: str = ""
    ttl: ThreadTTL | None = None  # None: the thread never expires
    expires_at: dt.datetime | None = None  # when the sweep takes it (None: not scheduled)

    @property
    def client_id(self) -> str:
        """The id its owner sees and sends."""
        return self.public_id or self.thread_id

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Thread:
        """The thread of a `threads` row."""
        return cls(
            thread_id=str(row["thread_id"]),
            owner=row["owner"],
            status=ThreadStatus(row["status"]),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            metadata=row.get("metadata") or {},
            public_id=str(row.get("public_id") or row["thread_id"]),
            ttl=(
                ThreadTTL(PruneStrategy(row["ttl_strategy"]), float(row["ttl_minutes"]))
                if row.get("ttl_minutes") is not None
                else None
            ),
            expires_at=row.get("expires_at"),
        )
