"""The in-process event store: `EventStore` in a dict, for unit tests only (G2).

It is never a multi-process default: events live in one process's memory. It passes the
same conformance suite as the Postgres store (`tests/event_store_conformance.py`), except
for what needs a `runs` table (RunNotFound, the L2 fence of receipts).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from shared import serde
from shared.journal.base import Category, EventPage, RunEvent, check_category
from shared.journal.delivery import DELIVERY_TYPE, check_receipt
from shared.journal.pages import (
    DEFAULT_PAGE_SIZE,
    DEFAULT_PAGE_SIZE_MAX,
    Direction,
    ThreadCursor,
    format_thread_cursor,
    page_direction,
    page_limit,
)
from shared.journal.payload import DEFAULT_MAX_PAYLOAD_BYTES, truncate_payload
from shared.journal.usage import (
    Usage,
    UsageSummary,
    add_usage,
    empty_usage,
    summarize_usage,
    usage_summary,
)

Key = TypeVar("Key", int, ThreadCursor)
"""A page key: a run's seq, or a thread's (run order, seq)."""


class MemoryEventStore:
    """A process-local EventStore for unit tests; never a multi-process default (G2).

    A thread's run order is the order in which its runs first appended an event.
    """

    def __init__(
        self,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        page_size: int = DEFAULT_PAGE_SIZE,
        page_size_max: int = DEFAULT_PAGE_SIZE_MAX,
    ) -> None:
        self.max_payload_bytes = max_payload_bytes
        self.page_size = page_size
        self.page_size_max = page_size_max
        self._lock = threading.Lock()
        self._events: dict[str, list[RunEvent]] = defaultdict(list)
        self._run_seq: dict[str, int] = {}
        self._thread_runs: dict[str, list[str]] = defaultdict(list)

    def append(self, event: RunEvent) -> RunEvent:
        """Append one event."""
        return self.append_batch([event])[0]

    def append_batch(self, events: Sequence[RunEvent]) -> list[RunEvent]:
        """Append events, all or none."""
        for ev in events:
            check_category(ev.category)
        stored = [
            replace(ev, payload=truncate_payload(ev.payload, self.max_payload_bytes))
            for ev in events
        ]
        with self._lock:
            return [self._add(ev) for ev in stored]

    def _add(self, ev: RunEvent) -> RunEvent:
        log = self._events[ev.run_id]
        if ev.run_id not in self._run_seq:
            self._run_seq[ev.run_id] = len(self._run_seq) + 1
            self._thread_runs[ev.thread_id].append(ev.run_id)
        out = replace(ev, seq=(log[-1].seq or 0) + 1 if log else 1)
        log.append(out)
        return out

    def append_receipt(self, event: RunEvent, *, epoch: int | None = None) -> RunEvent | None:
        """Append a receipt once per (run_id, attempt); `epoch` is not checked (no runs)."""
        check_receipt(event)
        with self._lock:
            if self._receipt(event.run_id, event.payload["attempt"]) is not None:
                return None
            return self._add(replace(event, payload=serde.to_jsonable(event.payload)))

    def _receipt(self, run_id: str, attempt: int | None) -> RunEvent | None:
        for ev in reversed(self._events.get(run_id, [])):
            if (
                ev.category == Category.DELIVERY
                and ev.type == DELIVERY_TYPE
                and (attempt is None or ev.payload.get("attempt") == attempt)
            ):
                return ev
        return None

    def _page(
        self,
        keyed: list[tuple[Key, RunEvent]],
        after: Key | None,
        before: Key | None,
        categories: Sequence[str] | None,
        limit: int | None,
        way: Direction,
        fmt: Callable[[Key], str],
    ) -> EventPage:
        n = page_limit(limit, self.page_size, self.page_size_max)
        cats = {check_category(c) for c in categories} if categories is not None else None
        hits = [
            (k, ev)
            for k, ev in keyed
            if (after is None or k > after)
            and (before is None or k < before)
            and (cats is None or ev.category in cats)
        ]
        page = hits[:n] if way == "forward" else hits[-n:] if hits else []
        return EventPage(
            [ev for _, ev in page],
            len(hits) > n,
            fmt(page[0][0]) if page else None,
            fmt(page[-1][0]) if page else None,
        )

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
        way = page_direction(direction, after_seq, before_seq)
        with self._lock:
            keyed = [(ev.seq or 0, ev) for ev in self._events.get(run_id, [])]
        return self._page(keyed, after_seq, before_seq, categories, limit, way, str)

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
        way = page_direction(direction, after, before)
        with self._lock:
            keyed = [
                ((self._run_seq[run_id], ev.seq or 0), ev)
                for run_id in self._thread_runs.get(thread_id, [])
                for ev in self._events[run_id]
            ]
        return self._page(keyed, after, before, categories, limit, way, format_thread_cursor)

    def run_usage(self, run_id: str) -> UsageSummary:
        """The run's token usage."""
        with self._lock:
            events = list(self._events.get(run_id, []))
        return summarize_usage(events)

    def thread_usage(self, thread_id: str) -> UsageSummary:
        """The thread's token usage with `by_run` totals."""
        with self._lock:
            runs = {r: list(self._events[r]) for r in self._thread_runs.get(thread_id, [])}
        by_tag: dict[str, Usage] = defaultdict(empty_usage)
        by_run: dict[str, Usage] = {}
        for run_id, events in runs.items():
            summary = summarize_usage(events)
            for tag, usage in summary["by_tag"].items():
                add_usage(by_tag[tag], usage)
            if summary["by_tag"]:
                by_run[run_id] = summary["total"]
        return {**usage_summary(by_tag), "by_run": dict(sorted(by_run.items()))}

    def get_receipt(self, run_id: str, attempt: int | None = None) -> RunEvent | None:
        """The delivery receipt of `attempt` (the latest one's when None)."""
        with self._lock:
            return self._receipt(run_id, attempt)
