"""How a run's stream survives drops and gaps (SPEC B4/B5/B9): the decisions, without IO.

- a dropped connection (transport error, read timeout, or a stream that closes without
  `end`) is resumed with the last event id seen, with bounded retries and back-off; the
  server replays exactly the events after it (B4), and the client also refuses any id
  that is not after the last one delivered, so no event is delivered twice;
- a `gap` (events after the cursor were trimmed, B5) drops the transient view (the
  partial assistant text), reloads the run's status and the thread's durable state,
  yields `StateReloaded`, then rejoins after `latest_available_event_id` — or, when the
  stream is gone (null bounds), ends with `RunEnded` if the run is terminal, else waits
  and rejoins from the start of what is retained;
- after `max_consecutive_gaps` gaps with no event delivered in between, it raises
  `StreamReplayGapError`: the live view is lost, the run itself keeps going.

`RunRecovery` is told what happened (an event, a drop, a gap, the end) and answers what to
do next (`Deliver`, `Skip`, `Reconnect`, `Reload`, `Rejoin`, `Finish`, `GiveUp`);
`RunStream` (`threadrun.client`) carries the answers out over a transport. Keeping the
decisions free of IO is what lets the unit tests drive them directly, property tests
included.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from threadrun.errors import StreamDisconnectedError, StreamReplayGapError, ThreadrunClientError
from threadrun.results import GapInfo, StreamEvent

__all__ = [
    "START_CURSOR",
    "TERMINAL_STATUSES",
    "Deliver",
    "DropDecision",
    "EventDecision",
    "Finish",
    "GapDecision",
    "GiveUp",
    "PartialText",
    "Reconnect",
    "RecoveryPolicy",
    "Rejoin",
    "Reload",
    "ReloadDecision",
    "RunRecovery",
    "Skip",
    "backoff_delay",
    "event_id_key",
    "is_after",
    "later_id",
    "message_delta",
]

TERMINAL_STATUSES = frozenset({"success", "error", "timeout", "interrupted"})
START_CURSOR = "-1"
"""`Last-Event-ID` meaning "from the start of what is retained" (B4)."""


@dataclass(frozen=True, slots=True)
class RecoveryPolicy:
    """Bounds of reconnection and gap recovery."""

    max_retries: int = 5
    """Consecutive failed connection attempts before `StreamDisconnectedError`."""
    backoff_initial_s: float = 0.25
    backoff_factor: float = 2.0
    backoff_max_s: float = 5.0
    jitter: float = 0.1
    """Up to this fraction of the delay is added at random (spreads reconnect storms)."""
    max_consecutive_gaps: int = 3
    lost_stream_wait_s: float = 1.0
    """Wait before rejoining a live run whose stream is gone (gap with null bounds)."""
    read_timeout_s: float = 20.0
    """Silence (no event, no heartbeat) after which a connection counts as dropped (B6)."""
    connect_timeout_s: float = 10.0


def backoff_delay(policy: RecoveryPolicy, attempt: int, rand: float = 0.0) -> float:
    """Delay before reconnect attempt `attempt` (1-based); `rand` in [0, 1) scales the jitter."""
    base = policy.backoff_initial_s * policy.backoff_factor ** max(0, attempt - 1)
    base = min(base, policy.backoff_max_s)
    return base * (1.0 + policy.jitter * rand)


_REDIS_ID = re.compile(r"^(\d+)-(\d+)$")


def event_id_key(event_id: str) -> tuple[int, int] | None:
    """The order key of an event id, if it has the `<ms>-<seq>` shape our server uses."""
    m = _REDIS_ID.match(event_id)
    return (int(m.group(1)), int(m.group(2))) if m else None


def is_after(event_id: str, last: str | None) -> bool:
    """Whether `event_id` comes after `last` (ids of unknown shape: only equality is known)."""
    if last is None:
        return True
    a, b = event_id_key(event_id), event_id_key(last)
    if a is None or b is None:
        return event_id != last
    return a > b


def later_id(a: str | None, b: str | None) -> str | None:
    """The later of two cursors (None = nothing seen)."""
    if a is None:
        return b
    if b is None:
        return a
    return b if is_after(b, a) else a


def message_delta(event: StreamEvent) -> tuple[str | None, str] | None:
    """(message id, text) of an assistant token in a `messages` event of the top graph."""
    if event.event != "messages" or not isinstance(event.data, list) or not event.data:
        return None
    chunk = event.data[0]
    if not isinstance(chunk, dict) or chunk.get("type") not in ("AIMessageChunk", "ai"):
        return None
    content = chunk.get("content")
    if isinstance(content, list):
        content = "".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    if not isinstance(content, str) or not content:
        return None
    mid = chunk.get("id")
    return (str(mid) if mid is not None else None, content)


@dataclass
class PartialText:
    """Transient view: the assistant message being streamed, built from `messages` events."""

    message_id: str | None = None
    text: str = ""

    def apply(self, event: StreamEvent) -> str:
        """Fold one event in; returns the new text (empty if the event carries none)."""
        delta = message_delta(event)
        if delta is None:
            return ""
        mid, piece = delta
        if mid != self.message_id:
            self.message_id, self.text = mid, ""
        self.text += piece
        return piece

    def reset(self) -> None:
        """Forget it (after a gap the buffer may miss tokens)."""
        self.message_id, self.text = None, ""


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand the event to the caller."""

    event: StreamEvent


@dataclass(frozen=True, slots=True)
class Skip:
    """Not after the last delivered id: a duplicate, drop it."""


@dataclass(frozen=True, slots=True)
class Finish:
    """The run ended; `reload_first`: the view is stale, reload durable state before `RunEnded`."""

    status: str
    reload_first: bool


@dataclass(frozen=True, slots=True)
class Reconnect:
    """Resume after `cursor` once `delay` has passed."""

    cursor: str
    delay: float
    attempt: int


@dataclass(frozen=True, slots=True)
class Reload:
    """Reload the run's status and the thread's durable state, then call `after_reload`."""

    gap: GapInfo


@dataclass(frozen=True, slots=True)
class Rejoin:
    """Subscribe again after `cursor` once `delay` has passed (after a gap)."""

    cursor: str
    delay: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stop and raise `error`."""

    error: ThreadrunClientError


EventDecision = Deliver | Skip | Finish
DropDecision = Reconnect | GiveUp
GapDecision = Reload | GiveUp
ReloadDecision = Finish | Rejoin


@dataclass
class RunRecovery:
    """What to do on an event, a drop, a gap, the end — for one run's stream. No IO.

    Invariants: delivered event ids strictly increase; the transient view is reset on
    every gap; `consecutive_gaps` counts gaps since the last delivered event; `failures`
    counts connection attempts since the last event or gap received.
    """

    policy: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    run_id: str | None = None
    last_event_id: str | None = None
    consecutive_gaps: int = 0
    failures: int = 0
    stale_view: bool = False
    last_gap: GapInfo | None = None
    finished: bool = False
    view: PartialText = field(default_factory=PartialText)
    values: Any = None
    _gaps: list[GapInfo] = field(default_factory=list)

    @property
    def cursor(self) -> str:
        """The `Last-Event-ID` to resume with."""
        return self.last_event_id or START_CURSOR

    def on_event(self, event: StreamEvent) -> EventDecision:
        """A live event arrived."""
        if event.id:
            if not is_after(event.id, self.last_event_id) and event.event != "end":
                return Skip()  # (`end` again, e.g. a join with the end's own id, still ends)
            self.last_event_id = later_id(self.last_event_id, event.id)
        self.failures = 0
        self.consecutive_gaps = 0
        self._gaps.clear()
        if event.event == "end":
            status = event.data.get("status") if isinstance(event.data, dict) else None
            return self.on_end(str(status or "unknown"))
        self.view.apply(event)
        if event.event == "values":
            self.values = event.data
            self.stale_view = False
        return Deliver(event)

    def on_end(self, status: str, event_id: str | None = None) -> Finish:
        """The stream ended with the run's status (`event_id`: the `end` event's id)."""
        if event_id:
            self.last_event_id = later_id(self.last_event_id, event_id)
        self.finished = True
        if self.stale_view:  # the final reload replaces the transient view too
            self.view.reset()
        return Finish(status, reload_first=self.stale_view)

    def on_drop(self, rand: float = 0.0) -> DropDecision:
        """The connection dropped (or could not be opened); `rand` in [0, 1) for jitter."""
        self.failures += 1
        if self.failures > self.policy.max_retries:
            return GiveUp(
                StreamDisconnectedError(
                    f"run {self.run_id}: the stream dropped and {self.policy.max_retries} "
                    f"reconnects failed (last event {self.last_event_id}); the run itself "
                    "keeps going: join it again later",
                    run_id=self.run_id,
                    last_event_id=self.last_event_id,
                )
            )
        return Reconnect(
            self.cursor, backoff_delay(self.policy, self.failures, rand), attempt=self.failures
        )

    def on_gap(self, gap: GapInfo) -> GapDecision:
        """The server could not replay after our cursor (B5): drop the transient view."""
        self.view.reset()
        self.stale_view = True
        self.last_gap = gap
        self.failures = 0
        self.consecutive_gaps += 1
        self._gaps.append(gap)
        if self.consecutive_gaps >= self.policy.max_consecutive_gaps:
            return GiveUp(StreamReplayGapError(self.run_id, self._gaps))
        return Reload(gap)

    def after_reload(
        self, gap: GapInfo, run_status: str, state: Mapping[str, Any]
    ) -> ReloadDecision:
        """Durable state reloaded (status read first, then state): end, or rejoin (B9)."""
        self.values = state.get("values")
        if run_status in TERMINAL_STATUSES:
            # The status was committed before the state was read: the state is final.
            self.stale_view = False
            self.finished = True
            return Finish(run_status, reload_first=False)
        if gap.latest_available_event_id is None:
            # The stream is gone while the run lives: wait for it and take what is retained;
            # ids not after the last delivered one are still refused.
            return Rejoin(START_CURSOR, self.policy.lost_stream_wait_s)
        self.last_event_id = later_id(self.last_event_id, gap.latest_available_event_id)
        return Rejoin(self.cursor, 0.0)
