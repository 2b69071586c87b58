"""Pure schedule arithmetic: parse a cron expression, the next tick, missed-tick collapse.

No IO, so unit and property tests cover it. Ticks are computed in the cron's timezone (UTC
unless it names one: "0 9 * * *" in Europe/Paris is 09:00 Paris time, DST included) and
returned as aware UTC datetimes, which is what PostgreSQL stores and compares.

Missed ticks collapse: after downtime, the due tick (`next_run_at`, the earliest missed) fires
once and the cron moves to the first tick strictly after *now*, not to the next missed one,
so a scheduler that was down for a day does not fire a day of ticks at once.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

UTC = dt.UTC
SAMPLE_TICKS = 24
"""How many consecutive ticks `min_gap_s` looks at (a schedule's pattern repeats within a
day for every minute/hour field combination that matters to the limit)."""


def zone(name: str | None) -> ZoneInfo:
    """The IANA zone `name` (UTC when None); ValueError for an unknown one."""
    if name is None:
        return ZoneInfo("UTC")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown IANA timezone {name!r}") from exc


def check(schedule: str) -> None:
    """Refuse what croniter cannot parse: 5 fields (minute hour day month weekday), or 6 with
    seconds last; ValueError naming why."""
    fields = schedule.split()
    if len(fields) not in (5, 6):
        raise ValueError(
            "a cron expression has 5 fields (minute hour day month weekday), or 6 with seconds last"
        )
    if not croniter.is_valid(schedule):
        raise ValueError(f"invalid cron expression {schedule!r}")


def next_tick(schedule: str, tz: str | None, after: dt.datetime) -> dt.datetime:
    """The first tick strictly after `after` (aware), in UTC."""
    local = after.astimezone(zone(tz))
    nxt = croniter(schedule, local).get_next(dt.datetime)
    assert isinstance(nxt, dt.datetime)
    return nxt.astimezone(UTC)


def min_gap_s(schedule: str, tz: str | None, start: dt.datetime) -> float:
    """The shortest gap, in seconds, between consecutive ticks after `start` (sampled)."""
    ticks = [next_tick(schedule, tz, start)]
    for _ in range(SAMPLE_TICKS):
        ticks.append(next_tick(schedule, tz, ticks[-1]))
    return min((b - a).total_seconds() for a, b in zip(ticks, ticks[1:], strict=False))


def first_run(
    schedule: str, tz: str | None, now: dt.datetime, end_time: dt.datetime | None
) -> dt.datetime | None:
    """The next tick after `now`, or None when it falls after `end_time` (nothing to fire)."""
    tick = next_tick(schedule, tz, now)
    return None if end_time is not None and tick > end_time else tick


def advance(
    schedule: str,
    tz: str | None,
    due: dt.datetime,
    now: dt.datetime,
    end_time: dt.datetime | None,
) -> dt.datetime | None:
    """The tick after the due tick `due` has fired: the first strictly after both `due` and
    `now` (missed ticks collapse into the one that fired), None past `end_time`."""
    return first_run(schedule, tz, max(due, now), end_time)
