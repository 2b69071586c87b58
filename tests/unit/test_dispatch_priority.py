"""R4, P7: a run's queue priority from its class and its user's runs in flight (pure)."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from shared.runs.priority import BACKGROUND, FOREGROUND, PRIORITY_STEPS, REDISPATCH, run_priority


@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=1, max_value=64))
def test_r4_p7_every_caller_run_is_ahead_of_every_cron_firing(position: int, step: int) -> None:
    """R4, P7: whatever the positions, a run a caller asked for is ahead of a re-dispatch, and
    a re-dispatch ahead of any cron firing; every priority is one of the queue's."""
    fg = run_priority(position, background=False, step=step)
    bg = run_priority(0, background=True, step=step)
    assert fg in FOREGROUND and bg in BACKGROUND
    assert fg < REDISPATCH < bg
    assert {fg, bg, REDISPATCH} <= set(PRIORITY_STEPS)


@given(
    st.integers(min_value=0, max_value=10_000),
    st.integers(min_value=0, max_value=10_000),
    st.integers(min_value=1, max_value=64),
    st.booleans(),
)
def test_r4_p7_a_user_with_fewer_runs_in_flight_is_never_behind(
    a: int, b: int, step: int, background: bool
) -> None:
    """R4, P7: within a class the priority never gets better with more runs in flight, and
    each `step` of them lowers it one step until the class's last."""
    lo, hi = sorted((a, b))
    assert run_priority(lo, background=background, step=step) <= run_priority(
        hi, background=background, step=step
    )
    steps = BACKGROUND if background else FOREGROUND
    assert (
        run_priority(hi, background=background, step=step) == steps[min(len(steps) - 1, hi // step)]
    )


def test_r4_p7_the_first_runs_of_a_user_share_the_first_priority() -> None:
    """R4, P7: with the default step of 4, a user's first four runs in flight are at the first
    priority, the fifth one step lower; a negative position counts as none."""
    assert [run_priority(n, background=False, step=4) for n in (0, 3, 4, 8, 12, 99)] == [
        0,
        0,
        1,
        2,
        3,
        3,
    ]
    assert run_priority(-5, background=True, step=4) == BACKGROUND[0]
