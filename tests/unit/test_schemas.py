"""A1/A3: request validation names the field; SDK fields we lack are refused, unknown ones
ignored as the official server ignores them."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from app.errors import validation_failed
from app.schemas import CancelQuery, RunCreate, ThreadCreate, ThreadPrune, ThreadSearch
from shared.runs.model import PruneStrategy


def field_of(model: type, data: dict) -> str | None:  # type: ignore[type-arg]
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return validation_failed(info.value).field


def test_a1_sdk_stream_payload_is_accepted() -> None:
    """A1: what langgraph-sdk's runs.stream sends by default validates."""
    body = RunCreate.model_validate(
        {
            "input": {"messages": []},
            "stream_mode": ["messages-tuple", "values"],
            "stream_subgraphs": False,
            "stream_resumable": False,
            "assistant_id": "lead_agent",
            "on_disconnect": "continue",
            "config": {"configurable": {"tokens": 3}},
        }
    )
    assert body.stream_mode == ["messages-tuple", "values"]
    assert body.config is not None and body.config.configurable == {"tokens": 3}


def test_a3_unknown_fields_are_ignored_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A3: a field no model knows is ignored, as the official server ignores it (a debug line
    names it), in a body, a nested object and a query; a known field's bad value is a 422."""
    with caplog.at_level(logging.DEBUG, logger="app.schemas"):
        body = RunCreate.model_validate(
            {"assistant_id": "a", "inptu": {}, "config": {"tags": ["t"], "callbacks": None}}
        )
        search = ThreadSearch.model_validate({"order_by": "created_at", "sort_order": "asc"})
    assert body.input is None and body.config is not None and body.config.tags == ["t"]
    assert search.sort_order == "asc"
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "inptu" in logged and "callbacks" in logged and "order_by" in logged
    assert (
        field_of(RunCreate, {"assistant_id": "a", "inptu": {}, "stream_mode": 3}) == "stream_mode"
    )


@pytest.mark.parametrize("key", ["feedback_keys", "strict_resume"])
def test_a1_unimplemented_sdk_fields_are_refused(key: str) -> None:
    """A1: SDK fields we do not implement are refused with their name, never silently ignored."""
    with pytest.raises(ValidationError) as info:
        RunCreate.model_validate({"assistant_id": "a", key: "x"})
    assert key in str(info.value)


@pytest.mark.parametrize("value", [-1, "soon", float("nan")])
def test_a3_after_seconds_must_be_a_delay(value: object) -> None:
    """A3: `after_seconds` is a non-negative number of seconds, else a 422 naming it."""
    assert field_of(RunCreate, {"assistant_id": "a", "after_seconds": value}) == "after_seconds"


def test_a1_after_seconds_reaches_the_request() -> None:
    """A1: a delayed run's request carries its delay; no delay is 0."""
    body = RunCreate.model_validate({"assistant_id": "a", "after_seconds": 2.5})
    assert body.to_request("t").after_seconds == 2.5
    assert RunCreate.model_validate({"assistant_id": "a"}).to_request("t").after_seconds == 0


def test_a3_bad_stream_mode_and_strategy() -> None:
    """A3: invalid enum values name their field."""
    assert field_of(RunCreate, {"assistant_id": "a", "stream_mode": ["nope"]}) == "stream_mode"
    assert (
        field_of(RunCreate, {"assistant_id": "a", "multitask_strategy": "x"})
        == "multitask_strategy"
    )
    assert field_of(RunCreate, {"assistant_id": "a", "on_disconnect": "x"}) == "on_disconnect"


def test_a3_missing_assistant() -> None:
    """A3: assistant_id is required."""
    assert field_of(RunCreate, {"input": {}}) == "assistant_id"


def test_checkpoint_during_maps_to_durability() -> None:
    """The deprecated checkpoint_during maps onto durability."""
    assert (
        RunCreate.model_validate(
            {"assistant_id": "a", "checkpoint_during": False}
        ).effective_durability()
        == "exit"
    )
    assert (
        RunCreate.model_validate({"assistant_id": "a", "durability": "sync"}).effective_durability()
        == "sync"
    )


def test_thread_create_validates_uuid() -> None:
    """A thread id must be a UUID."""
    assert field_of(ThreadCreate, {"thread_id": "not-a-uuid"}) == "thread_id"


def test_cancel_query_parses_sdk_flags() -> None:
    """The SDK sends wait=0/1."""
    assert CancelQuery.model_validate({"wait": "1", "action": "interrupt"}).wait is True
    assert CancelQuery.model_validate({"wait": "0"}).wait is False


def test_a1_sdk_prune_payloads_validate_and_bad_ones_name_the_field() -> None:
    """A1/A3: what `threads.prune` sends validates (strategy defaults to delete); a bad
    strategy, a missing or oversized id list, or a bad id is a 422 naming the field."""
    tid = "3c90c3cc-0d44-4b50-8888-8dd25736052a"
    assert ThreadPrune.model_validate({"thread_ids": [tid]}).strategy is PruneStrategy.DELETE
    keep = ThreadPrune.model_validate({"thread_ids": [tid], "strategy": "keep_latest"})
    assert keep.strategy is PruneStrategy.KEEP_LATEST
    assert field_of(ThreadPrune, {"thread_ids": [tid], "strategy": "all"}) == "strategy"
    assert field_of(ThreadPrune, {}) == "thread_ids"
    assert field_of(ThreadPrune, {"thread_ids": ["nope"]}) == "thread_ids.0"
    assert field_of(ThreadPrune, {"thread_ids": [tid] * 1001}) == "thread_ids"


def test_a1_search_select_takes_the_sdk_thread_fields() -> None:
    """A1/A3: `select` takes thread object fields; others are named."""
    assert ThreadSearch.model_validate({"select": ["thread_id", "values"]}).select == [
        "thread_id",
        "values",
    ]
    assert field_of(ThreadSearch, {"select": ["thread_id", "owner"]}) == "select.1"
    assert field_of(ThreadSearch, {"select": []}) == "select"


def test_a3_search_query_is_text_bounded_and_named_when_bad() -> None:
    """A3: POST /threads/search `query` (a threadrun extension) is stripped text of at most
    200 characters; blank, over-long, control characters or not a string name `query`."""
    assert ThreadSearch.model_validate({"query": "  Budget "}).query == "Budget"
    assert ThreadSearch.model_validate({}).query is None
    assert ThreadSearch.model_validate({"query": "x" * 200}).query == "x" * 200
    for bad in ("", "   ", "x" * 201, "a\x00b", "tab\there", 5, ["a"]):
        assert field_of(ThreadSearch, {"query": bad}) == "query", bad
