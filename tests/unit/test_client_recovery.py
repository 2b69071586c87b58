"""B9 (with B4, B5): the Python client's recovery decisions and its driver, with no IO.

`RunRecovery` decides what to do on an event, a drop, a gap and the end; `RunStream`
drives it. Here it runs over an in-memory fake server that publishes events as "time"
passes, trims them to a bounded retention (B3) and answers a cursor exactly like the
real bridge: replay after it (B4), or a `gap` when something after it is gone (B5).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadrun.client import (
    START_CURSOR,
    ConnectionDropped,
    ConnectionInfo,
    Deliver,
    Finish,
    GapInfo,
    GiveUp,
    PartialText,
    Reconnect,
    Reconnecting,
    RecoveryPolicy,
    Rejoin,
    Reload,
    RunEnded,
    RunRecovery,
    RunStream,
    Skip,
    StateReloaded,
    StreamDisconnectedError,
    StreamEvent,
    StreamReplayGapError,
    ThreadrunAPIError,
    WireEnd,
    WireGap,
    WireHeartbeat,
    WireItem,
    _WsSubscription,
    backoff_delay,
    is_after,
    message_delta,
    parse_sse,
)

RUN = "11111111-2222-3333-4444-555555555555"


def eid(i: int) -> str:
    return f"{1000 + i}-0"


def index(event_id: str) -> int:
    return int(event_id.split("-")[0]) - 1000


def token(i: int, mid: str = "m1") -> StreamEvent:
    return StreamEvent(
        eid(i), "messages", [{"type": "AIMessageChunk", "content": f"t{i} ", "id": mid}, {}]
    )


def gap(requested: int | None, first: int | None, last: int | None) -> GapInfo:
    return GapInfo(
        RUN,
        eid(requested) if requested else None,
        eid(first) if first else None,
        eid(last) if last else None,
    )


# --- pure pieces ------------------------------------------------------------------------------
def test_b9_backoff_grows_is_capped_and_jittered() -> None:
    """B9: reconnects back off exponentially, up to a cap; jitter only adds."""
    p = RecoveryPolicy(backoff_initial_s=0.5, backoff_factor=2, backoff_max_s=3, jitter=0.2)
    assert [backoff_delay(p, n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff_delay(p, 1, rand=0.999) == pytest.approx(0.5 * 1.1998)


def test_b2_event_order_is_numeric_and_opaque_ids_only_compare_equal() -> None:
    """B2: ids of our shape order numerically; ids of unknown shape are only told apart."""
    assert is_after("10-0", "9-5") and is_after("9-6", "9-5") and not is_after("9-5", "9-5")
    assert not is_after("9-4", "9-5") and is_after("1-0", None)
    assert is_after("b", "a") and is_after("a", "b") and not is_after("a", "a")


def test_message_delta_and_partial_text() -> None:
    """The transient view: assistant tokens of the top graph, one message at a time."""
    assert message_delta(token(1)) == ("m1", "t1 ")
    blocks = StreamEvent(
        "1-0",
        "messages",
        [
            {
                "type": "AIMessageChunk",
                "id": "x",
                "content": [{"type": "text", "text": "hi"}, {"type": "tool_use"}],
            },
            {},
        ],
    )
    assert message_delta(blocks) == ("x", "hi")
    human = StreamEvent("1-0", "messages", [{"type": "human", "content": "q"}, {}])
    sub = StreamEvent("1-0", "messages|sub:1", [{"type": "AIMessageChunk", "content": "x"}, {}])
    assert message_delta(human) is None and message_delta(sub) is None
    assert message_delta(StreamEvent("1-0", "values", {"messages": []})) is None
    view = PartialText()
    assert view.apply(token(1)) == "t1 " and view.apply(token(2)) == "t2 "
    assert view.text == "t1 t2 "
    view.apply(token(3, mid="m2"))
    assert view.text == "t3 " and view.message_id == "m2"
    view.reset()
    assert view.text == "" and view.message_id is None


def test_b5_gap_payload_parsing_is_tolerant() -> None:
    """B5: the gap body is read field by field; null or missing bounds stay None."""
    full = {
        "code": "stream_replay_gap",
        "run_id": RUN,
        "requested_event_id": "1-0",
        "earliest_available_event_id": "5-0",
        "latest_available_event_id": "9-0",
        "recovery": "reload_durable_state",
    }
    assert GapInfo.from_payload(full) == GapInfo(RUN, "1-0", "5-0", "9-0")
    assert GapInfo.from_payload({"run_id": RUN, "latest_available_event_id": None}) == GapInfo(
        RUN, None, None, None
    )
    assert GapInfo.from_payload("garbage") == GapInfo(None, None, None, None)


def test_a1_sse_parsing() -> None:
    """A1/B6: `id:`/`event:`/`data:` lines, comment heartbeats, and our `gap` event."""
    raw = (
        'id: 1-0\nevent: metadata\ndata: {"run_id": "r", "attempt": 1}\n\n'
        ": heartbeat\n\n"
        "id: 2-0\nevent: custom\ndata: [1,\ndata: 2]\n\n"
        'event: gap\ndata: {"code": "stream_replay_gap", "latest_available_event_id": "7-0"}\n\n'
        "id: 3-0\nevent: custom\ndata: not json\n\n"
    )
    items = list(parse_sse(raw.split("\n")))
    assert items == [
        StreamEvent("1-0", "metadata", {"run_id": "r", "attempt": 1}),
        WireHeartbeat(),
        StreamEvent("2-0", "custom", [1, 2]),
        WireGap(GapInfo(None, None, None, "7-0")),
        StreamEvent("3-0", "custom", "not json"),
    ]


def test_a2_websocket_frames() -> None:
    """A2: run.created names the run; event/gap/heartbeat/end map to items; errors raise."""
    sub = _WsSubscription(None, {"type": "run.create", "request_id": "q1"}, None)  # type: ignore[arg-type]
    assert sub._handle({"type": "run.created", "request_id": "q1", "run": {"run_id": RUN}}) is None
    assert sub.run_id == RUN
    ev = {"type": "event", "run_id": RUN, "id": "1-0", "event": "values", "data": {"a": 1}}
    assert sub._handle(ev) == StreamEvent("1-0", "values", {"a": 1})
    assert sub._handle({**ev, "run_id": "other"}) is None
    assert sub._handle({"type": "heartbeat", "run_id": RUN}) == WireHeartbeat()
    assert sub._handle({"type": "end", "run_id": RUN, "status": "success"}) == WireEnd("success")
    g = sub._handle({"type": "gap", "run_id": RUN, "latest_available_event_id": "5-0"})
    assert g == WireGap(GapInfo(RUN, None, None, "5-0"))
    with pytest.raises(ThreadrunAPIError) as info:
        sub._handle({"type": "error", "code": "not_found", "message": "no such run"})
    assert info.value.status == 404 and info.value.code == "not_found"
    with pytest.raises(ConnectionDropped):
        sub._handle({"type": "error", "code": "internal_error", "message": "oops"})


# --- RunRecovery decisions ------------------------------------------------------------------------
def test_b4_duplicates_and_older_ids_are_skipped() -> None:
    """B4: an id not after the last delivered one is never delivered again."""
    rec = RunRecovery(run_id=RUN)
    assert isinstance(rec.on_event(token(1)), Deliver)
    assert isinstance(rec.on_event(token(2)), Deliver)
    assert isinstance(rec.on_event(token(2)), Skip) and isinstance(rec.on_event(token(1)), Skip)
    assert rec.last_event_id == eid(2) and rec.cursor == eid(2)
    assert RunRecovery().cursor == START_CURSOR
    # `end` is idempotent: seen again (a join with the end's own id) it still ends the stream
    end = StreamEvent(eid(2), "end", {"run_id": RUN, "status": "success"})
    assert rec.on_event(end) == Finish("success", reload_first=False)
    assert rec.last_event_id == eid(2)


def test_b9_drop_reconnects_after_the_last_id_with_bounded_retries() -> None:
    """B9: each drop resumes after the last id; the budget counts drops since the last event."""
    rec = RunRecovery(RecoveryPolicy(max_retries=2, jitter=0), run_id=RUN)
    rec.on_event(token(1))
    first = rec.on_drop()
    assert isinstance(first, Reconnect) and first.cursor == eid(1) and first.attempt == 1
    second = rec.on_drop()
    assert isinstance(second, Reconnect) and second.delay > first.delay
    rec.on_event(token(2))  # progress resets the budget
    assert isinstance(rec.on_drop(), Reconnect) and isinstance(rec.on_drop(), Reconnect)
    out = rec.on_drop()
    assert isinstance(out, GiveUp) and isinstance(out.error, StreamDisconnectedError)
    assert out.error.last_event_id == eid(2) and "keeps going" in str(out.error)


def test_b9_gap_resets_the_transient_view_and_rejoins_after_latest() -> None:
    """B9: a gap drops the partial text, asks for a reload, then rejoins after the latest id."""
    rec = RunRecovery(run_id=RUN)
    rec.on_event(token(1))
    rec.on_event(token(2))
    assert rec.view.text == "t1 t2 "
    g = gap(2, 8, 12)
    assert rec.on_gap(g) == Reload(g)
    assert rec.view.text == "" and rec.stale_view
    after = rec.after_reload(g, "running", {"values": {"messages": ["m"]}})
    assert after == Rejoin(eid(12), 0.0)
    assert rec.last_event_id == eid(12) and rec.values == {"messages": ["m"]}
    assert isinstance(rec.on_event(token(11)), Skip)  # never before the rejoin point
    assert isinstance(rec.on_event(token(13)), Deliver)
    assert rec.on_event(
        StreamEvent(eid(14), "end", {"run_id": RUN, "status": "success"})
    ) == Finish("success", reload_first=True)


def test_b9_values_after_a_gap_make_the_view_whole_again() -> None:
    """B9: a full `values` event after the reload means no final reload is needed."""
    rec = RunRecovery(run_id=RUN)
    g = gap(1, 5, 9)
    rec.on_gap(g)
    rec.after_reload(g, "running", {"values": {}})
    rec.on_event(StreamEvent(eid(10), "values", {"messages": [1]}))
    assert rec.values == {"messages": [1]}
    assert rec.on_end("success") == Finish("success", reload_first=False)


def test_b9_gap_on_a_terminal_run_ends_with_its_status() -> None:
    """B9: reloaded after the run ended: the state is final, the run's status ends the stream."""
    rec = RunRecovery(run_id=RUN)
    g = gap(1, None, None)
    rec.on_gap(g)
    assert rec.after_reload(g, "interrupted", {"values": {}}) == Finish("interrupted", False)
    assert rec.finished


def test_b9_stream_gone_but_run_alive_waits_and_rejoins_from_the_start() -> None:
    """B9: null bounds and a live run: wait, then take what is retained (old ids still refused)."""
    rec = RunRecovery(RecoveryPolicy(lost_stream_wait_s=0.7), run_id=RUN)
    rec.on_event(token(3))
    g = gap(3, None, None)
    rec.on_gap(g)
    assert rec.after_reload(g, "running", {"values": {}}) == Rejoin(START_CURSOR, 0.7)
    assert isinstance(rec.on_event(token(2)), Skip) and isinstance(rec.on_event(token(4)), Deliver)


def test_b9_consecutive_gaps_are_bounded_and_any_event_resets_the_count() -> None:
    """B9: the Nth gap in a row (no event in between) raises StreamReplayGapError."""
    rec = RunRecovery(RecoveryPolicy(max_consecutive_gaps=3), run_id=RUN)
    assert isinstance(rec.on_gap(gap(1, 5, 9)), Reload)
    assert isinstance(rec.on_gap(gap(9, 12, 20)), Reload)
    rec.on_event(token(21))
    assert rec.consecutive_gaps == 0
    assert isinstance(rec.on_gap(gap(21, 30, 40)), Reload)
    assert isinstance(rec.on_gap(gap(40, 50, 60)), Reload)
    out = rec.on_gap(gap(60, 70, 80))
    assert isinstance(out, GiveUp) and isinstance(out.error, StreamReplayGapError)
    assert len(out.error.gaps) == 3 and out.error.run_id == RUN
    assert "keeps going" in str(out.error)


# --- the driver over a fake server ---------------------------------------------------------------
@dataclass
class FakeServer:
    """One run's stream: `total` events then `end`, bounded retention, exact gaps (B4, B5)."""

    total: int
    retention: int
    per_read: int = 1
    """Events the run publishes while the server sends one item (a fast run, a slow reader)."""
    per_second: float = 20.0
    """Events published per second the client sleeps (back-off, lost-stream wait)."""
    drops: list[int | None] = field(default_factory=list)
    """Per connection (in order): drop after this many items; None or missing: never."""
    lost_after: int | None = None
    """Lose the whole stream (a Redis loss) once this many events were published."""
    published: int = 0
    connections: int = 0
    stream_lost: bool = False
    sleeps: list[float] = field(default_factory=list)

    @property
    def end_index(self) -> int:
        return self.total + 1

    @property
    def done(self) -> bool:
        return self.published >= self.end_index

    @property
    def trimmed(self) -> int:
        return max(0, self.published - self.retention)

    def publish(self, n: int) -> None:
        before = self.published
        self.published = min(self.end_index, self.published + max(0, n))
        if self.lost_after is not None and before < self.lost_after <= self.published:
            self.stream_lost = True

    def event(self, i: int) -> StreamEvent:
        if i == self.end_index:
            return StreamEvent(eid(i), "end", {"run_id": RUN, "status": "success"})
        if i == 1:
            return StreamEvent(eid(i), "metadata", {"run_id": RUN, "attempt": 1})
        if i % 5 == 0:
            return StreamEvent(eid(i), "values", {"upto": i})
        return token(i)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.publish(math.ceil(seconds * self.per_second))

    def fetch_run(self, _tid: str, _rid: str) -> dict[str, Any]:
        return {"status": "success" if self.done else "running"}

    def fetch_state(self, _tid: str) -> dict[str, Any]:
        return {"values": {"upto": self.published}}

    def items(self, cursor: str) -> Iterator[WireItem]:
        """What the bridge sends a subscriber with this cursor."""
        pos = 0 if cursor == START_CURSOR else index(cursor)
        requested = eid(pos) if pos else None
        if self.stream_lost:
            if pos or self.done:
                yield WireGap(GapInfo(RUN, requested, None, None))
                return
            self.stream_lost = False  # a resumed attempt re-creates it (L5)
        if pos and pos < self.trimmed:
            yield WireGap(GapInfo(RUN, requested, eid(self.trimmed + 1), eid(self.published)))
            return
        pos = pos or self.trimmed  # "-1": from the start of what is retained, never a gap
        while True:
            self.publish(self.per_read)
            if self.stream_lost:
                yield WireGap(GapInfo(RUN, eid(pos) if pos else None, None, None))
                return
            if pos < self.trimmed:  # the follower fell behind the retention
                first, last = eid(self.trimmed + 1), eid(self.published)
                yield WireGap(GapInfo(RUN, eid(pos) if pos else None, first, last))
                return
            if pos < self.published:
                pos += 1
                yield self.event(pos)
                if pos == self.end_index:
                    return
            else:
                yield WireHeartbeat()
                self.publish(1)


class FakeSub:
    def __init__(self, server: FakeServer, cursor: str, drop_after: int | None) -> None:
        self.run_id: str | None = RUN
        self.closed = False
        self._gen = self._run(server, cursor, drop_after)

    def _run(
        self, server: FakeServer, cursor: str, drop_after: int | None
    ) -> Generator[WireItem, None, None]:
        for n, item in enumerate(server.items(cursor)):
            if drop_after is not None and n >= drop_after:
                raise ConnectionDropped("fake network drop")
            yield item

    def __iter__(self) -> Iterator[WireItem]:
        return self._gen

    def close(self) -> None:
        self.closed = True
        self._gen.close()


class FakeTransport:
    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.opened: list[tuple[str, str]] = []
        self.closed = False

    def _sub(self, kind: str, cursor: str) -> FakeSub:
        s = self.server
        drop = s.drops[s.connections] if s.connections < len(s.drops) else None
        s.connections += 1
        self.opened.append((kind, cursor))
        return FakeSub(s, cursor, drop)

    def open_create(self, thread_id: str, payload: dict[str, Any]) -> FakeSub:
        return self._sub("create", START_CURSOR)

    def open_join(self, thread_id: str, run_id: str, cursor: str) -> FakeSub:
        assert run_id == RUN
        return self._sub("join", cursor)

    def close(self) -> None:
        self.closed = True


def make_stream(
    server: FakeServer, policy: RecoveryPolicy, **kw: Any
) -> tuple[RunStream, FakeTransport]:
    transport = FakeTransport(server)
    stream = RunStream(
        transport=transport,
        thread_id="t",
        fetch_run=server.fetch_run,
        fetch_state=server.fetch_state,
        create={"assistant_id": "lead_agent"},
        policy=policy,
        sleep=server.sleep,
        rand=lambda: 0.5,
        **kw,
    )
    return stream, transport


@dataclass
class Outcome:
    items: list[Any]
    error: Exception | None
    partial_at_reload: list[str]


def consume(stream: RunStream, limit: int = 5000) -> Outcome:
    items: list[Any] = []
    partial: list[str] = []
    try:
        for item in stream:
            items.append(item)
            if isinstance(item, StateReloaded):
                partial.append(stream.partial_text)
            assert len(items) < limit, "the client does not terminate"
    except (StreamReplayGapError, StreamDisconnectedError) as exc:
        return Outcome(items, exc, partial)
    return Outcome(items, None, partial)


def delivered_ids(items: list[Any]) -> list[int]:
    return [index(i.id) for i in items if isinstance(i, StreamEvent)]


@settings(max_examples=300, deadline=None)
@given(
    total=st.integers(1, 40),
    retention=st.integers(1, 50),
    per_read=st.integers(0, 3),
    per_second=st.sampled_from([0.0, 5.0, 40.0]),
    drops=st.lists(st.one_of(st.none(), st.integers(0, 12)), max_size=8),
    lost_after=st.one_of(st.none(), st.integers(1, 45)),
    max_gaps=st.integers(1, 4),
)
def test_b9_property_any_drops_and_gaps_deliver_increasing_unique_ids(
    total: int,
    retention: int,
    per_read: int,
    per_second: float,
    drops: list[int | None],
    lost_after: int | None,
    max_gaps: int,
) -> None:
    """B9/B4/B5: for any drops, trims and stream losses, ids delivered strictly increase (no
    duplicate), a run without a gap delivers every event exactly once, every gap resets the
    transient view before `StateReloaded`, rejoins after its latest id, and the stream ends
    with `RunEnded` unless `max_consecutive_gaps` gaps came in a row."""
    server = FakeServer(total, retention, per_read, per_second, drops, lost_after)
    policy = RecoveryPolicy(
        max_retries=len(drops) + 1, max_consecutive_gaps=max_gaps, lost_stream_wait_s=0.2
    )
    stream, transport = make_stream(server, policy)
    out = consume(stream)
    ids = delivered_ids(out.items)
    assert all(a < b for a, b in zip(ids, ids[1:], strict=False)), ids
    assert transport.closed
    assert all(p == "" for p in out.partial_at_reload)
    reloads = [i for i in out.items if isinstance(i, StateReloaded)]
    if not reloads and out.error is None:
        # every event exactly once (end excluded); a client that saw nothing before its
        # first drop resumes with "-1", which cannot tell it what was trimmed (B4)
        blind = any(isinstance(i, Reconnecting) and i.last_event_id is None for i in out.items)
        start = (ids[0] if ids else total + 1) if blind else 1
        assert ids == list(range(start, total + 1))
    for n, item in enumerate(out.items):
        if isinstance(item, StateReloaded) and item.gap.latest_available_event_id:
            later = delivered_ids(out.items[n + 1 :])
            assert all(i > index(item.gap.latest_available_event_id) for i in later)
    if out.error is None:
        assert isinstance(out.items[-1], RunEnded) and out.items[-1].status == "success"
        assert out.items[-1].run_id == RUN
    else:
        assert isinstance(out.error, StreamReplayGapError), out.error
        assert len(out.error.gaps) == max_gaps
        # the gaps came in a row: no event was delivered since the first of them
        reloaded_at = [n for n, i in enumerate(out.items) if isinstance(i, StateReloaded)]
        if max_gaps > 1:
            since = out.items[reloaded_at[-(max_gaps - 1)] :]
            assert not any(isinstance(i, StreamEvent) for i in since)
    assert sum(isinstance(i, RunEnded) for i in out.items) <= 1


@settings(max_examples=200, deadline=None)
@given(
    total=st.integers(2, 40),
    drops=st.lists(st.integers(0, 10), min_size=1, max_size=10),
)
def test_b4_property_drops_alone_lose_and_repeat_nothing(total: int, drops: list[int]) -> None:
    """B4/B9: with retention that keeps everything, any sequence of drops delivers each event
    exactly once, in order, and ends with RunEnded(success)."""
    server = FakeServer(total, retention=1000, per_read=1, drops=list(drops))
    stream, _ = make_stream(server, RecoveryPolicy(max_retries=len(drops) + 1))
    out = consume(stream)
    assert out.error is None
    assert delivered_ids(out.items) == list(range(1, total + 1))
    assert out.items[-1] == RunEnded(RUN, "success")
    assert not any(isinstance(i, StateReloaded) for i in out.items)


def test_b9_reconnect_resumes_after_the_last_event_and_backs_off() -> None:
    """B9: Reconnecting names the cursor; the next subscription uses it; delays grow."""
    server = FakeServer(total=20, retention=1000, drops=[4, 0, 0, None], per_second=0)
    stream, transport = make_stream(server, RecoveryPolicy(jitter=0, backoff_initial_s=0.1))
    out = consume(stream)
    recon = [i for i in out.items if isinstance(i, Reconnecting)]
    assert [r.attempt for r in recon] == [1, 2, 3]
    assert [r.delay for r in recon] == [0.1, 0.2, 0.4] == server.sleeps
    assert all(r.last_event_id == eid(4) for r in recon)
    assert transport.opened == [
        ("create", "-1"),
        ("join", eid(4)),
        ("join", eid(4)),
        ("join", eid(4)),
    ]
    assert delivered_ids(out.items) == list(range(1, 21))


def test_b9_too_many_drops_raise_stream_disconnected() -> None:
    """B9: the retry budget is bounded; the error says the run keeps going."""
    server = FakeServer(total=20, retention=1000, drops=[3] + [0] * 10)
    stream, _ = make_stream(server, RecoveryPolicy(max_retries=2))
    out = consume(stream)
    assert isinstance(out.error, StreamDisconnectedError)
    assert out.error.last_event_id == eid(3) and out.error.run_id == RUN


def test_b9_a_drop_before_the_run_is_known_is_not_retried() -> None:
    """B9: a create that drops before the run id is known cannot be resumed (it may exist)."""
    server = FakeServer(total=5, retention=10, drops=[0])
    transport = FakeTransport(server)
    orig = transport.open_create

    def nameless(thread_id: str, payload: dict[str, Any]) -> FakeSub:
        sub = orig(thread_id, payload)
        sub.run_id = None
        return sub

    transport.open_create = nameless  # type: ignore[method-assign]
    stream = RunStream(
        transport=transport,
        thread_id="t",
        fetch_run=server.fetch_run,
        fetch_state=server.fetch_state,
        create={},
        sleep=server.sleep,
    )
    with pytest.raises(StreamDisconnectedError, match="before the run was created"):
        list(stream)


def test_b9_fault_hook_closes_the_connection_and_the_stream_resumes() -> None:
    """B9: the test hook closes the live connection after K events; nothing is lost."""
    server = FakeServer(total=30, retention=1000)
    seen: list[ConnectionInfo] = []

    def hook(info: ConnectionInfo) -> bool:
        seen.append(info)
        return info.number == 1 and info.events == 7

    stream, transport = make_stream(server, RecoveryPolicy(), fault_hook=hook)
    out = consume(stream)
    assert delivered_ids(out.items) == list(range(1, 31))
    assert transport.opened[1] == ("join", eid(7))
    assert {(i.number, i.reason) for i in seen} == {(1, "create"), (2, "reconnect")}


def test_b9_gap_then_final_reload_makes_the_view_equal_the_durable_state() -> None:
    """B9/B5: gap -> StateReloaded -> rejoin after latest; no `values` after it, so the end
    reloads the durable state once more: the client's final view is the final state."""
    server = FakeServer(total=14, retention=3, per_read=1, per_second=40, drops=[2])
    policy = RecoveryPolicy(backoff_initial_s=0.25, jitter=0)
    stream, transport = make_stream(server, policy)
    out = consume(stream)
    reloads = [i for i in out.items if isinstance(i, StateReloaded)]
    assert out.items[-2:] == [reloads[-1], RunEnded(RUN, "success")] and len(reloads) == 2
    assert reloads[0].gap == GapInfo(RUN, eid(2), eid(11), eid(13))
    assert reloads[0].state == {"values": {"upto": 13}}
    assert transport.opened[2] == ("join", eid(13))
    assert delivered_ids(out.items) == [1, 2, 14]
    assert stream.values == server.fetch_state("t")["values"] == {"upto": 15}


def test_b9_gap_on_an_ended_run_reports_its_status_not_a_cancel() -> None:
    """B9: "view incomplete" (StateReloaded) and "run cancelled" (RunEnded interrupted) differ."""

    class Ended(FakeServer):
        def fetch_run(self, _tid: str, _rid: str) -> dict[str, Any]:
            return {"status": "interrupted"}

    server = Ended(total=10, retention=1000, lost_after=4)
    server.published = 10
    server.stream_lost = True
    transport = FakeTransport(server)
    stream = RunStream(
        transport=transport,
        thread_id="t",
        fetch_run=server.fetch_run,
        fetch_state=server.fetch_state,
        run_id=RUN,
        last_event_id=eid(3),
        sleep=server.sleep,
    )
    items = list(stream)
    assert [type(i) for i in items] == [StateReloaded, RunEnded]
    assert items[0].gap == GapInfo(RUN, eid(3), None, None)  # type: ignore[union-attr]
    assert items[1] == RunEnded(RUN, "interrupted")


def test_b9_reload_survives_a_drop() -> None:
    """B9: the state reload itself retries transient failures with the same budget."""
    server = FakeServer(total=12, retention=2, per_read=1, per_second=40, drops=[2])
    fails = {"n": 2}
    fetch = server.fetch_state

    def flaky(tid: str) -> dict[str, Any]:
        if fails["n"]:
            fails["n"] -= 1
            raise ConnectionDropped("state read failed")
        return fetch(tid)

    server.fetch_state = flaky  # type: ignore[method-assign]
    stream, _ = make_stream(server, RecoveryPolicy())
    out = consume(stream)
    assert out.error is None and out.items[-1] == RunEnded(RUN, "success")
    assert sum(isinstance(i, Reconnecting) for i in out.items) >= 3


def test_b9_api_errors_are_not_retried() -> None:
    """A3: a 4xx (bad request, unknown run) surfaces at once; it is not a drop."""

    class Refusing(FakeTransport):
        def open_create(self, thread_id: str, payload: dict[str, Any]) -> FakeSub:
            raise ThreadrunAPIError("HTTP 422: stream_mode", status=422)

    server = FakeServer(total=3, retention=10)
    stream = RunStream(
        transport=Refusing(server),
        thread_id="t",
        fetch_run=server.fetch_run,
        fetch_state=server.fetch_state,
        create={},
        sleep=server.sleep,
    )
    with pytest.raises(ThreadrunAPIError) as info:
        next(stream)
    assert info.value.status == 422 and server.sleeps == []


def test_closing_the_stream_closes_the_connection() -> None:
    """Breaking out of the iteration closes the live subscription and the transport."""
    server = FakeServer(total=50, retention=100)
    stream, transport = make_stream(server, RecoveryPolicy())
    subs: list[FakeSub] = []
    orig = transport._sub

    def spy(kind: str, cursor: str) -> FakeSub:
        subs.append(orig(kind, cursor))
        return subs[-1]

    transport._sub = spy  # type: ignore[method-assign]
    for n, _ in enumerate(stream):
        if n == 3:
            break
    stream.close()
    assert subs[0].closed and transport.closed


# --- the CLI's rendering ------------------------------------------------------------------------
def test_b9_cli_markers_tell_reconnect_reload_and_cancel_apart() -> None:
    """B9: tokens go to stdout; `[reconnecting…]`, `[view incomplete — reloaded]` and
    `[cancelled]` go to stderr and are different markers."""
    import io

    from threadrun.cli import ChatPrinter

    out, err = io.StringIO(), io.StringIO()
    p = ChatPrinter(out, err)
    p.item(StreamEvent(eid(1), "metadata", {"run_id": RUN}))
    p.item(token(2))
    p.item(Reconnecting(RUN, 1, 0.2, eid(2), "drop"))
    p.item(token(3))
    p.item(StateReloaded({"values": {}}, gap(3, 8, 9)))
    p.item(token(10, mid="m2"))
    p.item(RunEnded(RUN, "interrupted"))
    assert out.getvalue() == "t2 \nt3 \nt10 \n"
    assert err.getvalue().splitlines() == [
        "[reconnecting…]",
        "[view incomplete — reloaded]",
        "[cancelled]",
    ]
    assert p.incomplete and p.status == "interrupted"


def test_b9_cli_prints_the_durable_reply_after_a_gap() -> None:
    """B9: after a gap the live text has a hole, so the final reply is printed from the state."""
    import io

    from threadrun.cli import ChatPrinter

    out, err = io.StringIO(), io.StringIO()
    p = ChatPrinter(out, err)
    p.item(token(1))
    p.item(StateReloaded({"values": {}}, gap(1, 5, 9)))
    p.item(token(10))
    p.item(RunEnded(RUN, "success"))

    class Done:
        values = {
            "messages": [{"type": "human", "content": "q"}, {"type": "ai", "content": "full"}]
        }

    p.finish(Done())  # type: ignore[arg-type]
    assert out.getvalue() == "t1 \nt10 \nfull\n"
