"""B4: Last-Event-ID parsing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.bridge.base import BEFORE_FIRST, Gap, parse_cursor
from shared.errors import StreamCursorInvalid


@pytest.mark.parametrize("value", [None, "", "-1", "0", "-", " -1 "])
def test_b4_start_cursors_mean_from_the_start(value: str | None) -> None:
    """B4: -1, 0 and - (and no header) mean "from the start of what is retained"."""
    assert parse_cursor(value) == ""


@pytest.mark.parametrize("value", ["1700000000000-0", "5-3", "0-0"])
def test_b4_stream_ids_pass(value: str) -> None:
    """B4: a stream id is kept as is."""
    assert parse_cursor(value) == value


@pytest.mark.parametrize("value", ["mock_event_4", "abc", "12", "1-2-3", "-5", "1-", "1.5-0"])
def test_b4_a_foreign_cursor_reads_from_the_start(value: str) -> None:
    """B4, B5: an id not of this server's shape cannot be placed: read from the very first
    event, checked (a gap if the start was trimmed), so nothing is skipped silently."""
    assert parse_cursor(value) == BEFORE_FIRST


@pytest.mark.parametrize("value", ["9" * 30 + "-0", "a b", "x" * 300, "a\x01b", "é"])
def test_b4_malformed_cursor_is_a_client_error(value: str) -> None:
    """B4: a malformed cursor is a clear client error, never a Redis error."""
    with pytest.raises(StreamCursorInvalid) as info:
        parse_cursor(value)
    assert info.value.status == 400
    assert "Last-Event-ID" in str(info.value)


@given(st.text(max_size=40))
def test_b4_parse_never_crashes(value: str) -> None:
    """Any header value either parses or raises StreamCursorInvalid."""
    try:
        out = parse_cursor(value)
    except StreamCursorInvalid:
        return
    assert out == "" or "-" in out


def test_b5_gap_payload_shape() -> None:
    """B5: the gap control event carries the exact fields clients rely on."""
    payload = Gap("r1", "5-0", None, None).payload()
    assert payload == {
        "code": "stream_replay_gap",
        "run_id": "r1",
        "requested_event_id": "5-0",
        "earliest_available_event_id": None,
        "latest_available_event_id": None,
        "recovery": "reload_durable_state",
    }


# --- the pure gap decision (B5) -------------------------------------------------------------
from shared.bridge.base import ReadKind, StreamMeta, classify_read  # noqa: E402


def meta(n: int, kept_from: int, end: int | None = None) -> StreamMeta:
    """A stream whose ids are f"{i}-0" for i in 1..n, with everything below kept_from trimmed."""
    last = end if end is not None else n
    return StreamMeta(
        exists=True,
        count=n,
        origin="1-0",
        last=f"{last}-0",
        trimmed=f"{kept_from - 1}-0" if kept_from > 1 else None,
    )


@given(n=st.integers(1, 200), data=st.data())
def test_b5_classify_is_exact(n: int, data: st.DataObject) -> None:
    """B5: gap iff the entry right after the cursor was trimmed; beyond iff after the last id."""
    kept_from = data.draw(st.integers(1, n))
    c = data.draw(st.integers(1, n + 5))
    kind = classify_read(f"{c}-0", meta(n, kept_from))
    if c > n:
        assert kind is ReadKind.BEYOND
    elif c + 1 < kept_from:
        assert kind is ReadKind.GAP
    else:
        assert kind is ReadKind.OK


def test_b5_classify_missing_start_and_old_incarnation() -> None:
    """B5: a missing stream, a start cursor, and a cursor from before a Redis loss."""
    assert classify_read("5-0", StreamMeta(False, 0, None, None, None)) is ReadKind.MISSING
    assert classify_read("", meta(10, 5)) is ReadKind.OK
    reborn = StreamMeta(True, 3, "100-0", "102-0", None)
    assert classify_read("50-0", reborn) is ReadKind.GAP


def test_b5_before_first_cursor_is_checked() -> None:
    """B4/B5: 0-0 means "before the first event": a gap once the start was trimmed."""
    assert classify_read("0-0", meta(10, 1)) is ReadKind.OK
    assert classify_read("0-0", meta(10, 4)) is ReadKind.GAP


def test_b5_a_cursor_in_a_range_lost_in_a_failover_is_a_gap() -> None:
    """B5: ids (lo, hi] were issued and lost with a failover (the publisher republished their
    events with ids after hi): a cursor in that range is a gap, its bounds are not."""
    repaired = StreamMeta(True, 9, "1-0", "20-0", None, StreamMeta.parse_lost(b"5-0 8-0 "))
    assert repaired.lost == (("5-0", "8-0"),)
    assert classify_read("5-0", repaired) is ReadKind.OK  # the last entry that survived
    assert classify_read("6-0", repaired) is ReadKind.GAP
    assert classify_read("8-0", repaired) is ReadKind.GAP
    assert classify_read("9-0", repaired) is ReadKind.OK
    assert StreamMeta.parse_lost(None) == ()
