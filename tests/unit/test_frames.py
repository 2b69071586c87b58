"""A1, A2, B5-B7: one framing of bridge items, serialised byte for byte by SSE and WebSocket."""

from __future__ import annotations

from app.streaming import frames, sse, ws
from app.streaming.frames import EndFrame, EventFrame, GapFrame, HeartbeatFrame
from shared.bridge.base import Event, Gap, Heartbeat, StreamItem

TOKEN = Event("1-0", "messages", '{"a":1}')
VALUES = Event("1-1", "values", '{"v":[1,"\u00e9"]}')
META = Event("1-2", "metadata", '{"attempt":1}')
END = Event("2-0", "end", '{"status":"success"}')
GAP = Gap("r", "1-0", "2-0", "3-0")
GAP_BODY = (
    '"code":"stream_replay_gap","run_id":"r","requested_event_id":"1-0",'
    '"earliest_available_event_id":"2-0","latest_available_event_id":"3-0",'
    '"recovery":"reload_durable_state"'
)


def test_items_become_frames_and_stream_modes_filter_only_events() -> None:
    """`end` and gaps always pass and are last; control events pass any stream mode."""
    keep = frames.event_filter(["messages-tuple"])
    items: list[StreamItem] = [TOKEN, VALUES, META, Heartbeat(), END]
    assert frames.from_batch(items, keep) == [
        EventFrame(TOKEN),
        EventFrame(META),
        HeartbeatFrame(),
        EndFrame(END),
    ]
    assert frames.from_batch([GAP]) == [GapFrame(GAP)]
    assert [frames.is_last(f) for f in (EventFrame(TOKEN), HeartbeatFrame())] == [False, False]
    assert frames.is_last(EndFrame(END)) and frames.is_last(GapFrame(GAP))
    assert frames.event_filter(None)(VALUES) and frames.event_filter([])(VALUES)


def test_end_frame_status() -> None:
    """B7: the status the `end` event carries; None when its data has none."""
    assert EndFrame(END).status == "success"
    assert EndFrame(Event("2-0", "end", "not json")).status is None
    assert EndFrame(Event("2-0", "end", "[1]")).status is None


def test_sse_wire_format() -> None:
    """A1/B6: `id:`/`event:`/`data:` lines, `end` as an event, a gap without id, `: heartbeat`."""
    assert sse.encode(EventFrame(VALUES)) == (
        'id: 1-1\nevent: values\ndata: {"v":[1,"\u00e9"]}\n\n'.encode()
    )
    assert sse.encode(EndFrame(END)) == b'id: 2-0\nevent: end\ndata: {"status":"success"}\n\n'
    assert sse.encode(GapFrame(GAP)) == b"event: gap\ndata: {" + GAP_BODY.encode() + b"}\n\n"
    assert sse.encode(HeartbeatFrame()) == b": heartbeat\n\n"


def test_websocket_wire_format() -> None:
    """A2/B6: one JSON object per frame; event data spliced in as sent, `null` when empty."""
    assert ws.encode(EventFrame(TOKEN), "r") == (
        '{"type":"event","run_id":"r","id":"1-0","event":"messages","data":{"a":1}}'
    )
    assert ws.encode(EventFrame(Event("1-3", "messages", "")), "r").endswith('"data":null}')
    assert ws.encode(EndFrame(END), "r") == (
        '{"type":"end","run_id":"r","id":"2-0","status":"success"}'
    )
    assert ws.encode(GapFrame(GAP), "r") == '{"type":"gap",' + GAP_BODY + "}"
    assert ws.encode(HeartbeatFrame(), "r") == '{"type":"heartbeat","run_id":"r"}'


def test_sse_body_writes_a_batch_at_once_and_reports_the_end() -> None:
    """One chunk per bridge read; `on_close(ended)` tells an `end` or gap from a drop."""
    closed: list[bool] = []
    body = sse.sse_body(iter([[TOKEN, VALUES], [Heartbeat()], [END]]), on_close=closed.append)
    chunks = list(body)
    assert len(chunks) == 3 and chunks[1] == b": heartbeat\n\n"
    assert closed == [True]
    dropped: list[bool] = []
    assert list(sse.sse_body(iter([[TOKEN]]), on_close=dropped.append))
    assert dropped == [False]
