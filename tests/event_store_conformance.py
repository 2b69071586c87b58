"""The `EventStore` conformance suite (J2, J4, J5): what every backend must do alike.

A backend's test module subclasses `EventStoreConformance` and provides two fixtures:
`make_store(**settings)` (a store with the given page/payload settings) and
`new_run(thread_id=None)` (a `(thread_id, run_id)` events may be appended to; a new
thread unless one is given). Seqs are asserted relative to a run's first appended event,
since Postgres numbers a run's `created` lifecycle event 1 and the in-process store has
none. What needs a `runs` table (RunNotFound, the L2 receipt fence, concurrent processes)
stays in the Postgres module.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pytest

from shared.journal import (
    DeliveryOutcome,
    EventStore,
    RunEvent,
    parse_thread_cursor,
    write_delivery_receipt,
)

NewRun = Callable[..., tuple[str, str]]


class MakeStore(Protocol):
    """Builds a store of the backend under test."""

    def __call__(
        self, *, page_size: int = ..., page_size_max: int = ..., max_payload_bytes: int = ...
    ) -> EventStore: ...


def ev(run_id: str, tid: str, category: str = "tool", **payload: Any) -> RunEvent:
    """A `<category>.test` event carrying `payload`."""
    return RunEvent(run_id, tid, category, f"{category}.test", payload)


class EventStoreConformance:
    """Store behaviour both backends share; subclass it with the two fixtures."""

    @pytest.fixture
    def store(self, make_store: MakeStore) -> EventStore:
        """The store most tests use: pages of 4 (at most 6), payloads up to 2 KiB."""
        return make_store(page_size=4, page_size_max=6, max_payload_bytes=2048)

    # --- J4: pages ----------------------------------------------------------------------------
    def test_j4_run_pages_both_directions_with_category_filter(
        self, new_run: NewRun, store: EventStore
    ) -> None:
        """J4: after_seq/before_seq, forward/backward, category filter, default and max page size."""
        tid, run_id = new_run()
        cats = ["model", "tool", "message"]
        stored = store.append_batch([ev(run_id, tid, cats[i % 3], i=i) for i in range(20)])
        base = stored[0].seq or 0
        seq = [e.seq for e in stored]

        page = store.list_run_events(run_id, categories=["tool"])
        assert [e.payload["i"] for e in page.events] == [1, 4, 7, 10] and page.has_more
        page = store.list_run_events(run_id, categories=["tool"], after_seq=int(page.last or 0))
        assert [e.payload["i"] for e in page.events] == [13, 16, 19] and not page.has_more
        page = store.list_run_events(run_id, categories=["tool", "model"], before_seq=seq[19])
        assert [e.payload["i"] for e in page.events] == [13, 15, 16, 18] and page.has_more
        page = store.list_run_events(
            run_id, categories=["tool", "model"], before_seq=int(page.first or 0), limit=100
        )
        assert len(page.events) == 6 and page.events[-1].payload["i"] == 12  # clamped to max 6
        page = store.list_run_events(run_id, after_seq=seq[2], before_seq=seq[9])
        assert [e.seq for e in page.events] == seq[3:7] and page.has_more
        page = store.list_run_events(run_id, direction="backward", limit=2)
        assert [e.seq for e in page.events] == [base + 18, base + 19] and page.has_more

    def test_j4_run_pages_cursors_and_refusals(
        self, new_run: NewRun, make_store: MakeStore
    ) -> None:
        """J4: after/before cursors, direction, category filter, clamped page size; bad
        categories and limits are ValueError."""
        store = make_store(page_size=3, page_size_max=4)
        tid, run_id = new_run()
        stored = store.append_batch(
            [ev(run_id, tid, "tool" if i % 2 else "model", i=i) for i in range(10)]
        )
        s = [e.seq or 0 for e in stored]  # s[i] is the seq of event i
        page = store.list_run_events(run_id, categories=["tool", "model"])
        assert [e.seq for e in page.events] == s[0:3] and page.has_more
        assert page.last == str(s[2])
        page = store.list_run_events(run_id, after_seq=s[7])
        assert [e.seq for e in page.events] == s[8:10] and not page.has_more
        page = store.list_run_events(run_id, before_seq=s[9], limit=100)
        assert [e.seq for e in page.events] == s[5:9] and page.has_more
        page = store.list_run_events(run_id, categories=["tool"], direction="backward", limit=2)
        assert [e.payload["i"] for e in page.events] == [7, 9] and page.first == str(s[7])
        with pytest.raises(ValueError):
            store.list_run_events(run_id, categories=["nope"])
        with pytest.raises(ValueError):
            store.list_run_events(run_id, limit=0)
        with pytest.raises(ValueError):
            store.append(ev(run_id, tid, "nope"))

    def test_j4_thread_pages_span_runs_in_admission_order(
        self, new_run: NewRun, store: EventStore
    ) -> None:
        """J4: a thread's events come run by run (admission order), each by seq; cursors both ways."""
        tid, first = new_run()
        _, second = new_run(tid)
        store.append_batch([ev(first, tid, "model", i=i) for i in range(3)])
        store.append_batch([ev(second, tid, "model", i=10 + i) for i in range(3)])
        store.append_batch([ev(first, tid, "tool", i=3)])
        page = store.list_thread_events(tid, categories=["model", "tool"], limit=5)
        assert [e.payload["i"] for e in page.events] == [0, 1, 2, 3, 10] and page.has_more
        nxt = store.list_thread_events(
            tid, categories=["model", "tool"], after=parse_thread_cursor(page.last or "")
        )
        assert [e.payload["i"] for e in nxt.events] == [11, 12] and not nxt.has_more
        back = store.list_thread_events(
            tid, categories=["model", "tool"], before=parse_thread_cursor(nxt.first or ""), limit=2
        )
        assert [e.payload["i"] for e in back.events] == [3, 10] and back.has_more
        assert {e.run_id for e in page.events} == {first, second}

    def test_j4_truncation_and_nul(self, new_run: NewRun, store: EventStore) -> None:
        """J4: a payload past max bytes is stored as the marker; NUL characters are replaced."""
        tid, run_id = new_run()
        big = {"content": "y" * 10_000}
        stored = store.append_batch([ev(run_id, tid, text="a\x00b"), ev(run_id, tid, **big)])
        page = store.list_run_events(run_id, categories=["tool"])
        assert page.events[0].payload == {"text": "a\ufffdb"}
        marker = page.events[1].payload
        assert marker["_truncated"] is True and marker["original_bytes"] > 10_000
        assert marker["preview"].startswith('{"content":"yyy')
        assert [e.seq for e in page.events] == [e.seq for e in stored]

    # --- J2: usage ----------------------------------------------------------------------------
    def test_j2_usage_by_tag_and_by_run(self, new_run: NewRun, store: EventStore) -> None:
        """J2: usage sums `model.end` events by tag (untagged: lead_agent); a thread's adds
        each run's total under `by_run`; other events count nothing."""
        tid, first = new_run()
        _, second = new_run(tid)
        u = {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}
        store.append_batch(
            [
                RunEvent(first, tid, "model", "model.end", {"tag": "lead_agent", "usage": u}),
                RunEvent(first, tid, "model", "model.end", {"tag": "subagent:x", "usage": u}),
                RunEvent(first, tid, "model", "model.start", {"usage": u}),
                RunEvent(first, tid, "lifecycle", "run.progress", {"usage": {"total": u}}),
                RunEvent(second, tid, "model", "model.end", {"usage": u}),
            ]
        )
        double = {k: 2 * v for k, v in u.items()}
        assert store.run_usage(first) == {
            "total": double,
            "by_tag": {"lead_agent": u, "subagent:x": u},
        }
        assert store.thread_usage(tid) == {
            "total": {k: 3 * v for k, v in u.items()},
            "by_tag": {"lead_agent": double, "subagent:x": u},
            "by_run": dict(sorted({first: double, second: u}.items())),
        }

    # --- J5: receipts -------------------------------------------------------------------------
    def test_j5_receipt_is_written_once_per_attempt(
        self, new_run: NewRun, store: EventStore, tmp_path: Path
    ) -> None:
        """J5: a retried receipt write finds the first; a conflict leaves no seq gap; attempts differ."""
        tid, run_id = new_run()
        (tmp_path / tid / "outputs").mkdir(parents=True)
        (tmp_path / tid / "outputs" / "a.md").write_text("A")
        args = (store, run_id, tid, 1, True, ["outputs/a.md"], tmp_path)
        assert write_delivery_receipt(*args) is DeliveryOutcome.WRITTEN
        assert write_delivery_receipt(*args) is DeliveryOutcome.ALREADY_WRITTEN
        first = store.get_receipt(run_id, 1)
        assert first is not None and first.seq is not None
        assert store.append(ev(run_id, tid)).seq == first.seq + 1  # no gap
        assert write_delivery_receipt(store, run_id, tid, 2, False, [], tmp_path) is (
            DeliveryOutcome.WRITTEN
        )
        receipts = store.list_run_events(run_id, categories=["delivery"]).events
        assert [(r.type, r.payload["attempt"]) for r in receipts] == [
            ("run.delivery", 1),
            ("run.delivery", 2),
        ]
        assert first.payload["coverage"] == [
            {
                "path": "outputs/a.md",
                "exists": True,
                "size": 1,
                "sha256": hashlib.sha256(b"A").hexdigest(),
            }
        ]
        latest = store.get_receipt(run_id)
        assert latest is not None and latest.payload["attempt"] == 2
        assert store.get_receipt(run_id, 3) is None

    def test_j5_a_receipt_has_the_receipt_shape(self, new_run: NewRun, store: EventStore) -> None:
        """J5: only a delivery/run.delivery event with an integer attempt is a receipt."""
        tid, run_id = new_run()
        with pytest.raises(ValueError):
            store.append_receipt(ev(run_id, tid, "delivery", attempt=1))
        with pytest.raises(ValueError):
            store.append_receipt(RunEvent(run_id, tid, "delivery", "run.delivery", {}))

    def test_j5_concurrent_receipt_writers_write_one(
        self, new_run: NewRun, store: EventStore, tmp_path: Path
    ) -> None:
        """J5: 6 writers race on the same (run, attempt): exactly one receipt exists."""
        tid, run_id = new_run()
        barrier = threading.Barrier(6)
        outcomes: list[DeliveryOutcome] = []

        def write() -> None:
            barrier.wait(timeout=30)
            outcomes.append(write_delivery_receipt(store, run_id, tid, 1, True, [], tmp_path))

        threads = [threading.Thread(target=write) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(o.value for o in outcomes) == ["already_written"] * 5 + ["written"]
        receipts = store.list_run_events(run_id, categories=["delivery"]).events
        assert len(receipts) == 1
        assert store.append(ev(run_id, tid)).seq == (receipts[0].seq or 0) + 1
