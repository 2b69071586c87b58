"""Thread streams (GET /threads/{id}/stream): the events of every run of a thread, one run
after the other, relayed from the runs' own streams.

Nothing is published twice: a follower walks the thread's runs in admission order (`seq`,
taken under the thread lock, so it is the order the runs execute in) and relays each run's
Redis Stream through the ordinary subscriber, with its exact replay and gap checks. What
this module adds is the walk, and ids that say where in the walk an event is:

- an event of run R with stream id E is sent as `R:E`; the run's `end` is sent as the
  official server's `metadata {"status": "run_done", "run_id": R}` (plus `run_status`, the
  terminal status), with id `R:done`. The SDK sends the last id back as `Last-Event-ID`,
  and resuming continues in R after E (or after R, for `R:done`), then the later runs.
- Without `Last-Event-ID` the walk starts at the oldest pending or running run, from the
  start of what its stream retains (as a run join without a cursor does), else with the
  next run admitted; `-1`, `0` and `-` walk every run of the thread from the first.
- A follower between runs waits on the thread's admission stream (`Keys.thread_runs`,
  one tiny entry per admitted run, written by `RunManager`), through the process's
  subscription hub: idle followers hold no Redis connection, and a new run wakes them at
  once. The runs table, not the notice, says which run is next, and it is re-read every
  `thread_stream_poll_s` anyway (a notice lost to a Redis error delays a run; it never
  loses one; a deleted thread ends the stream then).

Gaps keep the run stream's rule (B5): reported exactly when events the client needs are
gone. A gap names its run and is followed by that run's `run_done` (its durable status), so
the client can reload state and go on; the thread stream itself does not stop there (a
stop would make the SDK's reconnect hit the same gap again). A run that ended without ever
starting (cancelled while pending) had no events: it gets its `run_done`, never a gap; so
does any run whose stream is gone when the client asked for "what is retained" (`-1`, or
the run in progress when it joined without a cursor).
"""

from __future__ import annotations

import enum
import functools
import threading
import uuid
from collections.abc import Collection, Generator
from dataclasses import dataclass
from typing import Any, Protocol

import redis
from cachetools import TTLCache

from shared import serde
from shared.bridge.base import (
    BEFORE_FIRST,
    END_EVENT,
    START_CURSORS,
    Event,
    Gap,
    Heartbeat,
    StreamItem,
    is_stream_id,
)
from shared.bridge.subscriber import StreamSubscriber
from shared.errors import StreamCursorInvalid
from shared.redis_keys import Keys
from shared.vocab import RunRef, RunStatus

DONE = "done"
"""The entry part of a run's `run_done` event id: everything of the run was delivered."""
THREAD_STREAM_MODES = ("run_modes", "lifecycle", "state_update")
"""The official SDK's `ThreadStreamMode`s."""
RUNS_PER_READ = 50
"""Runs read from the runs table at once while walking."""


class StartAt(enum.Enum):
    """Where a follower without a run cursor starts."""

    LIVE = "live"  # no Last-Event-ID: the run in progress (from its start), then new runs
    FIRST = "first"  # -1, 0, -: every run of the thread, each from what its stream retains
    # The thread streaming protocol without `since`: the run in progress, else the newest
    # run (so a stream opened just after `run.start` sees a run that already ended).
    LATEST = "latest"


@dataclass(frozen=True, slots=True)
class ThreadCursor:
    """A thread stream event id: a run and an entry of its stream (or DONE)."""

    run_id: str
    entry: str

    def encode(self) -> str:
        """The SSE id."""
        return event_id(self.run_id, self.entry)


def event_id(run_id: str, entry: str) -> str:
    """The thread stream id of run `run_id`'s entry `entry` (a stream id or DONE)."""
    return f"{run_id}:{entry}"


def parse_thread_cursor(last_event_id: str | None) -> StartAt | ThreadCursor:
    """A client's `Last-Event-ID` on a thread stream; StreamCursorInvalid (400 naming
    Last-Event-ID) when it is not one this stream could have sent."""
    if last_event_id is None or not last_event_id.strip():
        return StartAt.LIVE
    value = last_event_id.strip()
    if value in START_CURSORS:
        return StartAt.FIRST
    run, sep, entry = value.partition(":")
    bad = StreamCursorInvalid(
        f"Last-Event-ID {last_event_id[:96]!r} is not an event id of this thread stream"
        " (expected <run_id>:<stream id> or <run_id>:done)"
    )
    if not sep or not entry:
        raise bad
    try:
        run_id = str(uuid.UUID(run))
    except ValueError as exc:
        raise bad from exc
    if entry == DONE:
        return ThreadCursor(run_id, DONE)
    if not is_stream_id(entry):
        raise bad  # "-1" or another server's id inside a run id: not an id this stream sends
    return ThreadCursor(run_id, entry)


def keeps(modes: Collection[str], event: Event) -> bool:
    """Whether a thread stream with `modes` (THREAD_STREAM_MODES) sends `event`, as the
    official server filters: `run_modes` every run event, `lifecycle` only each run's start
    (`metadata` with run_id and attempt) and `run_done`, `state_update` only state_update
    events (this server publishes none)."""
    if not modes or ("run_modes" in modes and event.event != "state_update"):
        return True
    if "state_update" in modes and event.event == "state_update":
        return True
    if "lifecycle" in modes and event.event == "metadata":
        try:
            data = serde.loads(event.data)
        except ValueError:
            return False
        if isinstance(data, dict):
            return data.get("status") == "run_done" or ("attempt" in data and "run_id" in data)
    return False


class ThreadRuns(Protocol):
    """What a follower reads about runs (`shared.runs.store.RunStore`)."""

    def follow_start(self, thread_id: str) -> tuple[int | None, int | None]:
        """(seq of the oldest pending or running run, seq of the newest run)."""
        ...

    def runs_after(self, thread_id: str, seq: int, limit: int = 1) -> list[RunRef] | None:
        """Runs admitted after `seq`, in order; None once the thread is gone."""
        ...

    def run_ref(self, thread_id: str, run_id: str) -> RunRef | None:
        """One run of the thread (None: not this thread's, or gone)."""
        ...

    def run_status(self, run_id: str) -> RunStatus | None:
        """Just the status (None if the run is gone)."""
        ...


@dataclass(frozen=True, slots=True)
class _Step:
    """Where the walk resumes: after `after`; runs up to `lenient_upto` are relayed from
    what their streams retain, later ones from their first event (a gap if it is gone)."""

    after: int
    lenient_upto: int


class ThreadFollower:
    """Walks a thread's runs and relays their streams (one per web process, shared)."""

    def __init__(
        self,
        subscriber: StreamSubscriber,
        runs: ThreadRuns,
        client: redis.Redis,
        keys: Keys,
        *,
        heartbeat_s: float,
        poll_s: float,
    ) -> None:
        self._subscriber = subscriber
        self._runs = runs
        self._client = client
        self._keys = keys
        self._heartbeat_s = heartbeat_s
        self._poll_s = poll_s
        # Followers of one thread woken by one admission ask the same question: one query.
        self._answers: TTLCache[tuple[str, int, str], list[RunRef] | None] = TTLCache(
            65536, min(1.0, heartbeat_s)
        )
        self._lock = threading.Lock()

    # --- before any byte -------------------------------------------------------------------
    def check(self, thread_id: str, last_event_id: str | None) -> StartAt | ThreadCursor:
        """The parsed cursor; a 400 (StreamCursorInvalid) for a malformed one or one beyond
        its run's last event, before the response starts."""
        start = parse_thread_cursor(last_event_id)
        if (
            isinstance(start, ThreadCursor)
            and start.entry != DONE
            and self._runs.run_ref(thread_id, start.run_id) is not None
        ):
            try:
                self._subscriber.check_cursor(start.run_id, start.entry)
            except StreamCursorInvalid as exc:
                raise StreamCursorInvalid(
                    f"Last-Event-ID {start.encode()!r} is beyond the last event of run"
                    f" {start.run_id}"
                ) from exc
        return start

    # --- the walk -----------------------------------------------------------------------------
    def follow(
        self, thread_id: str, start: StartAt | ThreadCursor
    ) -> Generator[list[StreamItem], None, None]:
        """Batches of items (events with thread ids, heartbeats, gaps) until the client
        leaves or the thread is deleted."""
        step = yield from self._first_step(thread_id, start)
        key = self._keys.thread_runs(thread_id)
        while True:
            mark = self._mark(key)  # before the read: a later admission moves it
            refs = self._runs_after(thread_id, step.after, mark)
            if refs is None:
                return  # the thread was deleted: nothing more will run on it
            if not refs:
                yield from self._await_admission(key, mark)
                continue
            for ref in refs:
                yield from self._relay(thread_id, ref, None, strict=ref.seq > step.lenient_upto)
                step = _Step(ref.seq, step.lenient_upto)

    def _first_step(
        self, thread_id: str, start: StartAt | ThreadCursor
    ) -> Generator[list[StreamItem], None, _Step]:
        if isinstance(start, ThreadCursor):
            ref = self._runs.run_ref(thread_id, start.run_id)
            if ref is not None:
                if start.entry != DONE:
                    yield from self._relay(thread_id, ref, start.entry, strict=True)
                return _Step(ref.seq, 0)
            # The run is gone (deleted) or was never this thread's: the position is lost.
            yield [Gap(start.run_id, start.encode(), None, None)]
        inflight, newest = self._runs.follow_start(thread_id)
        if start is StartAt.FIRST:
            return _Step(0, newest or 0)
        if inflight is not None:
            return _Step(inflight - 1, inflight)
        if start is StartAt.LATEST and newest:
            return _Step(newest - 1, newest)
        return _Step(newest or 0, 0)

    def _mark(self, key: str) -> str:
        got: Any = self._client.xrevrange(key, count=1)
        return str(got[0][0].decode()) if got else BEFORE_FIRST

    def _runs_after(self, thread_id: str, after: int, mark: str) -> list[RunRef] | None:
        """The next runs, one query per (thread, position, newest notice) per process."""
        k = (thread_id, after, mark)
        with self._lock:
            if k in self._answers:
                return self._answers[k]
        refs = self._runs.runs_after(thread_id, after, RUNS_PER_READ)
        with self._lock:
            self._answers[k] = refs
        return refs

    def _await_admission(self, key: str, mark: str) -> Generator[list[StreamItem], None, None]:
        """Heartbeats until a run is admitted after `mark`, or `poll_s` passed."""
        waited = 0.0
        with self._subscriber.entry_wait(key, mark) as waiting:
            while not waiting.wait():
                yield [Heartbeat()]
                waited += self._heartbeat_s
                if waited >= self._poll_s:
                    return

    # --- one run ------------------------------------------------------------------------------
    def _relay(
        self, thread_id: str, ref: RunRef, cursor: str | None, *, strict: bool
    ) -> Generator[list[StreamItem], None, None]:
        """Run `ref`'s events after `cursor` (None: from its start; `strict`: a gap if its
        first events are gone), ending with its `run_done`."""
        run_id = ref.run_id
        if cursor is None:
            ended = yield from self._await_stream(thread_id, ref, strict=strict)
            if ended:
                return
            cursor = BEFORE_FIRST if strict else None
        while True:
            gap: Gap | None = None
            for batch in self._subscriber.subscribe_batches(
                run_id, cursor, is_terminal=lambda: self._terminal(run_id)
            ):
                out: list[StreamItem] = []
                for item in batch:
                    if isinstance(item, Event):
                        if item.event == END_EVENT:
                            out.append(_run_done(run_id, *_end_of(item.data), item.n))
                            yield out
                            return
                        out.append(Event(event_id(run_id, item.id), item.event, item.data, item.n))
                    elif isinstance(item, Gap):
                        gap = item
                        out.append(_thread_gap(item))
                    else:
                        out.append(item)
                if out:
                    yield out
            status = self._runs.run_status(run_id)
            if gap is None or status is None or status.terminal:
                # Ended without an `end` we can still read (the client's cursor was the
                # `end` itself, or the stream is gone): the durable status says how.
                yield [_run_done(run_id, status)]
                return
            # A gap in a live run: the client reloads state; the run goes on from the
            # newest event still there (as B9 tells run stream clients to rejoin).
            cursor = gap.latest_available_event_id

    def _await_stream(
        self, thread_id: str, ref: RunRef, *, strict: bool
    ) -> Generator[list[StreamItem], None, bool]:
        """Wait for the run's stream to exist; True when the run ended without one (its
        `run_done`, and a gap before it if it had events the client needed, were sent)."""
        key = self._keys.stream(ref.run_id)
        with self._subscriber.entry_wait(key) as waiting:
            while not self._client.exists(key):
                # Followers waiting for one pending run share the answer for a heartbeat.
                ended = functools.partial(self._terminal, ref.run_id)
                if self._subscriber.liveness.ask("terminal", key, ended):
                    now = self._runs.run_ref(thread_id, ref.run_id)
                    if self._client.exists(key):
                        return False  # published its last events meanwhile
                    out: list[StreamItem] = []
                    if strict and (now is None or now.started):
                        out.append(Gap(ref.run_id, None, None, None))  # its events are gone
                    out.append(_run_done(ref.run_id, now.status if now else None))
                    yield out
                    return True
                if not waiting.wait():
                    yield [Heartbeat()]
        return False

    def _terminal(self, run_id: str) -> bool:
        status = self._runs.run_status(run_id)
        return status is None or status.terminal


def _end_of(end_data: str) -> tuple[RunStatus | str | None, str | None]:
    """(the run's status, the thread status it left) of an `end` event's data."""
    try:
        data = serde.loads(end_data)
    except ValueError:
        return None, None
    if not isinstance(data, dict):
        return None, None
    status, thread_status = data.get("status"), data.get("thread_status")
    return (
        str(status) if status is not None else None,
        str(thread_status) if thread_status is not None else None,
    )


def _run_done(
    run_id: str, status: RunStatus | str | None, thread_status: str | None = None, n: int = 0
) -> Event:
    """The official `run_done` marker, with the run's terminal status (and, read from its
    `end`, the thread status it left; `n`: that `end`'s position in the run's stream)."""
    data: dict[str, Any] = {"status": "run_done", "run_id": run_id, "run_status": status}
    if thread_status is not None:
        data["thread_status"] = thread_status
    return Event(event_id(run_id, DONE), "metadata", serde.dumps_str(data), n)


def _thread_gap(gap: Gap) -> Gap:
    """A run's gap with thread stream ids (so a client can rejoin after the newest)."""

    def tid(entry: str | None) -> str | None:
        return event_id(gap.run_id, entry) if entry else None

    return Gap(
        gap.run_id,
        tid(gap.requested_event_id),
        tid(gap.earliest_available_event_id),
        tid(gap.latest_available_event_id),
    )
