"""Checkpoint channel modes (SPEC S4): `full` (plain channels) or `delta` (DeltaChannel).

In `delta` mode the append-heavy `messages` channel is a langgraph `DeltaChannel`: a
checkpoint stores only the step's new messages, and every `snapshot_every` updates a full
snapshot, so a 500-message thread does not rewrite 500 messages per step. A `full`
process reading such a checkpoint would see the channel missing, i.e. an empty
conversation, so the mode is:

- fixed when a process builds its graphs (`THREADRUN_CHECKPOINT_MODE`, restart to change);
- stamped into every checkpoint's metadata (`METADATA_KEY`) by our savers;
- checked before a snapshot is returned or written on top of: a `delta` process reads
  `full` checkpoints (the migration direction), a `full` process refuses `delta` ones
  with `CheckpointModeMismatch` (HTTP 409) instead of reading a sentinel as empty state;
- recorded in the database (`threadrun_checkpoint_mode`): a process whose mode or
  snapshot frequency differs from the record refuses to start. The one allowed change is
  full -> delta, done explicitly: `python -m shared.state.modes migrate --to delta`.
"""

from __future__ import annotations

import argparse
import functools
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Required

import psycopg
from langchain_core.messages import AnyMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph.message import add_messages
from psycopg.rows import DictRow

from shared.errors import ConfigError, Conflict
from shared.settings import Settings, get_settings
from shared.state.thread_state import ThreadState

CheckpointMode = Literal["full", "delta"]
METADATA_KEY = "threadrun_checkpoint_mode"
"""Checkpoint metadata key holding the mode of the process that wrote it."""
LEGACY_MODE: CheckpointMode = "full"
"""Checkpoints written before modes were stamped were written with plain channels."""


class CheckpointModeMismatch(Conflict):
    """A checkpoint written in `delta` mode met a `full` process (S4: fail closed)."""

    code = "checkpoint_mode_mismatch"


class CheckpointModeRecordMismatch(ConfigError, RuntimeError):
    """The process's mode or snapshot frequency differs from the database's record."""


def add_messages_batch(state: list[AnyMessage], writes: Sequence[Any]) -> list[AnyMessage]:
    """`add_messages` over a batch of writes, the reducer shape `DeltaChannel` wants.

    Folding one write at a time makes it batching-invariant by construction:
    f(f(s, xs), ys) == f(s, xs + ys).
    """
    merge: Any = add_messages
    merged: list[AnyMessage] = functools.reduce(merge, writes, state)
    return merged


@functools.cache
def thread_state_schema(mode: CheckpointMode, snapshot_every: int) -> type:
    """`ThreadState` for `full`; for `delta`, the same schema with `messages` a DeltaChannel.

    Cached: one class per (mode, frequency), so graphs built twice share their schema.
    """
    if mode == "full":
        return ThreadState
    channel: DeltaChannel[list[AnyMessage]] = DeltaChannel(
        add_messages_batch, snapshot_frequency=snapshot_every
    )
    annotations = {"messages": Required[Annotated[list[AnyMessage], channel]]}
    return types.new_class(
        "DeltaThreadState",
        (ThreadState,),
        {},
        lambda ns: ns.update({"__annotations__": annotations, "__module__": __name__}),
    )


def stamped_mode(metadata: Mapping[str, Any] | None) -> CheckpointMode:
    """The mode a checkpoint was written in (legacy, unstamped checkpoints are `full`)."""
    mode = (metadata or {}).get(METADATA_KEY, LEGACY_MODE)
    return "delta" if mode == "delta" else "full"


def check_readable(process_mode: CheckpointMode, metadata: Mapping[str, Any] | None) -> None:
    """Raise `CheckpointModeMismatch` when this process must not read the checkpoint."""
    written = stamped_mode(metadata)
    if process_mode == "full" and written == "delta":
        raise CheckpointModeMismatch(
            "this thread's checkpoints were written in 'delta' mode and this server runs in"
            " 'full' mode; run every process with THREADRUN_CHECKPOINT_MODE=delta"
            " (delta -> full is not supported)"
        )


# --- the database record -------------------------------------------------------------------
READ_RECORD_SQL = "SELECT mode, snapshot_every FROM threadrun_checkpoint_mode WHERE id"
INSERT_RECORD_SQL = """
INSERT INTO threadrun_checkpoint_mode (id, mode, snapshot_every) VALUES (true, %s, %s)
ON CONFLICT (id) DO NOTHING
"""
UPDATE_RECORD_SQL = """
UPDATE threadrun_checkpoint_mode SET mode = %s, snapshot_every = %s, updated_at = now() WHERE id
"""


def ensure_recorded_mode(conn: psycopg.Connection[DictRow], settings: Settings) -> None:
    """Record this process's mode on first start; refuse a process that disagrees with it."""
    mode, every = settings.checkpoint_mode, settings.checkpoint_snapshot_every
    conn.execute(INSERT_RECORD_SQL, (mode, every))
    row = conn.execute(READ_RECORD_SQL).fetchone()
    assert row is not None
    if (row["mode"], row["snapshot_every"]) == (mode, every):
        return
    raise CheckpointModeRecordMismatch(
        f"the checkpoint database records mode={row['mode']!r}"
        f" snapshot_every={row['snapshot_every']}, but this process has"
        f" THREADRUN_CHECKPOINT_MODE={mode!r} THREADRUN_CHECKPOINT_SNAPSHOT_EVERY={every}."
        " Every process sharing the database must use the same settings. To move a"
        " deployment from full to delta: stop every process, run"
        " `python -m shared.state.modes migrate --to delta --snapshot-every N`, then start"
        " them all with THREADRUN_CHECKPOINT_MODE=delta (delta -> full is not supported)."
    )


def migrate_recorded_mode(
    conn: psycopg.Connection[DictRow], to_mode: CheckpointMode, snapshot_every: int
) -> str:
    """Change the record: full -> delta, or delta's snapshot frequency. Returns a message."""
    conn.execute(INSERT_RECORD_SQL, (LEGACY_MODE, snapshot_every))
    row = conn.execute(READ_RECORD_SQL).fetchone()
    assert row is not None
    if row["mode"] == "delta" and to_mode == "full":
        raise CheckpointModeRecordMismatch(
            "delta -> full is not supported: full processes cannot read delta checkpoints"
        )
    conn.execute(UPDATE_RECORD_SQL, (to_mode, snapshot_every))
    return f"checkpoint mode: {row['mode']} -> {to_mode} (snapshot every {snapshot_every})"


def main(argv: list[str] | None = None) -> int:
    """`python -m shared.state.modes show | migrate --to delta [--snapshot-every N]`."""
    parser = argparse.ArgumentParser(prog="python -m shared.state.modes")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("show", help="print the recorded mode")
    mig = sub.add_parser("migrate", help="change the recorded mode (full -> delta only)")
    mig.add_argument("--to", choices=["full", "delta"], required=True)
    mig.add_argument("--snapshot-every", type=int, default=None)
    args = parser.parse_args(argv)
    settings = get_settings()
    from psycopg.rows import dict_row

    with psycopg.connect(settings.dsn, autocommit=True, row_factory=dict_row) as conn:
        if args.cmd == "show":
            row = conn.execute(READ_RECORD_SQL).fetchone()
            print(dict(row) if row else "no mode recorded yet (the first process records it)")
            return 0
        every = args.snapshot_every or settings.checkpoint_snapshot_every
        if every < 1:
            parser.error("--snapshot-every must be >= 1")
        try:
            print(migrate_recorded_mode(conn, args.to, every))
        except CheckpointModeRecordMismatch as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
