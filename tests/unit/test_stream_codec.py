"""The replay buffer's compact encoding (shared/bridge/codec.py, B1): what is decoded is
exactly what was published, so clients get the same bytes as before it existed."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from langchain_core.messages import AIMessageChunk, ToolMessage

from app.streaming import sse, ws
from app.streaming.frames import EndFrame, EventFrame
from shared import serde
from shared.bridge.base import END_EVENT, Event
from shared.bridge.codec import (
    CodecSettings,
    EventEncoder,
    UndecodableEntry,
    decode,
    dictionary_ref,
    encode_plain,
)
from shared.bridge.hub import SharedEntries
from workers.stream_modes import StreamTranslator

DEFAULTS = CodecSettings()


def bench_shaped_run(tokens: int = 200) -> list[tuple[str, bytes]]:
    """A run shaped like the comparison benchmark's (messages-tuple + values: metadata,
    a values event, `tokens` chunks with LangGraph's per-chunk metadata, a tool message,
    two values events, end), built from LangChain messages as a worker encodes them."""
    run_id, thread_id, msg_id = str(uuid.uuid4()), str(uuid.uuid4()), f"lc_run--{uuid.uuid4()}"
    ids = {"thread_id": thread_id, "run_id": run_id, "assistant_id": str(uuid.uuid4())}
    meta: dict[str, Any] = {
        **ids,
        "graph_id": "bench",
        "user_id": "alice",
        "attempt": 1,
        "langgraph_step": 1,
        "langgraph_node": "model",
        "langgraph_triggers": ["branch:to:model"],
        "langgraph_path": ["__pregel_pull", "model"],
        "langgraph_checkpoint_ns": f"model:{uuid.uuid4()}",
        "ls_provider": "fakestreamingchatmodel",
        "ls_model_type": "chat",
    }
    tr = StreamTranslator(["messages-tuple", "values"], subgraphs=False)
    human = {"messages": [{"content": "bench request 0", "type": "human", "id": str(uuid.uuid4())}]}
    out = [("metadata", serde.dumps({"run_id": run_id, "attempt": 1}))]
    out.append(("values", serde.dumps(human)))
    text = ""
    for i in range(tokens):
        chunk = AIMessageChunk(content=f"t{i:04d} ", id=msg_id)
        text += chunk.content  # type: ignore[operator]
        out.extend((n, serde.dumps(d)) for n, d in tr.events(("messages", (chunk, meta))))
    tool = ToolMessage(content="result", tool_call_id="call_0", name="fake_lookup")
    tool_meta = {**meta, "langgraph_step": 2, "langgraph_node": "tool"}
    out.extend((n, serde.dumps(d)) for n, d in tr.events(("messages", (tool, tool_meta))))
    ai = {"content": text, "type": "ai", "id": msg_id}
    out.append(("values", serde.dumps({"messages": [*human["messages"], ai]})))
    out.append(("values", serde.dumps({"messages": [*human["messages"], ai, tool.model_dump()]})))
    out.append((END_EVENT, serde.dumps({"run_id": run_id, "status": "success"})))
    return out


def round_trip(
    events: list[tuple[str, bytes]], splits: list[int], settings: CodecSettings = DEFAULTS
) -> tuple[list[tuple[str, bytes]], dict[str, bytes]]:
    """Encode in calls cut at `splits` as a sink would; (stored events, stored dictionaries)."""
    enc = EventEncoder("7", settings)
    stored: list[tuple[str, bytes]] = []
    dictionaries: dict[str, bytes] = {}
    cuts = sorted({0, len(events), *(s % (len(events) + 1) for s in splits)})
    for a, b in zip(cuts, cuts[1:], strict=False):
        batch = enc.encode(events[a:b])
        new = batch.dictionaries[: batch.new]
        assert all(d.id not in dictionaries for d in new), "a dictionary is stored once"
        dictionaries.update((d.id, d.body) for d in new)
        assert all(d.id in dictionaries for d in batch.dictionaries), "referenced before stored"
        stored.extend(batch.events)
    return stored, dictionaries


def test_b1_bench_shaped_run_decodes_exactly_and_is_compact() -> None:
    """B1: the bench run's 206 events decode to the very bytes published, and the stored
    data (entries + dictionaries) is under a tenth of the JSON."""
    events = bench_shaped_run()
    assert len(events) == 206
    stored, dictionaries = round_trip(events, [1, 7, 100])
    assert [(n, decode(d, dictionaries.get)) for n, d in stored] == events
    raw = sum(len(d) for _, d in events)
    packed = sum(len(d) for _, d in stored) + sum(map(len, dictionaries.values()))
    assert packed * 10 < raw, (packed, raw)
    chunks = [d for n, d in stored if n == "messages"]
    assert sum(map(len, chunks)) / len(chunks) < 40  # a token chunk: ~20 bytes, not ~900


def test_b1_sse_and_websocket_frames_are_byte_identical() -> None:
    """B1, A1: every SSE and WebSocket frame of the decoded events is the frame of the
    event as published."""
    events = bench_shaped_run(50)
    stored, dictionaries = round_trip(events, [3])
    for i, ((name, data), (_, d)) in enumerate(zip(events, stored, strict=True)):
        before = Event(f"{i}-0", name, data.decode())
        after = Event(f"{i}-0", name, decode(d, dictionaries.get).decode())
        frame = EndFrame if name == END_EVENT else EventFrame
        assert sse.encode(frame(after)) == sse.encode(frame(before))
        assert ws.encode(frame(after), "r") == ws.encode(frame(before), "r")


payloads = st.one_of(
    st.binary(max_size=600),
    st.binary(min_size=1, max_size=40).map(lambda b: b * 20),  # repetitive: it compresses
    st.sampled_from([b"\x00", b"\x01", b"\x02abc", b"\x02x:y", b""]),
    st.text(max_size=300).map(lambda t: serde.dumps({"t": t, "pad": "metadata" * 20})),
)


@hsettings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["messages", "values", "custom|a"]), payloads)),
    st.lists(st.integers(min_value=0, max_value=50), max_size=4),
    st.integers(min_value=0, max_value=3),
)
def test_b1_property_decode_of_encode_is_identity(
    events: list[tuple[str, bytes]], splits: list[int], max_dicts: int
) -> None:
    """B1: any payloads, any call boundaries, any dictionary budget: decode(encode(x)) == x;
    and without dictionaries too."""
    settings = CodecSettings(min_bytes=16, max_dicts=max_dicts)
    stored, dictionaries = round_trip(events, splits, settings)
    assert [(n, decode(d, dictionaries.get)) for n, d in stored] == events
    for _, data in events:
        assert decode(encode_plain(data, settings)) == data


def test_b1_json_entries_of_before_decode_as_themselves() -> None:
    """B1: an entry written before the encoding (plain JSON) is its own data, and with the
    encoding off the stored bytes are the JSON itself (what `json` in make bench stores)."""
    events = bench_shaped_run(3)
    for _, data in events:
        assert decode(data) == data
    stored, dictionaries = round_trip(events, [], CodecSettings(enabled=False))
    assert stored == events and not dictionaries


def test_b1_dictionary_ids_name_the_attempt_and_a_missing_one_is_undecodable() -> None:
    """B2, B5: dictionary ids carry the attempt's epoch (never reused for a run, so a reader
    may cache them); an entry whose dictionary is gone does not decode to anything else."""
    events = bench_shaped_run(3)
    stored, dictionaries = round_trip(events, [])
    refs = {dictionary_ref(d) for _, d in stored} - {None}
    assert refs and all(r is not None and r.startswith("7.") for r in refs)
    chunk = next(d for n, d in stored if n == "messages")
    with pytest.raises(UndecodableEntry):
        decode(chunk)
    with pytest.raises(UndecodableEntry):
        decode(b"\x01not deflate")


def test_b1_hub_entries_decode_once_for_every_subscriber() -> None:
    """B1: a hub read shared by many followers is decoded once, not once per follower."""
    calls: list[int] = []

    def decode_all(raw: list[Any]) -> list[Any]:
        calls.append(1)
        return [x * 2 for x in raw]

    shared = SharedEntries([1, 2, 3])
    results: list[list[Any]] = []
    threads = [
        threading.Thread(target=lambda: results.append(shared.decoded(decode_all)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and results == [[2, 4, 6]] * 8
    assert list(shared) == [1, 2, 3] and len(shared) == 3
