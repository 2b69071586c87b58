"""The pure helpers of bench/internals.py: percentiles, stats, ratios and the table (no services)."""

from __future__ import annotations

import math

import pytest

from bench.internals import (
    HEADERS,
    Row,
    Stats,
    fmt_ms,
    fmt_rate,
    fmt_ratio,
    format_table,
    percentile,
    report_dict,
)


def test_percentile_interpolates_linearly() -> None:
    """p50 of an even count is the midpoint; p0/p100 are the extremes; order does not matter."""
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 25) == pytest.approx(1.75)


def test_percentile_p99_of_1_to_100() -> None:
    """p99 of 1..100 is 99.01 with linear interpolation."""
    assert percentile([float(v) for v in range(1, 101)], 99) == pytest.approx(99.01)


def test_percentile_edge_cases() -> None:
    """One value is every percentile; no values is NaN; p outside 0..100 is an error."""
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        percentile([1.0], -1)


def test_stats_of_defaults_to_serial_throughput() -> None:
    """ops/s is 1000 / mean ms unless given."""
    s = Stats.of([1.0, 2.0, 3.0, 4.0])
    assert s.n == 4
    assert s.mean == pytest.approx(2.5)
    assert s.p50 == pytest.approx(2.5)
    assert s.ops_per_s == pytest.approx(400.0)
    assert Stats.of([1.0], ops_per_s=123.0).ops_per_s == 123.0


def test_stats_of_nothing_is_nan() -> None:
    """No samples give NaN figures, not an exception."""
    s = Stats.of([])
    assert s.n == 0
    assert math.isnan(s.p50) and math.isnan(s.mean) and math.isnan(s.ops_per_s)


def test_row_ratio() -> None:
    """ratio = ours p50 / baseline p50; NaN for a zero or missing baseline."""
    ours, base = Stats.of([3.0]), Stats.of([1.5])
    assert Row("x", ours, "raw", base).ratio == pytest.approx(2.0)
    assert math.isnan(Row("x", ours, "raw", Stats(1, 0.0, 0.0, 0.0, math.nan)).ratio)
    assert math.isnan(Row("x", ours, "raw", Stats.of([])).ratio)


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.1234, "0.123"), (1.234, "1.23"), (12.345, "12.35"), (1234.5, "1,234"), (math.nan, "-")],
)
def test_fmt_ms(value: float, text: str) -> None:
    """About three significant digits; NaN is a dash."""
    assert fmt_ms(value) == text


def test_fmt_ratio_and_rate() -> None:
    """Ratios carry an x; rates are integers with separators."""
    assert fmt_ratio(2.345) == "2.35x"
    assert fmt_ratio(math.nan) == "-"
    assert fmt_rate(43539.4) == "43,539"
    assert fmt_rate(math.nan) == "-"


def _rows() -> list[Row]:
    return [
        Row("admit, fresh thread", Stats.of([2.0, 3.0]), "INSERT (tx)", Stats.of([1.0])),
        Row("replay 1024 events -> end", Stats.of([14.43]), "XRANGE - +", Stats.of([3.57])),
    ]


def test_format_table_columns_align() -> None:
    """Header, rule, one line per row; the column separators line up on every line."""
    text = format_table(_rows())
    lines = text.splitlines()
    assert len(lines) == 2 + 2
    assert [c.strip() for c in lines[0].split("|")] == list(HEADERS)
    assert set(lines[1]) <= {"-", "+"}
    bars = [i for i, ch in enumerate(lines[0]) if ch == "|"]
    assert len(bars) == len(HEADERS) - 1
    for line in lines[2:]:
        assert [i for i, ch in enumerate(line) if ch == "|"] == bars
    assert [i for i, ch in enumerate(lines[1]) if ch == "+"] == bars


def test_format_table_cells() -> None:
    """Each row shows ours p50/p99, the baseline's name and p50, the ratio and ops/s."""
    cells = [c.strip() for c in format_table(_rows()).splitlines()[2].split("|")]
    assert cells == ["admit, fresh thread", "2.50", "2.99", "INSERT (tx)", "1.00", "2.50x", "400"]


def test_format_table_without_rows_is_the_header() -> None:
    """An empty report still prints the header and the rule."""
    assert len(format_table([]).splitlines()) == 2


def test_report_dict_is_json_safe() -> None:
    """NaN becomes null, so `--json` writes strict JSON."""
    rows = [Row("x", Stats.of([1.0]), "raw", Stats.of([]))]
    doc = report_dict(rows, {"n": 1}, {"note": 1})
    assert doc["meta"] == {"n": 1} and doc["notes"] == {"note": 1}
    row = doc["rows"][0]
    assert row["ratio"] is None
    assert row["baseline"]["name"] == "raw" and row["baseline"]["p50"] is None
    assert row["ours"]["p50"] == 1.0
