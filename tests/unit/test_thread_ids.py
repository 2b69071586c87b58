"""A4: thread ids are per owner: storage ids of client-chosen ids, and the rewrite of
storage ids into public ids on the way out (shared/runs/thread_ids.py)."""

from __future__ import annotations

import uuid

import pytest

from shared.runs.thread_ids import AliasRewriter, rewrite_text, storage_id


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


def test_a4_rewriter_replaces_storage_ids_by_public_ids() -> None:
    """A4: a whole body gets every public id in place of its storage id; other ids stay."""
    p1, p2, other = (str(uuid.uuid4()) for _ in range(3))
    s1, s2 = storage_id("bob", p1), storage_id("bob", p2)
    rw = AliasRewriter({s1: p1, s2: p2, other: other})
    body = f'{{"thread_id":"{s1}","parent":{{"thread_id":"{s2}"}},"run_id":"{other}"}}'.encode()
    assert rw.rewrite(body).decode() == (
        f'{{"thread_id":"{p1}","parent":{{"thread_id":"{p2}"}},"run_id":"{other}"}}'
    )
    assert not AliasRewriter({other: other})  # a server-made id needs no translation
    assert rewrite_text(f"thread {s1} not found", {s1: p1}) == f"thread {p1} not found"


@pytest.mark.parametrize("cut", [1, 5, 20, 35, 36, 37])
def test_a4_rewriter_handles_an_id_cut_between_chunks(cut: int) -> None:
    """A4: a stream whose chunk boundary cuts a storage id still comes out rewritten, and
    nothing else is held back (heartbeats go out at once)."""
    public = str(uuid.uuid4())
    storage = storage_id("bob", public)
    stream = f'data: {{"thread_id": "{storage}"}}\n\n'.encode()
    at = stream.index(storage.encode()) + cut
    rw = AliasRewriter({storage: public})
    out = rw.feed(stream[:at]) + rw.feed(stream[at:]) + rw.flush()
    assert out == stream.replace(storage.encode(), public.encode())
    assert rw.feed(b": heartbeat\n\n") == b": heartbeat\n\n"
    assert rw.feed(b"\n") == b"\n"
    held = rw.feed(b"x" + storage.encode()[:10])
    assert held == b"x" and rw.flush() == storage.encode()[:10]
