"""R1, R3, R5: the run vocabulary matches the SQL schema, the API schema and the SDK, and
`Run` / `Thread` are built faithfully from database rows."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import typing
import uuid
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import pytest
from langgraph_sdk import schema as sdk
from pydantic import ValidationError

from app.schemas import RunCreate
from shared.runs.model import (
    INFLIGHT_STATUSES,
    TERMINAL_STATUSES,
    CancelAction,
    CancelFilter,
    MultitaskStrategy,
    OnCompletion,
    OnDisconnect,
    PruneStrategy,
    Run,
    RunStatus,
    Thread,
    ThreadStatus,
    ThreadTTL,
)
from shared.settings import PROJECT_ROOT

MIGRATIONS = PROJECT_ROOT / "shared" / "db" / "migrations"
T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(seconds=7)


def values(enum: type[StrEnum]) -> set[str]:
    """The plain strings of a StrEnum."""
    return {str(member.value) for member in enum}


# --- the SQL schema -------------------------------------------------------------------------
def _tables(sql: str) -> Iterator[tuple[str, str]]:
    """(name, body) of each CREATE TABLE in a migration."""
    for m in re.finditer(r"CREATE TABLE (\w+) \((.*?)\n\);", sql, re.DOTALL):
        yield m.group(1), m.group(2)


def _added_columns(sql: str) -> Iterator[tuple[str, str]]:
    """(table, column definition) of each `ALTER TABLE … ADD COLUMN` in a migration."""
    for m in re.finditer(r"ALTER TABLE (\w+) ADD COLUMN (?:IF NOT EXISTS )?(.*?);", sql, re.DOTALL):
        yield m.group(1), m.group(2)


def sql_checks() -> dict[tuple[str, str], set[str]]:
    """The `CHECK (column IN ('a', 'b', ...))` value sets of every migration (in CREATE
    TABLE bodies and in added columns), by (table, column)."""
    checks: dict[tuple[str, str], set[str]] = {}
    for path in sorted(MIGRATIONS.glob("*.sql")):
        sql = path.read_text()
        for table, body in [*_tables(sql), *_added_columns(sql)]:
            for m in re.finditer(r"CHECK \((\w+) IN \(([^)]*)\)\)", body):
                checks[(table, m.group(1))] = set(re.findall(r"'([^']*)'", m.group(2)))
    return checks


def test_the_check_constraints_are_parsed() -> None:
    """The parser finds the value constraints of the runs tables (it must not pass vacuously)."""
    assert {
        ("threads", "status"),
        ("runs", "status"),
        ("runs", "cancel_action"),
        ("runs", "on_completion"),
    } <= set(sql_checks())


@pytest.mark.parametrize(
    ("table", "column", "enum"),
    [
        ("runs", "status", RunStatus),
        ("threads", "status", ThreadStatus),
        ("runs", "cancel_action", CancelAction),
        ("runs", "on_completion", OnCompletion),
    ],
)
def test_r1_enum_values_are_exactly_the_sql_check_values(
    table: str, column: str, enum: type[StrEnum]
) -> None:
    """R1, R5: every status or action the database accepts has a member, and no other."""
    assert values(enum) == sql_checks()[(table, column)]


def test_r1_terminal_and_inflight_partition_run_statuses() -> None:
    """R1: pending and running are inflight; every other status is terminal."""
    assert {RunStatus.PENDING, RunStatus.RUNNING} == INFLIGHT_STATUSES
    assert set(RunStatus) == INFLIGHT_STATUSES | TERMINAL_STATUSES
    assert not INFLIGHT_STATUSES & TERMINAL_STATUSES
    for status in RunStatus:
        assert status.terminal == (status in TERMINAL_STATUSES)
        assert status.inflight == (status in INFLIGHT_STATUSES) != status.terminal
    assert "success" in TERMINAL_STATUSES and "running" not in TERMINAL_STATUSES


# --- the API schema and the SDK ---------------------------------------------------------------
def test_r3_multitask_strategy_is_what_run_create_accepts() -> None:
    """R3: RunCreate accepts exactly the strategies of the enum (its JSON schema says so, and
    validation agrees), and those are the SDK's."""
    schema = RunCreate.model_json_schema()
    refs = [s["$ref"] for s in schema["properties"]["multitask_strategy"]["anyOf"] if "$ref" in s]
    assert len(refs) == 1
    accepted = schema["$defs"][refs[0].rsplit("/", 1)[-1]]["enum"]
    assert set(accepted) == values(MultitaskStrategy)
    for strategy in values(MultitaskStrategy):
        run = RunCreate.model_validate({"assistant_id": "a", "multitask_strategy": strategy})
        assert run.multitask_strategy == strategy
        assert isinstance(run.multitask_strategy, MultitaskStrategy)
    with pytest.raises(ValidationError):
        RunCreate.model_validate({"assistant_id": "a", "multitask_strategy": "sometimes"})
    assert values(MultitaskStrategy) == set(typing.get_args(sdk.MultitaskStrategy))


@pytest.mark.parametrize(
    ("enum", "literal"),
    [
        (RunStatus, sdk.RunStatus),
        (ThreadStatus, sdk.ThreadStatus),
        (MultitaskStrategy, sdk.MultitaskStrategy),
        (OnDisconnect, sdk.DisconnectMode),
        (CancelAction, sdk.CancelAction),
        (OnCompletion, sdk.OnCompletionBehavior),
        (CancelFilter, sdk.BulkCancelRunsStatus),
    ],
)
def test_a1_enum_values_are_the_sdk_literals(enum: type[StrEnum], literal: Any) -> None:
    """A1: clients send and read exactly the SDK's strings."""
    assert values(enum) == set(typing.get_args(literal))


def test_enum_members_are_their_strings() -> None:
    """StrEnum members compare, hash and format as the plain strings (SQL, JSON, logs)."""
    success: str = RunStatus.SUCCESS
    assert success == "success" and hash(success) == hash("success")
    assert f"{ThreadStatus.BUSY}" == "busy" and str(CancelAction.ROLLBACK) == "rollback"
    assert {"interrupt": 1}[MultitaskStrategy.INTERRUPT] == 1


# --- rows -----------------------------------------------------------------------------------
def run_row() -> dict[str, Any]:
    """A `runs` row as psycopg's dict_row returns it after a claim (uuid ids, jsonb decoded,
    the owner joined as `user_id`, and a column `Run` does not carry)."""
    return {
        "run_id": uuid.UUID("0b8a6a53-8c1d-4f6e-9a53-6f0f7c4f2b10"),
        "seq": 42,
        "thread_id": uuid.UUID("5f1e0c2a-7d3b-4e8f-8a1c-2b9d6e4f0a37"),
        "assistant_id": "lead_agent",
        "graph_id": "lead_agent",
        "status": "running",
        "input": {"messages": [{"role": "user", "content": "hi"}]},
        "command": None,
        "config": {"configurable": {"tokens": 3}},
        "context": None,
        "metadata": {"source": "test"},
        "kwargs": {"stream_mode": ["values"], "durability": "async"},
        "multitask_strategy": "rollback",
        "on_disconnect": "cancel",
        "created_at": T0,
        "updated_at": T1,
        "dispatched_at": T0,
        "due_at": None,
        "started_at": T1,
        "ended_at": None,
        "owner": "worker-1:4242",
        "owner_epoch": 3,
        "attempt": 2,
        "pre_run_checkpoint_id": "1f0c-checkpoint",
        "pre_run_writes": [["task", "messages", "x"]],
        "cancel_action": "rollback",
        "error": None,
        "usage": {"input_tokens": 5},
        "on_completion": "keep",
        "last_message": "hi",
        "user_id": "alice",
        "webhook": "https://hooks.example.com/in",
        "thread_public_id": uuid.UUID("9d2c4a1e-3b5f-4c7d-8e9f-0a1b2c3d4e5f"),
    }


def test_r1_run_from_a_full_row() -> None:
    """Every field of `Run` comes from its column: ids as str, enums parsed, the rest as is."""
    row = run_row()
    run = Run.from_row(row)
    assert run.run_id == str(row["run_id"]) and isinstance(run.run_id, str)
    assert run.thread_id == str(row["thread_id"]) and isinstance(run.thread_id, str)
    assert run.status is RunStatus.RUNNING and not run.terminal
    assert run.multitask_strategy is MultitaskStrategy.ROLLBACK
    assert run.on_disconnect is OnDisconnect.CANCEL
    assert run.cancel_action is CancelAction.ROLLBACK
    assert run.on_completion is OnCompletion.KEEP and not run.deletes_thread
    for f in dataclasses.fields(Run):
        expected = row[f.name]
        if isinstance(expected, uuid.UUID):
            expected = str(expected)
        assert getattr(run, f.name) == expected, f.name
    # Round trip: the record's fields are the row's columns, minus the ones it does not carry.
    as_row = {k: (str(v) if isinstance(v, uuid.UUID) else v) for k, v in row.items()}
    del as_row["last_message"]
    assert dataclasses.asdict(run) == as_row
    assert Run.from_row(dataclasses.asdict(run)) == run


def test_r1_run_from_a_minimal_row_defaults_the_optional_columns() -> None:
    """A row with only the NOT NULL columns without defaults (and NULL jsonb) still builds."""
    row = {
        "run_id": uuid.uuid4(),
        "thread_id": uuid.uuid4(),
        "assistant_id": "a",
        "graph_id": "g",
        "status": "success",
        "multitask_strategy": "enqueue",
        "on_disconnect": "continue",
        "created_at": T0,
        "updated_at": T1,
        "config": None,
        "cancel_action": None,
    }
    run = Run.from_row(row)
    assert run.status is RunStatus.SUCCESS and run.terminal
    assert (run.config, run.metadata, run.kwargs) == ({}, {}, {})
    assert (run.input, run.command, run.context, run.error, run.usage) == (None,) * 5
    assert (run.seq, run.owner_epoch, run.attempt) == (0, 0, 0)
    assert (run.owner, run.user_id, run.cancel_action) == (None, None, None)
    assert run.on_completion is None and not run.deletes_thread
    assert (run.dispatched_at, run.started_at, run.ended_at) == (None, None, None)
    assert (run.pre_run_checkpoint_id, run.pre_run_writes) == (None, None)


def test_r1_run_from_a_row_refuses_unknown_values() -> None:
    """A status the schema does not know is an error, not a silent string."""
    with pytest.raises(ValueError):
        Run.from_row({**run_row(), "status": "paused"})
    with pytest.raises(ValueError):
        Run.from_row({**run_row(), "cancel_action": "explode"})
    with pytest.raises(ValueError):
        Run.from_row({**run_row(), "on_completion": "archive"})


def test_run_is_frozen() -> None:
    """A `Run` is a snapshot of a row: it cannot be changed in place."""
    run = Run.from_row(run_row())
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.status = RunStatus.SUCCESS  # type: ignore[misc]


def test_thread_from_a_row() -> None:
    """A `threads` row: the id as str, the status parsed, metadata defaulted when NULL."""
    row: dict[str, Any] = {
        "thread_id": uuid.UUID("5f1e0c2a-7d3b-4e8f-8a1c-2b9d6e4f0a37"),
        "owner": "alice",
        "metadata": {"graph_id": "lead_agent", "k": "v"},
        "status": "busy",
        "created_at": T0,
        "updated_at": T1,
        "public_id": uuid.UUID("9d2c4a1e-3b5f-4c7d-8e9f-0a1b2c3d4e5f"),
    }
    thread = Thread.from_row(row)
    assert thread.status is ThreadStatus.BUSY
    assert thread.client_id == str(row["public_id"])  # the id its owner sees (A4)
    assert dataclasses.asdict(thread) == {
        **row,
        "thread_id": str(row["thread_id"]),
        "public_id": str(row["public_id"]),
        "ttl": None,  # no TTL columns in the row: the thread never expires (P6)
        "expires_at": None,
    }
    assert Thread.from_row(dataclasses.asdict(thread)) == thread
    timed = Thread.from_row(
        {**row, "ttl_strategy": "keep_latest", "ttl_minutes": 5, "expires_at": T1}
    )
    assert timed.ttl == ThreadTTL(PruneStrategy.KEEP_LATEST, 5.0) and timed.expires_at == T1
    bare = Thread.from_row({**row, "metadata": None, "status": "idle"})
    assert bare.metadata == {} and bare.status is ThreadStatus.IDLE
