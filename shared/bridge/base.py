"""The bridge contract (`StreamBridge`): what a publisher guarantees, what a subscriber receives,
when a gap is reported, and the pure cursor and gap decisions (B1-B7)."""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from shared.errors import StreamCursorInvalid
from shared.vocab import END_EVENT as END_EVENT  # re-exported: the bridge's users name it here

if TYPE_CHECKING:
    from shared.bridge.publisher import PublishCall, PublishResult

LOST_EVENT = "threadrun.lost"
"""The marker entry a publisher writes where a failover lost events it no longer holds
(shared/lua/publish.lua): a subscriber that reaches it gets a `Gap`, never the marker."""
START_CURSORS = frozenset({"", "-1", "0", "-"})
BEFORE_FIRST = "0-0"
"""A checked "from the very first event" cursor: a gap if anything was ever trimmed."""
_ID_RE = re.compile(r"^\d{1,19}-\d{1,19}$")
_OURS_RE = re.compile(r"^\d+-\d+$")
"""The shape of this server's ids: one that fails _ID_RE is malformed, not foreign."""
_FOREIGN_RE = re.compile(r"^[\x21-\x7e]{1,256}$")
"""A cursor of another server's (printable ASCII, no blanks, bounded): read from the start."""
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Event:
    """One live event; `data` is already-encoded JSON. `n`: its position in the run's
    stream (1 for the first event ever published; 0 when not known), which the thread
    streaming protocol's integer `seq` is made of."""

    id: str
    event: str
    data: str
    n: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Nothing happened for a heartbeat interval (B6)."""


@dataclass(frozen=True, slots=True)
class Gap:
    """Events after the cursor are gone; reload durable state (B5). A value, not an error."""

    run_id: str
    requested_event_id: str | None
    earliest_available_event_id: str | None
    latest_available_event_id: str | None

    def payload(self) -> dict[str, Any]:
        """The `gap` control event's body."""
        return {
            "code": "stream_replay_gap",
            "run_id": self.run_id,
            "requested_event_id": self.requested_event_id,
            "earliest_available_event_id": self.earliest_available_event_id,
            "latest_available_event_id": self.latest_available_event_id,
            "recovery": "reload_durable_state",
        }


StreamItem = Event | Heartbeat | Gap


class BridgePublisher(Protocol):
    """The worker side of the bridge (B1-B3, L2); the guarantees are stated on `StreamBridge`."""

    async def publish(self, call: PublishCall) -> PublishResult:
        """Add one run's events; raise `LeaseLost` when the call's lease is not current."""
        ...

    async def publish_many(self, calls: list[PublishCall]) -> list[PublishResult | Exception]:
        """Add several runs' events at once; each result or error in the order of `calls`."""
        ...


class BridgeSubscriber(Protocol):
    """The web side of the bridge (B4-B7); what it yields is stated on `StreamBridge`."""

    def check_cursor(self, run_id: str, last_event_id: str | None) -> str:
        """The parsed cursor, or `StreamCursorInvalid` before any byte is sent (B4)."""
        ...

    def subscribe(
        self,
        run_id: str,
        last_event_id: str | None = None,
        *,
        is_terminal: Callable[[], bool],
        unstarted_end: Callable[[], str | None] | None = None,
    ) -> Iterator[StreamItem]:
        """Events after `last_event_id`, heartbeats while idle; stops after `end` or a Gap."""
        ...

    def subscribe_batches(
        self,
        run_id: str,
        last_event_id: str | None = None,
        *,
        is_terminal: Callable[[], bool],
        unstarted_end: Callable[[], str | None] | None = None,
        admitted: bool = False,
    ) -> Generator[list[StreamItem], None, None]:
        """`subscribe`, one list per read (a relay writes each list at once); `admitted`:
        the caller has just admitted the run and reads it from `BEFORE_FIRST`."""
        ...

    def last_event(self, run_id: str) -> Event | None:
        """The newest retained event, if any."""
        ...


class StreamBridge(BridgePublisher, BridgeSubscriber, Protocol):
    """The stream bridge contract (SPEC §4), stated once for every implementation.

    The Redis bridge has its two sides in different processes, `StreamPublisher` in the
    workers and `StreamSubscriber` in the web (each checked against its side's protocol in
    shared/bridge/__init__.py); an in-process bridge is one object that is both.

    A publisher guarantees (B1-B3, L2):
    - only the run's current lease holder adds entries: a call whose lease value is not
      current adds nothing and fails with `LeaseLost`;
    - ids strictly increase within a run and stay unique across its attempts (B2); every
      entry carries its count in the stream, so consecutive entries have consecutive counts;
    - a retried call adds nothing twice (its `first_seq` numbers its events);
    - retention is bounded: trimming removes only the oldest entries, keeps at least
      `stream_maxlen` of them and remembers the newest id it removed (B3);
    - `end` is the run's last entry; the stream then expires after `stream_ttl_after_end_s`.

    A subscriber of `subscribe(run_id, last_event_id, is_terminal=...)` gets (B4-B7):
    - cursor None, '', '-1', '0' or '-': everything retained, never a gap for what was
      trimmed before it; '0-0': from the first event ever published (a gap if anything was
      trimmed; a stream not created yet is waited for, as with '-1'); another id: the
      events after it. A malformed id, or one beyond the last id
      issued, raises `StreamCursorInvalid` (`check_cursor` says so before any byte is sent);
      a cursor beyond the last id that the Redis clock could have issued, of a stream
      without its `end`, may be the tail a failover lost: it is re-checked for up to one
      heartbeat interval (the publisher repairs the tail) before it is refused;
    - the events after the cursor in order, each once, then the live ones as they come;
    - a `Heartbeat` after every heartbeat interval without an event (B6);
    - the `end` event (an `Event` named END_EVENT), after which the iteration stops; joining
      at the `end` event itself stops at once (B7).

    A `Gap` is yielded, exactly once and as the last item, when and only when an event the
    subscriber would have had is gone (B5):
    - an entry after the cursor was trimmed, or the cursor is older than the stream itself
      (the stream was lost and re-created), or '0-0' was asked and something was trimmed;
    - while following live, the next entry's count is not the last one's plus one;
    - the cursor is in a range of ids a failover lost (the promoted replica lacked them;
      the publisher republished what it still held with new ids), or the reader reaches the
      `LOST_EVENT` marker of events the publisher no longer held (or that a publish
      failed to add before the run's `end` was published after an outage);
    - the stream does not exist and a cursor other than '0-0' was given or the run is
      terminal (expired or lost), or the run is terminal and the stream has stayed silent for two heartbeat
      intervals without its `end` (a publisher that could not publish it yet, or died).
    Its `requested_event_id` is the cursor the gap is relative to (the client's cursor on
    replay, the last delivered id when following; None for "from the start"); the
    `earliest_available_event_id` / `latest_available_event_id` bounds are the first
    retained id and the last id issued, both None when the stream is gone.
    """


def is_stream_id(value: str) -> bool:
    """Whether `value` is an id this server's streams issue (`<ms>-<seq>`)."""
    return bool(_ID_RE.match(value))


def parse_cursor(last_event_id: str | None) -> str:
    """'' for "from the start of what is retained" (-1, 0, -), `BEFORE_FIRST` for a foreign
    id, else a validated stream id (B4).

    `0-0` is a real cursor ("before the first event"): unlike -1 it reports a gap when
    the start of the stream was trimmed, for a client that dropped before its first event.

    A foreign cursor (printable, not of this server's `<ms>-<seq>` shape: another server's
    id, or one a client made up) cannot be placed in this stream, so nothing can be known
    about what the client already has: it reads from the very first event, as the checked
    `0-0` does (a gap when the start was trimmed, B5). That may repeat events the client
    had, but never skips one silently; the official
    server compares such ids as strings, which places most of them after every event and
    silently drops what the client missed. An id of this server's shape is exact (B4/B5);
    a malformed one (too many digits, blanks or control characters, over 256 characters)
    is still a client error.
    """
    if last_event_id is None:
        return ""
    value = last_event_id.strip()
    if value in START_CURSORS:
        return ""
    if is_stream_id(value):
        return value
    if not _OURS_RE.match(value) and _FOREIGN_RE.match(value):
        log.debug("Last-Event-ID %r is not of this server: reading from the start", value[:64])
        return BEFORE_FIRST
    raise StreamCursorInvalid(
        f"Last-Event-ID {last_event_id[:64]!r} is not an event id of this stream"
    )


class ReadKind(enum.Enum):
    """What a replay read found (B4, B5)."""

    MISSING = "missing"  # no stream: never created, expired, or lost with Redis
    BEYOND = "beyond"  # the cursor is after the last id ever issued: a client error
    GAP = "gap"  # something after the cursor is gone
    OK = "ok"  # the entries after the cursor are all there


@dataclass(frozen=True, slots=True)
class StreamMeta:
    """The bookkeeping the publisher keeps beside each stream (see shared/lua/publish.lua)."""

    exists: bool
    count: int  # n: events ever published to this incarnation
    origin: str | None  # o: first id of this incarnation
    last: str | None  # l: last id issued
    trimmed: str | None  # t: newest id trimmed away
    lost: tuple[tuple[str, str], ...] = ()  # h: (lo, hi] ranges of ids lost in a failover

    @staticmethod
    def parse_lost(raw: bytes | str | None) -> tuple[tuple[str, str], ...]:
        """The `h` field ("lo hi lo hi ...") as (lo, hi) pairs."""
        if not raw:
            return ()
        parts = (raw.decode() if isinstance(raw, bytes) else raw).split()
        return tuple(zip(parts[::2], parts[1::2], strict=False))


def id_key(event_id: str) -> tuple[int, int]:
    """A stream id as a comparable (ms, seq) pair."""
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


def classify_read(cursor: str, meta: StreamMeta) -> ReadKind:
    """The pure gap decision: exact, because trimming only removes ids <= meta.trimmed."""
    if not meta.exists:
        return ReadKind.MISSING
    if not cursor:
        return ReadKind.OK
    if cursor == BEFORE_FIRST:
        return ReadKind.GAP if meta.trimmed is not None else ReadKind.OK
    c = id_key(cursor)
    if any(id_key(lo) < c <= id_key(hi) for lo, hi in meta.lost):
        return ReadKind.GAP  # the cursor saw an entry a failover lost (republished or not)
    if meta.last is not None and c > id_key(meta.last):
        return ReadKind.BEYOND
    if meta.origin is not None and c < id_key(meta.origin):
        return ReadKind.GAP  # the cursor belongs to an earlier incarnation (Redis lost it)
    if meta.trimmed is not None and id_key(meta.trimmed) > c:
        return ReadKind.GAP
    return ReadKind.OK
