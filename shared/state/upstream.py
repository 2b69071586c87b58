"""The private LangGraph names threadrun depends on, each behind one adapter.

LangGraph keeps these two underscore names out of its public API, but our rollback and
our fenced saver must do exactly what LangGraph itself does with them. Each is used only
through a function here, and `tests/unit/test_upstream_pins.py` pins the upstream
behaviour we rely on, so an upgrade that changes it fails one named test instead of
corrupting a thread's state.

One more family lives beside its single user: the delta-history helpers of LangGraph's
Postgres saver (`_build_delta_stage1_sql`, `_build_delta_stage2_sql` and three
`BasePostgresSaver` methods), which shared/state/delta_history.py drives with its own page
size; tests/integration/test_s4_delta_history.py pins its results to LangGraph's own read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from langgraph.checkpoint.postgres import _ainternal
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

AsyncConn = AsyncConnection[DictRow] | AsyncConnectionPool[AsyncConnection[DictRow]]
"""What `AsyncPostgresSaver.conn` may hold: one connection or a pool."""


def delta_snapshot(value: Any) -> Any:
    """A `DeltaChannel` blob that holds the channel's whole value (no ancestor replay).

    Rollback writes the restored `messages` as a snapshot so that reading the new head
    never walks back into the undone run's deltas; `DeltaChannel.from_checkpoint` and the
    Postgres saver recognise only LangGraph's own snapshot type for that.
    """
    return _DeltaSnapshot(value)


def is_delta_snapshot(blob: Any) -> bool:
    """Whether a stored channel blob is a `DeltaChannel` snapshot."""
    return isinstance(blob, _DeltaSnapshot)


@asynccontextmanager
async def saver_connection(conn: AsyncConn) -> AsyncIterator[AsyncConnection[DictRow]]:
    """The connection the Postgres saver itself would use for `conn` (taken from the pool
    if it is one), so a fenced write shares the saver's connection handling exactly."""
    async with _ainternal.get_connection(conn) as c:
        yield c
