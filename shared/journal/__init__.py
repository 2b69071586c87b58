"""The run journal (SPEC §7): audit events, token usage, delivery receipts."""

from shared.journal.delivery import (
    DeliveryOutcome,
    build_receipt,
    settle_delivery,
    write_delivery_receipt,
)
from shared.journal.event_store import (
    APPEND_EVENT_SQL,
    Category,
    EventPage,
    EventStore,
    MemoryEventStore,
    RunEvent,
    RunEventStore,
    parse_thread_cursor,
    summarize_usage,
    truncate_payload,
)
from shared.journal.journal import RunJournal, journal_from_config

__all__ = [
    "APPEND_EVENT_SQL",
    "Category",
    "DeliveryOutcome",
    "EventPage",
    "EventStore",
    "MemoryEventStore",
    "RunEvent",
    "RunEventStore",
    "RunJournal",
    "build_receipt",
    "journal_from_config",
    "parse_thread_cursor",
    "settle_delivery",
    "summarize_usage",
    "truncate_payload",
    "write_delivery_receipt",
]
