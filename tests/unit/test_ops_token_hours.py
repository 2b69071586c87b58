"""The ops view's token chart reads only the hours that may still change (`TokenHours`):
an hour that ended a run's longest life ago is kept, and never read again."""

from __future__ import annotations

from shared.ops.collector import TokenHours

H = 3600
NOW = 1_000 * H + 1_800  # half past an hour


def test_ops_token_hours_first_refresh_reads_the_whole_chart_then_only_unsettled_hours() -> None:
    hours = TokenHours(settle_s=H + 60)
    assert hours.since(NOW, 24) == NOW // H * H - 23 * H
    read = {NOW // H * H - 23 * H: (5, 7), NOW // H * H: (1, 2)}
    chart = hours.chart(NOW, 24, read)
    assert [h["hour"] for h in chart] == [NOW // H * H - k * H for k in range(23, -1, -1)]
    assert chart[0] == {"hour": NOW // H * H - 23 * H, "input": 5, "output": 7}
    assert chart[-1] == {"hour": NOW // H * H, "input": 1, "output": 2}
    assert sum(h["input"] for h in chart) == 6
    # The hours that ended more than settle_s ago are kept: the next refresh reads from the
    # first hour that was still young (the one before the last, at half past).
    assert hours.since(NOW + 60, 24) == NOW // H * H - H


def test_ops_token_hours_keep_what_they_read_and_forget_what_left_the_chart() -> None:
    hours = TokenHours(settle_s=H + 60)
    start = NOW // H * H
    hours.chart(NOW, 3, {start - 2 * H: (3, 3)})
    # A settled hour keeps its figures whatever a later read says (it reads no such hour).
    later = hours.chart(NOW + 60, 3, {start - 2 * H: (99, 99), start: (4, 4)})
    assert later[0] == {"hour": start - 2 * H, "input": 3, "output": 3}
    assert later[-1] == {"hour": start, "input": 4, "output": 4}
    # Hours later, the chart has moved on: what left it is gone, the newest are read.
    far = NOW + 10 * H
    assert hours.since(far, 3) == far // H * H - 2 * H
    hours.chart(far, 3, {})
    assert hours.since(far + 10 * H, 3) == (far + 10 * H) // H * H - 2 * H
    assert all(h >= far // H * H - 2 * H for h in hours._settled)


def test_ops_token_hours_never_keep_the_current_or_a_young_hour() -> None:
    hours = TokenHours(settle_s=H + 60)
    start = NOW // H * H
    hours.chart(NOW, 2, {start - H: (1, 1), start: (2, 2)})
    # The previous hour ended 30 minutes ago, under the settle time: it is read again.
    assert hours.since(NOW, 2) == start - H
    assert hours.chart(NOW, 2, {start - H: (5, 5), start: (6, 6)})[0]["input"] == 5
