"""The pure helpers of bench/growth.py (no services): the turn windows and their means, the
ratios, the seeding plan, RSS per item and the tables.

The bench measures that cost does not grow with the work: per turn as one thread grows in
both checkpoint modes (S4), per run as finished runs pile up in the database (R8: the run
records are kept), per idle stream (B6: an idle stream only gets heartbeats) and per run in
flight."""

from __future__ import annotations

import math

import pytest

from bench.growth import (
    Batch,
    Memory,
    Turn,
    TurnCurve,
    deltas,
    marginal_kib,
    memory_table,
    per_item_kib,
    points_within,
    ratio,
    runs_table,
    seed_plan,
    turns_table,
    window,
    window_mean,
)


def test_points_stop_at_the_last_turn_and_include_it() -> None:
    assert points_within(500) == [1, 10, 50, 100, 250, 500]
    assert points_within(300) == [1, 10, 50, 100, 250, 300]
    assert points_within(100) == [1, 10, 50, 100]
    assert points_within(1) == [1]
    assert points_within(0) == []


def test_windows_are_centred_and_shifted_to_stay_within_the_turns() -> None:
    assert window(500, 1, 10) == range(1, 11)
    assert window(500, 10, 10) == range(5, 15)
    assert window(500, 250, 10) == range(245, 255)
    assert window(500, 500, 10) == range(491, 501)
    assert window(5, 3, 10) == range(1, 6)  # fewer turns than the width: all of them
    with pytest.raises(ValueError):
        window(10, 11, 3)


def test_s4_window_mean_of_a_growing_cost_shows_the_growth() -> None:
    """A per-turn cost linear in the turn (what S4's delta mode is meant to avoid for the
    checkpoint's bytes) has window means that grow with the point; a flat one does not."""
    linear = [float(t) for t in range(1, 501)]
    assert window_mean(linear, 1, 10) == pytest.approx(5.5)
    assert window_mean(linear, 500, 10) == pytest.approx(495.5)
    flat = [3.0] * 500
    assert window_mean(flat, 1, 10) == window_mean(flat, 500, 10) == 3.0


def test_deltas_of_cumulative_counters() -> None:
    assert deltas([0.0, 1.0, 3.0, 6.0]) == [1.0, 2.0, 3.0]
    assert deltas([5.0]) == []


def test_ratio_refuses_missing_or_empty_bases() -> None:
    assert ratio(4.0, 2.0) == 2.0
    assert ratio(None, 2.0) is None
    assert ratio(1.0, 0.0) is None
    assert ratio(1.0, None) is None
    assert ratio(math.nan, 1.0) is None


def test_r8_seed_plan_grows_the_finished_runs_in_chunks_of_whole_threads() -> None:
    assert seed_plan(0, 50_000, 50_000) == [(0, 50_000)]
    assert seed_plan(50_000, 200_000, 50_000) == [
        (50_000, 100_000),
        (100_000, 150_000),
        (150_000, 200_000),
    ]
    assert seed_plan(10, 10) == []
    with pytest.raises(ValueError):
        seed_plan(100, 10)


def test_b6_rss_per_idle_stream_and_per_added_stream() -> None:
    """KiB per item from before, and between consecutive counts of the same process: flat
    when the second stays near the first."""
    assert per_item_kib(1000.0, 1500.0, 10) == 50.0
    assert per_item_kib(1000.0, 1500.0, 0) is None
    items = [
        Memory("web", 1000, 1000, 100_000.0, 150_000.0),
        Memory("web", 5000, 5000, 100_000.0, 350_000.0),
        Memory("worker", 1000, 800, 50_000.0, 90_000.0),
    ]
    assert marginal_kib(items) == [50.0, 50.0, 50.0]
    text = memory_table(items)
    assert "| web " in text and "5,000" in text and "| 50.0 " in text


def test_s4_turn_table_has_a_row_per_point_and_the_last_over_first_ratio() -> None:
    turns = [
        Turn(latency_ms=10.0 + t, web_ms=1.0, worker_ms=2.0, postgres_ms=1.0) for t in range(20)
    ]
    text = turns_table([TurnCurve("delta", turns)], width=4)
    lines = text.splitlines()
    assert len(lines) == 2 + 3 + 1  # header, rule, points 1, 10, 20, ratio
    assert "ratio 20/1" in text
    assert "| 1.00x " in text  # the flat CPU columns
    assert TurnCurve("full", [Turn(1, 1, 1, 1, ok=False)]).failed == 1


def test_r8_runs_table_joins_the_passes_and_compares_with_the_empty_database() -> None:
    def batch(size: int, p50: float, cpu: float) -> Batch:
        return Batch(size, 100, 0, p50, web_ms=cpu / 2, worker_ms=cpu / 4, postgres_ms=cpu / 4)

    text = runs_table(
        [batch(0, 100, 40), batch(0, 100, 40), batch(200_000, 150, 60), batch(200_000, 150, 60)]
    )
    assert "200,000" in text
    assert "100 / 100" in text
    assert "1.50x" in text  # both CPU and p50 vs 0
    assert runs_table([]) == ""
