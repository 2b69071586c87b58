"""L5: a run's `durability` (LangGraph's `sync` | `async` | `exit`) as admission decides it:
the request's, else the deprecated `checkpoint_during`'s, else the run's or its assistant's
`config.durability`, else LangGraph's `async`; recorded in the run's kwargs, never left in
the graph's config; a bad value is refused naming the field on every model that takes it."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from pydantic import ValidationError

from app.errors import validation_failed
from app.schemas import (
    AssistantCreate,
    BatchRunCreate,
    CronCreate,
    CronPayload,
    CronUpdate,
    RunCreate,
    StatelessRunCreate,
)
from shared.assistants.model import Assistant
from shared.vocab import DEFAULT_DURABILITY

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def assistant(config: dict[str, Any] | None = None) -> Assistant:
    return Assistant("a-1", "g", "mine", 1, NOW, NOW, owner="alice", config=config or {})


def admitted(body: dict[str, Any], on: Assistant) -> tuple[Any, dict[str, Any]]:
    """(recorded durability, the run's config) of `body` admitted on `on`."""
    request = RunCreate.model_validate({"assistant_id": "a-1", **body}).to_request("t")
    request = request.on_assistant(on)
    return request.kwargs["durability"], request.config


@pytest.mark.parametrize(
    ("body", "assistant_config", "want"),
    [
        ({}, {}, "async"),
        ({"durability": "exit"}, {}, "exit"),
        ({"checkpoint_during": False}, {}, "exit"),
        ({"checkpoint_during": True}, {"durability": "sync"}, "async"),
        ({"durability": "sync", "checkpoint_during": False}, {}, "sync"),
        ({}, {"durability": "exit"}, "exit"),  # the assistant's default
        ({"durability": "sync"}, {"durability": "exit"}, "sync"),  # the run's own wins
        ({"config": {"durability": "sync"}}, {"durability": "exit"}, "sync"),
    ],
)
def test_l5_durability_is_the_requests_else_the_assistants_else_async(
    body: dict[str, Any], assistant_config: dict[str, Any], want: str
) -> None:
    """L5: the order a run's durability is chosen in; the config keeps everything else."""
    durability, config = admitted(body, assistant({**assistant_config, "tags": ["x"]}))
    assert durability == want
    assert config["tags"] == ["x"] and "durability" not in config
    assert DEFAULT_DURABILITY == "async"  # LangGraph's own default


def test_l5_assistant_config_keeps_its_durability() -> None:
    """L5: an assistant's `config.durability` is stored with its config (its runs' default)."""
    spec = AssistantCreate.model_validate({"graph_id": "g", "config": {"durability": "exit"}})
    assert spec.to_spec().config == {"durability": "exit"}


def field_of(model: type, data: Any) -> str | None:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return validation_failed(info.value).field


@pytest.mark.parametrize(
    ("model", "data", "field"),
    [
        (RunCreate, {"assistant_id": "a", "durability": "later"}, "durability"),
        (RunCreate, {"assistant_id": "a", "durability": "SYNC"}, "durability"),
        (RunCreate, {"assistant_id": "a", "durability": True}, "durability"),
        (RunCreate, {"assistant_id": "a", "config": {"durability": "x"}}, "config.durability"),
        (StatelessRunCreate, {"assistant_id": "a", "durability": "x"}, "durability"),
        (BatchRunCreate, {"assistant_id": "a", "durability": "x"}, "durability"),
        (CronCreate, {"assistant_id": "a", "schedule": "0 * * * *", "durability": 1}, "durability"),
        (AssistantCreate, {"graph_id": "g", "config": {"durability": "x"}}, "config.durability"),
    ],
)
def test_l5_bad_durability_names_the_field(model: type, data: Any, field: str) -> None:
    """L5: a durability other than sync, async or exit is refused naming the field."""
    assert field_of(model, data) == field


def test_l5_cron_payload_carries_durability_and_a_patch_revalidates_it() -> None:
    """L5: a cron's payload keeps the mode each firing records; PATCH merges a new one
    and validates the whole payload again."""
    cron = CronCreate.model_validate(
        {"assistant_id": "a", "schedule": "0 * * * *", "durability": "exit"}
    )
    assert cron.payload()["durability"] == "exit"
    assert cron.to_cron_request(None).kwargs["durability"] == "exit"
    changes = CronUpdate.model_validate({"durability": "sync"}).payload_changes()
    merged = CronPayload.model_validate({**cron.payload(), **changes})
    assert merged.to_cron_request(None).kwargs["durability"] == "sync"
    bad = CronUpdate.model_validate({"durability": "never"}).payload_changes()
    assert field_of(CronPayload, {**cron.payload(), **bad}) == "durability"
