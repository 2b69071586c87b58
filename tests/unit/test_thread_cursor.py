"""Thread stream ids (A1, GET /threads/{id}/stream): `<run_id>:<stream id>` and
`<run_id>:done` round-trip; anything else is a 400 naming Last-Event-ID; the official
thread stream modes filter as the official server does."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import serde
from shared.bridge.base import Event
from shared.bridge.thread_follow import (
    DONE,
    StartAt,
    ThreadCursor,
    event_id,
    keeps,
    parse_thread_cursor,
)
from shared.errors import StreamCursorInvalid

ids = st.builds(lambda ms, seq: f"{ms}-{seq}", st.integers(0, 2**63), st.integers(0, 2**63))
entries = st.one_of(ids, st.just(DONE))


@given(st.uuids(), entries)
def test_a1_thread_ids_round_trip(run: uuid.UUID, entry: str) -> None:
    """A1 thread stream: every id the thread stream sends parses back to its run and entry."""
    sent = event_id(str(run), entry)
    assert parse_thread_cursor(sent) == ThreadCursor(str(run), entry)
    assert parse_thread_cursor(sent).encode() == sent  # type: ignore[union-attr]


@pytest.mark.parametrize("value", [None, "", "  "])
def test_a1_thread_no_cursor_follows_live(value: str | None) -> None:
    """A1 thread stream: no Last-Event-ID: the run in progress, then new runs."""
    assert parse_thread_cursor(value) is StartAt.LIVE


@pytest.mark.parametrize("value", ["-1", "0", "-"])
def test_a1_thread_start_cursors_walk_every_run(value: str) -> None:
    """A1 thread stream: the SDKs' "from the start" cursors walk the thread from its first run."""
    assert parse_thread_cursor(value) is StartAt.FIRST


RUN = "0f1e2d3c-4b5a-4697-8877-665544332211"
"""A fixed run id: parameter ids must be the same in every collection (pytest-xdist's
workers each collect, and compare)."""

BAD = [
    "1-1",  # a run stream id: which run?
    "nope",
    RUN,
    f"{RUN}:",
    f"{RUN}:-1",
    f"{RUN}:abc",
    f"{RUN}:1-2-3",
    f"{RUN}:DONE",
    "not-a-uuid:1-1",
    f"{RUN}:1-1:extra",
]


@pytest.mark.parametrize("value", BAD)
def test_b4_thread_bad_ids_are_a_400_naming_last_event_id(value: str) -> None:
    """A1 thread stream: a malformed Last-Event-ID is a client error naming the header."""
    with pytest.raises(StreamCursorInvalid) as err:
        parse_thread_cursor(value)
    assert err.value.status == 400 and err.value.field == "Last-Event-ID"


@given(st.text(max_size=80))
def test_a1_thread_any_text_parses_or_is_a_400(value: str) -> None:
    """A1 thread stream: whatever a client sends, the answer is a cursor or a 400, never a crash."""
    try:
        parse_thread_cursor(value)
    except StreamCursorInvalid as exc:
        assert exc.field == "Last-Event-ID"


def meta(data: dict[str, object]) -> Event:
    return Event("x", "metadata", serde.dumps_str(data))


def test_a1_thread_stream_modes_filter_like_the_official_server() -> None:
    """A1 thread stream: run_modes keeps every run event; lifecycle only starts and run_done;
    state_update only state updates (none published here)."""
    start = meta({"run_id": "r", "attempt": 1})
    done = meta({"status": "run_done", "run_id": "r", "run_status": "success"})
    values = Event("x", "values", "{}")
    update = Event("x", "state_update", "{}")
    everything = [start, done, values, update]
    assert [keeps(set(), e) for e in everything] == [True, True, True, True]
    assert [keeps({"run_modes"}, e) for e in everything] == [True, True, True, False]
    assert [keeps({"lifecycle"}, e) for e in everything] == [True, True, False, False]
    assert [keeps({"state_update"}, e) for e in everything] == [False, False, False, True]
    assert keeps({"lifecycle"}, Event("x", "metadata", "not json")) is False
