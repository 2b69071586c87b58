"""A4: thread ids are per owner: storage ids of client-chosen ids, and their translation
into public ids on the way out (shared/runs/thread_ids.py)."""

from __future__ import annotations

import uuid

import pytest

from shared.runs.thread_ids import PublicIds, SseTranslator, run_event_data, storage_id


def test_a4_storage_id_is_per_owner_and_stable() -> None:
    """A4: one client id is stored under a different id per owner, the same every time,
    and never under the id itself (so no user's choice can meet another user's thread)."""
    public = str(uuid.uuid4())
    alice, bob = storage_id("alice", public), storage_id("bob", public)
    assert alice != bob and public not in (alice, bob)
    assert storage_id("alice", public) == alice
    assert storage_id("alice", public.upper()) == alice  # the canonical form is what counts
    assert uuid.UUID(alice).version == 5
    with pytest.raises(ValueError):
        storage_id("alice", "not-a-uuid")


def test_a4_translation_writes_public_ids_at_id_positions_once() -> None:
    """A4: a snapshot gets every public id in place of its storage id at its id positions;
    other ids stay, and a public id equal to another thread's storage id is not translated
    again; server-made text is translated id by id."""
    p1, other = str(uuid.uuid4()), str(uuid.uuid4())
    s1 = storage_id("bob", p1)
    s2 = storage_id("bob", s1)  # a second thread whose client id is the first's storage id
    ids = PublicIds({s1: p1, s2: s1, other: other})
    snap = {
        "config": {"configurable": {"thread_id": s1}},
        "parent_config": {"configurable": {"thread_id": s2}},
        "checkpoint": {"thread_id": s2},
        "values": {"run_id": other, "thread_id": s1},
    }
    ids.snapshot(snap)
    assert snap == {
        "config": {"configurable": {"thread_id": p1}},
        "parent_config": {"configurable": {"thread_id": s1}},
        "checkpoint": {"thread_id": s1},
        "values": {"run_id": other, "thread_id": s1},
    }
    assert not PublicIds({other: other})  # a server-made id needs no translation
    assert ids.text(f"thread {s1} and {s2}") == f"thread {p1} and {s1}"


@pytest.mark.parametrize("cut", [1, 5, 20, 35, 36, 37])
def test_a4_sse_translation_handles_an_id_cut_between_chunks(cut: int) -> None:
    """A4: a stream whose chunk boundary cuts a storage id still comes out translated, and
    whole messages without one go out at once (heartbeats)."""
    public = str(uuid.uuid4())
    storage = storage_id("bob", public)
    stream = f'event: metadata\ndata: {{"thread_id":"{storage}"}}\n\n'.encode()
    at = stream.index(storage.encode()) + cut
    sse = SseTranslator(PublicIds({storage: public}), run_event_data)
    out = sse.feed(stream[:at]) + sse.feed(stream[at:]) + sse.flush()
    assert out == stream.replace(storage.encode(), public.encode())
    assert sse.feed(b": heartbeat\n\n") == b": heartbeat\n\n"
    held = sse.feed(b"event: values\ndata: " + storage.encode()[:10])
    assert held == b"" and sse.flush() == b"event: values\ndata: " + storage.encode()[:10]
