"""The vocabulary of crons: the `Cron` record, what creating and patching one takes, the
outcome of a firing, and the stored form of the run request each firing admits."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.errors import Conflict, NotFound, ThreadrunError
from shared.runs.model import RunRequest
from shared.vocab import JSONObject, OnCompletion

CRON_FIELDS = (
    "cron_id",
    "assistant_id",
    "thread_id",
    "on_run_completed",
    "end_time",
    "schedule",
    "timezone",
    "created_at",
    "updated_at",
    "payload",
    "user_id",
    "next_run_date",
    "metadata",
    "enabled",
)
"""The fields of the SDK's `Cron` (and of `CronSelectField`, less `now`)."""
CRON_SORT_COLUMNS = {
    "cron_id": "cron_id",
    "assistant_id": "assistant_id",
    "thread_id": "thread_id",
    "created_at": "created_at",
    "updated_at": "updated_at",
    "next_run_date": "next_run_at",
    "end_time": "end_time",
}
"""The SDK's `CronSortBy` -> column."""


class CronNotFound(NotFound):
    """The cron is missing or another user's (the two look the same)."""


class CronCannotFire(ThreadrunError):
    """A firing that no later tick could admit either: the owner has no credential left, or
    the cron's assistant is gone. The firing disables the cron (recorded `disabled`)."""


class TooManyCrons(Conflict):
    """The user already has `cron_max_per_user` crons (the API answers 429)."""

    code = "limit_exceeded"


class FiringOutcome(enum.StrEnum):
    """What one due tick of a cron came to (`cron_firings.outcome`, the audit)."""

    ADMITTED = "admitted"  # a run was created (and dispatched, or queued behind another)
    REJECTED = "rejected"  # multitask_strategy=reject on a busy thread: the tick is spent
    LIMITED = "limited"  # the owner was at a per-user run limit (A3, A4): the tick is spent
    DISABLED = "disabled"  # it cannot fire as it is (owner revoked, assistant gone): disabled
    FAILED = "failed"  # the run could not be admitted (assistant gone, …): the tick is spent


@dataclass(frozen=True, slots=True)
class Cron:
    """One `crons` row."""

    cron_id: str
    user_id: str
    assistant_id: str
    thread_id: str | None
    schedule: str
    timezone: str | None
    payload: JSONObject
    request: JSONObject
    metadata: JSONObject
    enabled: bool
    end_time: dt.datetime | None
    on_run_completed: OnCompletion | None
    next_run_at: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime
    thread_public_id: str | None = None  # its thread's id as the owner knows it (A4)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Cron:
        """The cron of a `crons` row (a dict row of psycopg)."""
        on_completed = row.get("on_run_completed")
        thread_id = row.get("thread_id")
        return cls(
            cron_id=str(row["cron_id"]),
            user_id=row["user_id"],
            assistant_id=row["assistant_id"],
            thread_id=None if thread_id is None else str(thread_id),
            schedule=row["schedule"],
            timezone=row.get("timezone"),
            payload=row.get("payload") or {},
            request=row.get("request") or {},
            metadata=row.get("metadata") or {},
            enabled=bool(row["enabled"]),
            end_time=row.get("end_time"),
            on_run_completed=OnCompletion(on_completed) if on_completed else None,
            next_run_at=row.get("next_run_at"),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            thread_public_id=None
            if row.get("thread_public_id") is None
            else str(row["thread_public_id"]),
        )

    def as_json(self) -> JSONObject:
        """The SDK's `Cron` object."""
        return {
            "cron_id": self.cron_id,
            "assistant_id": self.assistant_id,
            "thread_id": self.thread_public_id or self.thread_id,
            "on_run_completed": self.on_run_completed,
            "end_time": self.end_time,
            "schedule": self.schedule,
            "timezone": self.timezone,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "payload": self.payload,
            "user_id": self.user_id,
            "next_run_date": self.next_run_at,
            "metadata": self.metadata,
            "enabled": self.enabled,
        }

    def run_request(self, thread_id: str) -> RunRequest:
        """The run one firing admits: the stored request on `thread_id` (the cron's thread,
        or a new temporary one), its metadata naming this cron as the official server does."""
        request = request_from_json(self.request)
        metadata = {**request.metadata, "cron_id": self.cron_id}
        return dataclasses.replace(request, thread_id=thread_id, metadata=metadata)


@dataclass(frozen=True, slots=True)
class CronSpec:
    """A validated cron to create (the API builds it from the SDK's body)."""

    assistant_id: str
    schedule: str
    request: RunRequest  # the payload through RunCreate.to_request (thread_id a placeholder)
    payload: JSONObject  # the payload as the client gave it (shown back)
    thread_id: str | None = None
    timezone: str | None = None
    metadata: JSONObject = field(default_factory=dict)
    enabled: bool = True
    end_time: dt.datetime | None = None
    on_run_completed: OnCompletion | None = None  # set only for a cron without a thread


@dataclass(frozen=True, slots=True)
class CronPatch:
    """What `PATCH /runs/crons/{id}` changes; None (or absent from `given`) keeps a field."""

    given: frozenset[str]  # the fields the client sent (end_time may be sent as null)
    schedule: str | None = None
    timezone: str | None = None
    end_time: dt.datetime | None = None
    enabled: bool | None = None
    on_run_completed: OnCompletion | None = None
    payload: JSONObject | None = None  # the whole new payload (old one with the changes)
    request: RunRequest | None = None
    metadata: JSONObject | None = None

    @property
    def reschedules(self) -> bool:
        """Whether `next_run_at` must be computed again from now."""
        return bool({"schedule", "timezone", "end_time", "enabled"} & self.given)


# --- the stored RunRequest ---------------------------------------------------------------------
def request_to_json(request: RunRequest) -> JSONObject:
    """Every field of the request, as JSON: a field added to RunRequest later (a webhook) is
    stored and restored with no change here."""
    return {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}


def _enum_of(hint: Any) -> type[enum.Enum] | None:
    """The Enum class of a field type `E` or `E | None`, else None."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            if isinstance(arg, type) and issubclass(arg, enum.Enum):
                return arg
    return None


def request_from_json(data: Mapping[str, Any]) -> RunRequest:
    """The request `request_to_json` stored (enum fields back to their enums; keys that
    RunRequest no longer has are dropped)."""
    hints = typing.get_type_hints(RunRequest)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(RunRequest):
        if f.name not in data:
            continue
        value = data[f.name]
        kind = _enum_of(hints.get(f.name))
        values[f.name] = kind(value) if kind is not None and value is not None else value
    return RunRequest(**values)
