"""The audit event contract (SPEC J4): event types, pages and the `EventStore` protocol.

Two backends implement it: `RunEventStore` (Postgres, `shared.journal.postgres`) and
`MemoryEventStore` (in process, unit tests only, `shared.journal.inmemory`); both pass
the conformance suite in `tests/event_store_conformance.py`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from shared.journal.pages import Direction, ThreadCursor

if TYPE_CHECKING:
    from shared.journal.usage import UsageSummary


class Category(enum.StrEnum):
    """Event categories (J4)."""

    MESSAGE = "message"
    MODEL = "model"
    TOOL = "tool"
    MIDDLEWARE = "middleware"
    MEMORY = "memory"
    ARTIFACT = "artifact"
    WORKSPACE = "workspace"
    LIFECYCLE = "lifecycle"
    DELIVERY = "delivery"


CATEGORIES = frozenset(c.value for c in Category)


def check_category(category: str) -> str:
    """`category` if it is one of J4's, else ValueError."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown event category {category!r}")
    return category


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One audit event; `seq` is None until the store assigned it."""

    run_id: str
    thread_id: str
    category: str
    type: str
    payload: dict[str, Any]
    seq: int | None = None
    created_at: datetime = field(default_factory=_now)

    def to_json(self) -> dict[str, Any]:
        """The API shape of the event."""
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "seq": self.seq,
            "category": self.category,
            "type": self.type,
            "payload": self.payload,
            "created_at": self.created_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class EventPage:
    """One page of events in ascending order.

    `has_more` says whether more events exist past the page in the direction read
    (newer when forward, older when backward). `first`/`last` are the cursors of the
    first/last event (a seq for a run's page, `"<run_seq>:<seq>"` for a thread's): pass
    `last` as `after` to read on, `first` as `before` to read back.
    """

    events: list[RunEvent]
    has_more: bool
    first: str | None
    last: str | None


class EventStore(Protocol):
    """Append-only audit events of runs (J4). Sync: async callers use asyncio.to_thread."""

    def append(self, event: RunEvent) -> RunEvent:
        """Append one event; returns it with its seq."""
        ...

    def append_batch(self, events: Sequence[RunEvent]) -> list[RunEvent]:
        """Append events atomically, each run's in the given order; returns them with seqs."""
        ...

    def append_receipt(self, event: RunEvent, *, epoch: int | None = None) -> RunEvent | None:
        """Append a `run.delivery` receipt once per (run_id, payload.attempt); None if present.

        With `epoch`, only while that epoch owns the running run (L2), else LeaseLost.
        """
        ...

    def list_run_events(
        self,
        run_id: str,
        *,
        after_seq: int | None = None,
        before_seq: int | None = None,
        categories: Sequence[str] | None = None,
        limit: int | None = None,
        direction: Direction | None = None,
    ) -> EventPage:
        """A page of the run's events, by seq."""
        ...

    def list_thread_events(
        self,
        thread_id: str,
        *,
        after: ThreadCursor | None = None,
        before: ThreadCursor | None = None,
        categories: Sequence[str] | None = None,
        limit: int | None = None,
        direction: Direction | None = None,
    ) -> EventPage:
        """A page of the thread's events, by (run order, seq)."""
        ...

    def run_usage(self, run_id: str) -> UsageSummary:
        """The run's token usage by tag and in total (J2)."""
        ...

    def thread_usage(self, thread_id: str) -> UsageSummary:
        """The thread's token usage: total, by tag, and `by_run` totals."""
        ...

    def get_receipt(self, run_id: str, attempt: int | None = None) -> RunEvent | None:
        """The delivery receipt of an attempt (the latest attempt's when None)."""
        ...
