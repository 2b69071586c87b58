"""The rows-per-turn helpers of bench/growth.py (no services): which turns' table reads are
counted, the per-turn rows of a window and their table. The bench shows that the rows a turn
reads do not grow with the thread (S4: `delta` mode's history read is bounded by the snapshot
frequency; R4: the reaper keeps the planner statistics)."""

from __future__ import annotations

from bench.growth import ROWS_TABLES, TurnCurve, rows_per_turn, rows_table, rows_windows


def test_s4_rows_windows_are_turns_11_30_and_the_last_ones() -> None:
    """Two windows of `width` turns, the first from turn 11; one when they would overlap."""
    assert rows_windows(200, 20) == [range(11, 31), range(181, 201)]
    assert rows_windows(500, 20) == [range(11, 31), range(481, 501)]
    assert rows_windows(50, 20) == [range(11, 31), range(31, 51)]
    assert rows_windows(40, 20) == [range(11, 31)]
    assert rows_windows(30, 20) == [range(11, 31)]
    assert rows_windows(29, 20) == []
    assert rows_windows(200, 0) == []


def test_s4_rows_per_turn_divides_the_counter_deltas() -> None:
    """Rows read per turn of each table between two readings (a table new in the second
    reading counts from 0)."""
    before = {"checkpoints": 100, "runs": 10}
    after = {"checkpoints": 140, "runs": 30, "checkpoint_writes": 20}
    assert rows_per_turn(before, after, 20) == {
        "checkpoints": 2.0,
        "runs": 1.0,
        "checkpoint_writes": 1.0,
    }


def test_s4_rows_table_has_a_row_per_table_and_a_column_per_window() -> None:
    """One row per table of `ROWS_TABLES`, one column per (mode, window); empty without."""
    full = TurnCurve("full", [], rows={"11-30": {"checkpoints": 2.0}, "181-200": {"runs": 24.4}})
    delta = TurnCurve("delta", [], rows={"11-30": {"checkpoints": 41.5}})
    text = rows_table([full, delta])
    lines = text.splitlines()
    assert "full, turns 11-30" in lines[0] and "delta, turns 11-30" in lines[0]
    assert len(lines) == 2 + len(ROWS_TABLES)
    assert "| 24 " in text and "| 42 " in text
    assert rows_table([TurnCurve("full", [])]) == ""
