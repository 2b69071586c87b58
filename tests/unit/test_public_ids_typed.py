"""A4: storage ids become public ids at the typed id positions only (shared/runs/thread_ids.py,
app/public_ids.py): whatever a user wrote (metadata, values, input, messages) comes out as it
went in, even when it holds the caller's storage ids or client ids, and an id is translated
once, so a client id equal to another thread's storage id is never translated twice."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shared import serde
from shared.runs.thread_ids import (
    PublicIds,
    SseTranslator,
    protocol_event_data,
    run_event_data,
    storage_id,
)

# Bob's threads: X1 chose a fresh id; X2 chose X1's storage id as its client id (the chain).
X1 = str(uuid.UUID(int=1))
S1 = storage_id("bob", X1)
X2 = S1
S2 = storage_id("bob", X2)
ALIASES = {S1: X1, S2: X2}
OTHER = str(uuid.UUID(int=7))

ids_text = st.sampled_from([S1, S2, X1, OTHER, f"see {S1}", f"{S2},{S1}", "thread_id"])
scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8) | ids_text
)
keys = st.sampled_from(
    ["thread_id", "configurable", "config", "checkpoint", "metadata", "kwargs", "tasks", "state"]
) | st.text(max_size=6)
content = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=25,
)
"""Arbitrary user JSON, dense in storage ids, client ids and the id positions' own key names."""

storages = st.sampled_from([S1, S2])


def _snapshot(tid: str, user: Any) -> dict[str, Any]:
    return {
        "values": copy.deepcopy(user),
        "next": ["agent"],
        "tasks": [{"id": OTHER, "name": "agent", "interrupts": [], "state": None}],
        "metadata": {"thread_id": tid, "source": "loop", "user": copy.deepcopy(user)},
        "created_at": "2026-12-07T00:00:00Z",
        "checkpoint": {"thread_id": tid, "checkpoint_ns": "", "checkpoint_id": OTHER},
        "parent_checkpoint": None,
        "config": {"configurable": {"thread_id": tid, "checkpoint_id": OTHER}},
        "parent_config": None,
    }


@given(tid=storages, user=content)
def test_a4_snapshot_translation_changes_only_its_id_fields(tid: str, user: Any) -> None:
    """A4: a state snapshot gets its thread's public id at config, checkpoint and
    LangGraph's metadata thread id; its values and the rest of its metadata are untouched."""
    snap = _snapshot(tid, user)
    PublicIds(ALIASES).snapshot(snap)
    want = _snapshot(ALIASES[tid], user)
    assert snap == want


def _run(tid: str, user: Any) -> dict[str, Any]:
    return {
        "run_id": OTHER,
        "thread_id": tid,
        "assistant_id": OTHER,
        "metadata": copy.deepcopy(user),
        "kwargs": {
            "input": copy.deepcopy(user),
            "command": None,
            "config": {"configurable": {"thread_id": tid, "user": copy.deepcopy(user)}},
            "context": copy.deepcopy(user),
        },
    }


@given(tids=st.lists(storages, min_size=1, max_size=4), user=content)
def test_a4_runs_get_their_own_public_id_even_in_a_chain(tids: list[str], user: Any) -> None:
    """A4: a batch of runs on X1 and on X2 (X2 = X1's storage id) answers X1 and X2 each,
    never X1 twice; metadata, input, context and config other than the id stay."""
    runs = [_run(t, user) for t in tids]
    ids = PublicIds(ALIASES)
    for run in runs:
        ids.run(run)
    assert runs == [_run(ALIASES[t], user) for t in tids]
    assert [r["thread_id"] for r in runs] == [ALIASES[t] for t in tids]


def _events(tid: str, user: Any) -> list[tuple[str, Any]]:
    meta = {"thread_id": tid, "run_id": OTHER, "langgraph_node": "agent"}
    return [
        ("metadata", {"run_id": OTHER, "thread_id": tid}),
        ("values", copy.deepcopy(user)),
        ("updates", {"agent": copy.deepcopy(user)}),
        ("custom", copy.deepcopy(user)),
        ("messages", [{"content": copy.deepcopy(user), "id": OTHER}, dict(meta)]),
        ("messages|sub:1", [{"content": copy.deepcopy(user)}, dict(meta)]),
        ("messages/partial", [{"content": copy.deepcopy(user), "thread_id": tid}]),
        ("messages/metadata", {OTHER: {"metadata": dict(meta)}}),
        ("checkpoints", _snapshot(tid, user)),
        ("debug", {"type": "checkpoint", "step": 1, "payload": _snapshot(tid, user)}),
        ("debug", {"type": "task", "step": 1, "payload": {"input": copy.deepcopy(user)}}),
        ("tasks", {"id": OTHER, "input": copy.deepcopy(user), "thread_id": tid}),
        ("events", {"event": "on_chain_end", "data": copy.deepcopy(user), "metadata": meta}),
    ]


def _sse(events: list[tuple[str, Any]]) -> bytes:
    return b"".join(
        f"id: 1-{n}\nevent: {name}\ndata: {serde.dumps_str(data)}\n\n".encode()
        for n, (name, data) in enumerate(events)
    )


@given(tid=storages, user=content, cut=st.integers(min_value=0, max_value=4000))
def test_a4_stream_translation_changes_only_id_positions(tid: str, user: Any, cut: int) -> None:
    """A4: an SSE stream, cut anywhere between two chunks, comes out as if each event's id
    positions (metadata, checkpoints, debug checkpoints, message metadata) were written with
    the public id; the graph's own events (values, updates, custom, tasks, partial
    messages) are relayed byte for byte whatever ids they hold."""
    body = _sse(_events(tid, user))
    sse = SseTranslator(PublicIds(ALIASES), run_event_data)
    out = sse.feed(body[:cut]) + sse.feed(body[cut:]) + sse.flush()
    want = _events(ALIASES[tid], user)
    got = _parsed(out)
    assert [name for name, _ in got] == [name for name, _ in want]
    for (name, data), (_, expected), (_, sent) in zip(got, want, _events(tid, user), strict=True):
        if name.split("|")[0] in ("values", "updates", "custom", "tasks", "messages/partial"):
            assert data == sent  # relayed as it is
        elif name == "debug" and sent["type"] != "checkpoint":
            assert data == sent
        else:
            assert data == expected, name


def _parsed(body: bytes) -> list[tuple[str, Any]]:
    out = []
    for message in body.decode().split("\n\n"):
        if not message:
            continue
        lines = dict(line.split(": ", 1) for line in message.split("\n"))
        out.append((lines["event"], serde.loads(lines["data"])))
    return out


def test_a4_events_without_a_storage_id_are_relayed_byte_for_byte() -> None:
    """A4: the hot path: a chunk of whole messages with no storage id in it is the same
    object out (no parse), as is an event that never holds an id."""
    body = _sse(_events(OTHER, {"a": 1}))
    sse = SseTranslator(PublicIds(ALIASES), run_event_data)
    assert sse.feed(body) is body
    text = serde.dumps_str({"x": S1})
    assert PublicIds(ALIASES).event_text("values", text) is text


@given(tid=storages, user=content)
def test_a4_websocket_frames_change_only_id_positions(tid: str, user: Any) -> None:
    """A4: a WebSocket session's frames: `run.created` carries the run's public thread id,
    event frames are translated as the SSE events are, a frame's user data is untouched."""
    ids = PublicIds(ALIASES)
    created = serde.dumps_str({"type": "run.created", "request_id": 1, "run": _run(tid, user)})
    assert serde.loads(ids.ws_frame(created)) == {
        "type": "run.created",
        "request_id": 1,
        "run": _run(ALIASES[tid], user),
    }
    for (name, data), (_, expected) in zip(
        _events(tid, user), _events(ALIASES[tid], user), strict=True
    ):
        frame = serde.dumps_str(
            {"type": "event", "run_id": OTHER, "id": "1-0", "event": name, "data": data}
        )
        out = serde.loads(ids.ws_frame(frame))["data"]
        if (
            name in ("metadata", "messages", "messages|sub:1", "messages/metadata", "events")
            or name in ("checkpoints",)
            or (name == "debug" and data["type"] == "checkpoint")
        ):
            assert out == expected
        else:
            assert out == data


@given(tid=storages, user=content)
def test_a4_protocol_messages_change_only_id_positions(tid: str, user: Any) -> None:
    """A4: the thread streaming protocol's event messages carry a run event's data under
    `params.data`: the same id positions, nothing else; an error's text is translated."""
    ids = PublicIds(ALIASES)
    for (name, data), (_, expected) in zip(
        _events(tid, user), _events(ALIASES[tid], user), strict=True
    ):
        message = {"type": "event", "seq": 1, "method": name, "params": {"data": data}}
        out = serde.loads(protocol_event_data(ids, name, serde.dumps(message)))
        translated = name in ("metadata", "messages", "messages|sub:1", "messages/metadata")
        translated = translated or name in ("events", "checkpoints")
        translated = translated or (name == "debug" and data["type"] == "checkpoint")
        assert out["params"]["data"] == (expected if translated else data)
    error = {"type": "error", "error": "resume_gap", "message": f"GET /threads/{S2}/state"}
    out = serde.loads(protocol_event_data(ids, "error", serde.dumps(error)))
    assert out["message"] == f"GET /threads/{X2}/state"  # once: not on to X1


def test_a4_text_translates_each_id_once() -> None:
    """A4: a server-made message naming both threads names X1 and X2 (not X1 twice)."""
    ids = PublicIds(ALIASES)
    assert ids.text(f"threads {S1} and {S2}") == f"threads {X1} and {X2}"
    assert ids.text(f"/threads/{S2}/runs/{OTHER}") == f"/threads/{X2}/runs/{OTHER}"
