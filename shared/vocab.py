"""The ground floor's vocabulary: the words every floor of threadrun speaks (in the spirit of
arq's `constants.py`). It imports nothing of threadrun, so that settings, metrics, the
bridge, the journal and the domain packages can all use it without reaching up.

- `JSONObject` and the enums of runs and threads. They are `StrEnum`s, so a value compares
  equal to (and serialises as) the exact string stored in PostgreSQL and sent to clients.
- The stream modes: one `StreamMode` row per mode a client may request, naming the
  LangGraph stream mode that feeds it and the events it sends. The worker asks LangGraph
  for `graph_modes(...)` (workers/stream_modes.py) and the web keeps `event_names(...)`
  of a stored stream for a client that joins with fewer modes (app/streaming/frames.py);
  a new mode is one row here (CONTRIBUTING.md, "Add a stream mode").
- `RunRef`: where a run stands in its thread's order (the store and the thread follower).
- `StreamOptions`: how a run streams and checkpoints, as admitted (`Run.kwargs`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

JSONObject = dict[str, Any]
"""A JSON object from or for a client (config, metadata, kwargs, errors)."""


class RunStatus(enum.StrEnum):
    """A run's lifecycle status (R1); the last four are terminal."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCESS = "success"
    ERROR = "error"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"

    @property
    def terminal(self) -> bool:
        """Whether the run has ended (no status follows this one)."""
        return self in TERMINAL_STATUSES

    @property
    def inflight(self) -> bool:
        """Whether the run still occupies its thread (pending or running)."""
        return self in INFLIGHT_STATUSES


TERMINAL_STATUSES = frozenset(
    {RunStatus.SUCCESS, RunStatus.ERROR, RunStatus.TIMEOUT, RunStatus.INTERRUPTED}
)
INFLIGHT_STATUSES = frozenset({RunStatus.PENDING, RunStatus.RUNNING})


class ThreadStatus(enum.StrEnum):
    """A thread's status: busy while a run is inflight, else how its last run left it."""

    IDLE = "idle"
    BUSY = "busy"
    INTERRUPTED = "interrupted"
    ERROR = "error"


class MultitaskStrategy(enum.StrEnum):
    """What a new run does to a thread that already has inflight runs (R3)."""

    REJECT = "reject"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"
    ENQUEUE = "enqueue"


class CancelAction(enum.StrEnum):
    """How a cancelled run ends (R5): keep its progress, or restore the pre-run state."""

    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"


class CancelFilter(enum.StrEnum):
    """Which inflight runs of the caller a bulk cancel selects (`POST /runs/cancel`)."""

    PENDING = "pending"
    RUNNING = "running"
    ALL = "all"

    @property
    def statuses(self) -> frozenset[RunStatus]:
        """The run statuses this filter selects."""
        if self is CancelFilter.ALL:
            return INFLIGHT_STATUSES
        return frozenset({RunStatus(self.value)})


class PruneStrategy(enum.StrEnum):
    """What `POST /threads/prune` does to each thread: delete it, or keep its latest state."""

    DELETE = "delete"
    KEEP_LATEST = "keep_latest"


class OnDisconnect(enum.StrEnum):
    """What a streaming or waiting client's disconnect does to its run."""

    CANCEL = "cancel"
    CONTINUE = "continue"


class OnCompletion(enum.StrEnum):
    """What happens to the temporary thread of a run without a thread once its runs ended."""

    DELETE = "delete"
    KEEP = "keep"


class Sink(enum.StrEnum):
    """A place an attempt writes to, each fenced by the owner epoch or lease (L2)."""

    CHECKPOINT = "checkpoint"
    RECEIPT = "receipt"
    STATUS = "status"
    STREAM = "stream"


@dataclass(frozen=True, slots=True)
class RunRef:
    """Where a run stands in its thread's order (`seq`: admission order), as a thread
    follower walks it (GET /threads/{id}/stream)."""

    run_id: str
    seq: int
    status: RunStatus
    started: bool  # claimed at least once: it may have published events

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunRef:
        """The reference of a row with run_id, seq, status and started."""
        return cls(str(row["run_id"]), int(row["seq"]), RunStatus(row["status"]), row["started"])


# --- message markers ------------------------------------------------------------------------------

HIDDEN_KEY = "threadrun_hidden"
"""`additional_kwargs` key marking an injected context block (its value names the kind):
the agent's middleware writes it, and memory extraction leaves such blocks out."""
EXTRACT_TASK = "[threadrun:extract-memory]"
"""The first line of a memory-extraction prompt (the built-in model recognises its task)."""


# --- stream modes -------------------------------------------------------------------------------

MESSAGE_EVENTS = ("messages/metadata", "messages/partial", "messages/complete")
"""The events of the `messages` stream mode (the `messages-tuple` mode's event is `messages`)."""


@dataclass(frozen=True, slots=True)
class StreamMode:
    """A stream mode a client may request."""

    name: str
    graph_mode: str | None
    """The LangGraph stream mode that feeds it; None for `events`, which is LangChain's
    `astream_events` (the run is driven through it)."""
    events: tuple[str, ...]
    """The event names it sends (a subgraph's carry `|<namespace>` after the name)."""
    doc: str


STREAM_MODES: dict[str, StreamMode] = {
    m.name: m
    for m in (
        StreamMode("values", "values", ("values",), "the whole state after each step"),
        StreamMode("updates", "updates", ("updates",), "each node's update"),
        StreamMode("messages", "messages", MESSAGE_EVENTS, "messages as a chat UI renders them"),
        StreamMode(
            "messages-tuple", "messages", ("messages",), "LangGraph's (chunk, metadata) tuples"
        ),
        StreamMode("custom", "custom", ("custom",), "what nodes write to the stream writer"),
        StreamMode("debug", "debug", ("debug",), "LangGraph's debug events"),
        StreamMode("tasks", "tasks", ("tasks",), "task starts and results"),
        StreamMode("checkpoints", "checkpoints", ("checkpoints",), "each checkpoint saved"),
        StreamMode("events", None, ("events",), "LangChain's astream_events (v2)"),
    )
}
"""Every stream mode a run may request, by name."""

DEFAULT_STREAM_MODES = ("values",)
END_EVENT = "end"
"""The last event of every run's stream (its status in `data`)."""
CONTROL_EVENTS = frozenset({"metadata", "error", END_EVENT})
"""Events every stream sends whatever its modes: the run's metadata, its error, its end."""


def graph_modes(requested: Iterable[str]) -> list[str]:
    """The LangGraph stream modes a run must ask for (each once, in order; at least one)."""
    modes = [STREAM_MODES[m].graph_mode for m in requested if m in STREAM_MODES]
    return list(dict.fromkeys(m for m in modes if m is not None)) or list(DEFAULT_STREAM_MODES)


def event_names(requested: Iterable[str]) -> frozenset[str]:
    """The event names the `requested` modes send (unknown names pass as themselves)."""
    out: set[str] = set()
    for name in requested:
        mode = STREAM_MODES.get(name)
        out.update(mode.events if mode is not None else (name,))
    return frozenset(out)


Durability = Literal["sync", "async", "exit"]
DEFAULT_DURABILITY: Durability = "async"
"""LangGraph's default, and what a run records when neither it nor its assistant chose one
(as the official server records it; docs/guarantees.md says what each mode loses)."""


class StreamOptions(TypedDict, total=False):
    """How an admitted run streams and checkpoints (`Run.kwargs`, stored as JSON)."""

    stream_mode: list[str]
    stream_subgraphs: bool
    interrupt_before: Literal["*"] | list[str] | None
    interrupt_after: Literal["*"] | list[str] | None
    durability: Durability | None
    checkpoint_id: str | None
    # Admitted by the thread streaming protocol (app/protocols/thread_stream/): the run
    # publishes LangChain protocol events (workers/protocol_events.py), not stream modes.
    protocol_events: bool


PROTOCOL_METHODS = frozenset(
    {"values", "updates", "messages", "tools", "lifecycle", "checkpoints", "tasks", "custom"}
)
"""The LangChain protocol's event methods a run publishes (StreamOptions.protocol_events);
the web adds `input.requested` and the root namespace's lifecycle from the run's status."""


def stream_options(value: Any) -> StreamOptions:
    """A stored `kwargs` object as `StreamOptions` (unknown keys are kept: older rows)."""
    return value if isinstance(value, dict) else {}  # type: ignore[return-value]
