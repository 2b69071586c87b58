"""The run journal (SPEC §7): audit events, token usage, delivery receipts.

`base` holds the contract (events, pages, the `EventStore` protocol); `postgres` and
`inmemory` its two backends; `pages`, `payload` and `usage` the pure rules both share;
`delivery` the receipt; `journal` the LangChain callback that records a run.
"""

from shared.journal.base import Category, EventPage, EventStore, RunEvent
from shared.journal.delivery import (
    DeliveryOutcome,
    build_receipt,
    settle_delivery,
    write_delivery_receipt,
)
from shared.journal.inmemory import MemoryEventStore
from shared.journal.journal import RunJournal, journal_from_config
from shared.journal.pages import parse_thread_cursor
from shared.journal.payload import truncate_payload
from shared.journal.postgres import RunEventStore, append_in, queue_in, with_event
from shared.journal.usage import summarize_usage

__all__ = [
    "Category",
    "DeliveryOutcome",
    "EventPage",
    "EventStore",
    "MemoryEventStore",
    "RunEvent",
    "RunEventStore",
    "RunJournal",
    "append_in",
    "build_receipt",
    "journal_from_config",
    "parse_thread_cursor",
    "queue_in",
    "settle_delivery",
    "summarize_usage",
    "truncate_payload",
    "with_event",
    "write_delivery_receipt",
]
