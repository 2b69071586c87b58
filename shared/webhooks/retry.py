"""What one delivery attempt's result means: delivered, retry after a backoff, or give up.

Pure functions (no IO), so the schedule is unit- and property-testable. Retried: a
connection error, a timeout, 429 and 5xx — the receiver may be back later. Not retried:
any other answer (a 4xx says the request itself is refused; a redirect is refused because
we never follow one, so the URL is wrong), and an address the egress policy refuses.
"""

from __future__ import annotations

import email.utils
import enum
import random
from dataclasses import dataclass


class AttemptOutcome(enum.StrEnum):
    """How one attempt ended (the metric's label and the audit event's `outcome`)."""

    DELIVERED = "delivered"  # a 2xx
    RETRYABLE_STATUS = "retryable_status"  # 429 or 5xx
    REJECTED = "rejected"  # another 4xx (or 1xx)
    REDIRECT = "redirect"  # a 3xx: never followed
    CONNECTION_ERROR = "connection_error"  # DNS, refused, reset, TLS
    TIMEOUT = "timeout"
    REFUSED = "refused"  # the egress policy refused the resolved address

    @property
    def retryable(self) -> bool:
        """Whether another attempt may succeed."""
        return self in (
            AttemptOutcome.RETRYABLE_STATUS,
            AttemptOutcome.CONNECTION_ERROR,
            AttemptOutcome.TIMEOUT,
        )


def outcome_of_status(status: int) -> AttemptOutcome:
    """The outcome of an HTTP answer."""
    if 200 <= status < 300:
        return AttemptOutcome.DELIVERED
    if status == 429 or status >= 500:
        return AttemptOutcome.RETRYABLE_STATUS
    if 300 <= status < 400:
        return AttemptOutcome.REDIRECT
    return AttemptOutcome.REJECTED


_JITTER = random.Random()
"""The jitter's own generator, as the Redis client retries have (shared/redis_clients.py):
never the process-wide `random` state that other code may seed or own."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """The retry schedule: base * 2^(n-1), capped, with jitter; Retry-After up to a cap."""

    base_s: float
    cap_s: float
    retry_after_cap_s: float
    max_attempts: int

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds before the attempt after `attempt` (1-based): "equal jitter", half of
        the exponential step fixed and half random, so retries of many deliveries that
        failed together spread out but never come back at once."""
        step = min(self.cap_s, self.base_s * 2.0 ** min(max(attempt - 1, 0), 32))
        jitter: float = (rng or _JITTER).uniform(0, step / 2)
        return step / 2 + jitter

    def next_delay(
        self,
        outcome: AttemptOutcome,
        attempt: int,
        retry_after_s: float | None = None,
        rng: random.Random | None = None,
    ) -> float | None:
        """Seconds until the next attempt, or None: delivered, not retryable, or the last
        attempt. A receiver's Retry-After (429/503) wins over the backoff when longer, up
        to `retry_after_cap_s`."""
        if not outcome.retryable or attempt >= self.max_attempts:
            return None
        delay = self.delay(attempt, rng)
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, self.retry_after_cap_s))
        return delay


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)
