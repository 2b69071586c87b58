"""Pins the LangGraph behaviour behind `shared/state/upstream.py` (its private names).

If an upgrade of langgraph changes any of these, rollback in delta mode or the fenced
saver may silently misbehave: this file is the one place that says so.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from shared.state.upstream import delta_snapshot, is_delta_snapshot, saver_connection


def _batch_add(state: list[Any], writes: list[list[Any]]) -> list[Any]:
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


def test_s4_delta_channel_restores_a_snapshot_without_replay() -> None:
    """S4: a snapshot blob is the channel's whole value when read back."""
    channel: DeltaChannel[list[Any]] = DeltaChannel(_batch_add, list, snapshot_frequency=5)
    restored = channel.from_checkpoint(delta_snapshot(["a", "b"]))
    assert restored.get() == ["a", "b"]


def test_s4_snapshot_survives_the_savers_serializer() -> None:
    """S4: the Postgres saver's serializer keeps the snapshot type (msgpack ext code)."""
    serde = JsonPlusSerializer()
    blob = serde.loads_typed(serde.dumps_typed(delta_snapshot([1, 2, 3])))
    assert is_delta_snapshot(blob)
    assert blob.value == [1, 2, 3]
    assert not is_delta_snapshot([1, 2, 3])


def test_l2_saver_connection_refuses_what_is_not_a_connection_or_pool() -> None:
    """L2: the fenced saver's connection adapter accepts only what the saver accepts."""

    async def use(conn: Any) -> None:
        async with saver_connection(conn):
            pass

    with pytest.raises(TypeError):
        asyncio.run(use(object()))
