"""Crons: the pure schedule logic — next tick, missed-tick collapse, timezones,
end_time — and the stored run request's round trip."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.crons import schedule as sched
from shared.crons.model import request_from_json, request_to_json
from shared.runs.model import MultitaskStrategy, OnCompletion, OnDisconnect, RunRequest
from shared.serde import dumps, loads

UTC = dt.UTC
T0 = dt.datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)
instants = st.datetimes(
    min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2090, 1, 1), timezones=st.just(UTC)
)
SCHEDULES = ["* * * * *", "*/5 * * * *", "0 * * * *", "30 9 * * 1-5", "0 0 1 * *", "* * * * * */10"]


def test_next_tick_is_strictly_after_and_utc() -> None:
    """Crons: the next tick of a minutely cron at 12:00:30 is 12:01:00 UTC; at a tick
    exactly, the following one (a fired tick never comes back)."""
    assert sched.next_tick("* * * * *", None, T0) == dt.datetime(2026, 3, 1, 12, 1, tzinfo=UTC)
    on_tick = dt.datetime(2026, 3, 1, 12, 1, tzinfo=UTC)
    assert sched.next_tick("* * * * *", None, on_tick) == on_tick + dt.timedelta(minutes=1)


def test_timezone_defaults_to_utc_and_follows_the_named_zone() -> None:
    """Crons: timezone UTC unless the cron says otherwise; 09:00 in New York is 14:00 UTC
    in winter and 13:00 UTC in summer (DST)."""
    winter = dt.datetime(2026, 1, 10, 0, 0, tzinfo=UTC)
    summer = dt.datetime(2026, 7, 10, 0, 0, tzinfo=UTC)
    assert sched.next_tick("0 9 * * *", None, winter).hour == 9
    assert sched.next_tick("0 9 * * *", "America/New_York", winter).hour == 14
    assert sched.next_tick("0 9 * * *", "America/New_York", summer).hour == 13
    with pytest.raises(ValueError, match="timezone"):
        sched.zone("Mars/Olympus")


@pytest.mark.parametrize("bad", ["", "* * *", "61 * * * *", "* * * * * * *", "hello world * * *"])
def test_invalid_schedules_are_refused(bad: str) -> None:
    """Crons: croniter parses; what it refuses is a ValueError (the API's 422 on `schedule`)."""
    with pytest.raises(ValueError):
        sched.check(bad)


def test_a_schedule_that_never_ticks_is_a_value_error() -> None:
    """Crons: "0 0 31 2 *" parses but has no tick; the API answers 422, not 500."""
    with pytest.raises(ValueError):
        sched.min_gap_s("0 0 31 2 *", None, T0)


def test_missed_ticks_collapse_into_one() -> None:
    """Crons: after downtime the due tick fires once and the cron moves to the first tick
    after now, not to the next missed one."""
    due = dt.datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    now = due + dt.timedelta(hours=5, seconds=10)
    nxt = sched.advance("* * * * *", None, due, now, None)
    assert nxt == dt.datetime(2026, 3, 1, 17, 1, tzinfo=UTC)


def test_end_time_stops_the_schedule() -> None:
    """Crons: no tick after end_time (None: nothing left to fire)."""
    end = dt.datetime(2026, 3, 1, 12, 5, tzinfo=UTC)
    assert sched.first_run("* * * * *", None, T0, end) is not None
    assert sched.advance("* * * * *", None, end, end, end) is None


def test_min_gap() -> None:
    """The gap the API compares with cron_min_interval_s (seconds as a sixth field)."""
    assert sched.min_gap_s("* * * * *", None, T0) == 60
    assert sched.min_gap_s("* * * * * */10", None, T0) == 10
    assert sched.min_gap_s("0,1 * * * *", None, T0) == 60


@given(
    schedule=st.sampled_from(SCHEDULES),
    due=instants,
    lag=st.floats(min_value=0, max_value=10 * 86_400),
    tz=st.sampled_from([None, "Europe/Paris", "Asia/Kolkata", "America/New_York"]),
)
def test_advance_properties(schedule: str, due: dt.datetime, lag: float, tz: str | None) -> None:
    """Crons (property): the next tick is after both the fired tick and now, it is a tick
    of the schedule, and no tick lies between now and it (so exactly one missed tick fired)."""
    now = due + dt.timedelta(seconds=lag)
    nxt = sched.advance(schedule, tz, due, now, None)
    assert nxt is not None and nxt > now and nxt > due
    assert nxt.tzinfo is not None and nxt.utcoffset() == dt.timedelta(0)
    assert sched.next_tick(schedule, tz, now) == nxt


def test_stored_request_round_trips() -> None:
    """Crons: the RunRequest a cron stores comes back equal, enums included, and every
    field travels (a field runs gain later, a webhook, needs no change in crons)."""
    request = RunRequest(
        thread_id="",
        assistant_id="a",
        input={"messages": [{"role": "user", "content": "hi"}]},
        config={"configurable": {"x": 1}},
        metadata={"k": "v"},
        kwargs={"stream_mode": ["values"]},
        on_disconnect=OnDisconnect.CONTINUE,
        multitask_strategy=MultitaskStrategy.REJECT,
        create_thread=True,
        on_completion=OnCompletion.KEEP,
    )
    stored = loads(dumps(request_to_json(request)))
    assert set(stored) == {f.name for f in dataclasses.fields(RunRequest)}
    back = request_from_json(stored)
    assert back == request
    assert back.multitask_strategy is MultitaskStrategy.REJECT
    assert back.on_completion is OnCompletion.KEEP
