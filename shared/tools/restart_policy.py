"""When the supervisor restarts a child that died, and when it gives up on it (SPEC H1).

Pure decisions, no IO: the supervisor passes the clock in, so the backoff and the crash-loop
rule are unit-tested without processes (tests/unit/test_supervisor_policy.py).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field


class RestartOutcome(enum.Enum):
    """What to do with a child that exited on its own."""

    RESTART = "restart"
    GIVE_UP = "give_up"


@dataclass(frozen=True)
class RestartDecision:
    """The outcome, the wait before the restart and the exits counted in the window."""

    outcome: RestartOutcome
    delay_s: float
    exits_in_window: int


@dataclass
class RestartPolicy:
    """Exponential backoff per child; more than ``max_restarts`` exits in ``window_s`` is a
    crash loop (restarting it again would only spin).

    The backoff doubles with each exit still inside the window, so a child that ran fine for
    longer than the window starts again from ``backoff_s``. ``max_restarts`` 0: never restart.
    """

    backoff_s: float
    backoff_max_s: float
    max_restarts: int
    window_s: float
    exits: deque[float] = field(default_factory=deque)

    def on_exit(self, now: float) -> RestartDecision:
        """Record an exit at ``now`` (monotonic seconds) and decide."""
        while self.exits and self.exits[0] <= now - self.window_s:
            self.exits.popleft()
        self.exits.append(now)
        count = len(self.exits)
        if count > self.max_restarts:
            return RestartDecision(RestartOutcome.GIVE_UP, 0.0, count)
        delay = min(self.backoff_max_s, self.backoff_s * 2 ** (count - 1))
        return RestartDecision(RestartOutcome.RESTART, delay, count)
