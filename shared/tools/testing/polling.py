"""Polling until a condition holds: the one `wait_for` of tests and benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """`wait_for` gave up: the condition did not hold within its timeout."""


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float = 10.0,
    interval: float = 0.1,
    *,
    what: str = "the condition",
    retry_on: tuple[type[Exception], ...] = (),
    detail: Callable[[], str] | None = None,
) -> T:
    """Call `predicate` every `interval` s until it returns something truthy; return that.

    An exception of a `retry_on` type counts as "not yet" (a service coming back). On timeout
    `WaitTimeout` names `what` was awaited, the last such exception, and `detail()` (for
    example the logs of the processes involved).
    """
    end = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = predicate()
        except retry_on as exc:
            last_exc = exc
        else:
            if value:
                return value
        if time.monotonic() >= end:
            break
        time.sleep(interval)
    why = f" (last error: {last_exc!r})" if last_exc is not None else ""
    more = f"\n{detail()}" if detail is not None else ""
    raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}{why}{more}")
