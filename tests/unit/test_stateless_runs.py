"""A1, A3, R5: runs without a thread, batches and bulk cancels, as pure decisions: the
request models, the `/wait` answer, the bulk-cancel filter and the workspace path."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic import ValidationError

from app.http import validate_items
from app.schemas import BatchRunCreate, RunCreate, RunsCancel, StatelessRunCreate
from shared.errors import ValidationFailed
from shared.runs.model import (
    INFLIGHT_STATUSES,
    CancelFilter,
    OnCompletion,
    RunStatus,
)
from shared.runs.result import RUN_FAILED, final_result

TID = "5f1e0c2a-7d3b-4e8f-8a1c-2b9d6e4f0a37"


def refused(model: type[RunCreate] | type[RunsCancel], data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return str(info.value)


# --- on_completion and the temporary thread ----------------------------------------------------
def test_a1_stateless_request_gets_a_new_thread_deleted_by_default() -> None:
    """A1: a run without a thread runs on a new thread created at admission;
    on_completion defaults to delete, as the SDK documents."""
    body = StatelessRunCreate.model_validate({"assistant_id": "lead_agent"})
    one, two = body.to_request(), body.to_request()
    assert one.create_thread and one.stateless and one.on_completion is OnCompletion.DELETE
    assert one.thread_id != two.thread_id and str(uuid.UUID(one.thread_id)) == one.thread_id
    keep = StatelessRunCreate.model_validate({"assistant_id": "a", "on_completion": "keep"})
    assert keep.to_request(TID).on_completion is OnCompletion.KEEP
    assert keep.to_request(TID).thread_id == TID


def test_a3_on_completion_on_a_thread_run_is_refused_not_ignored() -> None:
    """A3: on a thread run on_completion would mean nothing (the official server ignores
    it); we refuse it, naming it."""
    assert "on_completion" in refused(RunCreate, {"assistant_id": "a", "on_completion": "keep"})
    item = {"assistant_id": "a", "thread_id": TID, "on_completion": "delete"}
    assert "on_completion" in refused(BatchRunCreate, item)
    assert RunCreate.model_validate({"assistant_id": "a"}).to_request(TID).on_completion is None
    with pytest.raises(ValidationError):
        StatelessRunCreate.model_validate({"assistant_id": "a", "on_completion": "archive"})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("if_not_exists", "create"),
        ("checkpoint_id", "1f0c"),
        ("checkpoint", {"checkpoint_id": "1f0c"}),
        ("command", {"resume": "yes"}),
    ],
)
def test_a3_what_a_new_thread_cannot_have_is_refused(field: str, value: Any) -> None:
    """A3: a run on a new thread has no checkpoint to start from and no interrupt to resume."""
    assert field in refused(StatelessRunCreate, {"assistant_id": "a", field: value})


def test_a1_batch_items_with_and_without_a_thread() -> None:
    """A1: a batch item with `thread_id` is a thread run (its `if_not_exists` applies);
    without one it is a run on a new temporary thread."""
    on_thread = BatchRunCreate.model_validate(
        {"assistant_id": "a", "thread_id": TID, "if_not_exists": "create"}
    ).to_request()
    assert on_thread.thread_id == TID and on_thread.create_thread
    assert on_thread.on_completion is None and not on_thread.stateless
    alone = BatchRunCreate.model_validate({"assistant_id": "a"}).to_request()
    assert alone.thread_id != TID and alone.create_thread
    assert alone.on_completion is OnCompletion.DELETE


def test_a3_a_bad_batch_item_is_named_by_its_index() -> None:
    """A3: the 422 of a batch names the item (`[i].field`), before anything is created."""
    good = {"assistant_id": "a"}
    with pytest.raises(ValidationFailed) as info:
        validate_items(BatchRunCreate, [good, good, {"assistant_id": "a", "stream_mode": 1}])
    assert info.value.field == "[2].stream_mode" and info.value.status == 422
    with pytest.raises(ValidationFailed) as info:
        validate_items(BatchRunCreate, [good, "x"])
    assert info.value.field == "[1]"
    with pytest.raises(ValidationFailed) as info:
        validate_items(
            BatchRunCreate, [good, {"assistant_id": "a", "on_completion": "keep", "thread_id": TID}]
        )
    assert info.value.field == "[1]" and "on_completion" in str(info.value)
    for body in ([], {"assistant_id": "a"}, None):
        with pytest.raises(ValidationFailed) as info:
            validate_items(BatchRunCreate, body)
        assert info.value.field == "body"
    assert len(validate_items(BatchRunCreate, [good, {**good, "thread_id": TID}])) == 2


# --- bulk cancel ---------------------------------------------------------------------------
def test_r5_cancel_filter_selects_inflight_statuses() -> None:
    """R5: `status` of POST /runs/cancel selects pending, running or both."""
    assert CancelFilter.PENDING.statuses == {RunStatus.PENDING}
    assert CancelFilter.RUNNING.statuses == {RunStatus.RUNNING}
    assert CancelFilter.ALL.statuses == INFLIGHT_STATUSES


def test_a3_bulk_cancel_takes_ids_on_a_thread_or_a_status() -> None:
    """A3: either thread_id with run_ids, or status alone (the official server's rule)."""
    rid = str(uuid.uuid4())
    by_ids = RunsCancel.model_validate({"thread_id": TID, "run_ids": [rid]})
    assert by_ids.status is None and [str(r) for r in by_ids.run_ids or []] == [rid]
    assert RunsCancel.model_validate({"status": "all"}).status is CancelFilter.ALL
    for bad in (
        {},
        {"thread_id": TID},
        {"run_ids": [rid]},
        {"status": "all", "thread_id": TID},
        {"status": "finished"},
        {"thread_id": TID, "run_ids": []},
        {"thread_id": TID, "run_ids": ["not-a-uuid"]},
    ):
        with pytest.raises(ValidationError):
            RunsCancel.model_validate(bad)


# --- the /wait answer ---------------------------------------------------------------------------
def test_a1_final_result_of_each_ending() -> None:
    """A1: values; `__error__` for a failed run; `__interrupt__` beside the values."""
    values = {"messages": [{"type": "ai", "content": "hi"}]}
    assert final_result(RunStatus.SUCCESS, None, values, []) == values
    assert final_result(RunStatus.INTERRUPTED, None, values, []) == values
    error = {"error": "ValueError", "message": "boom"}
    assert final_result(RunStatus.ERROR, error, values, []) == {"__error__": error}
    assert final_result(RunStatus.ERROR, None, None, []) == {"__error__": RUN_FAILED}
    pending = [{"value": "approve?", "id": "i1"}]
    assert final_result(RunStatus.SUCCESS, None, values, pending) == {
        **values,
        "__interrupt__": pending,
    }
    assert final_result(RunStatus.SUCCESS, None, [1], pending) == [1]
