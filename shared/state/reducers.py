"""The reducers of `ThreadState`'s channels (SPEC §6, S2): pure merge functions, no IO.

LangGraph folds every write to a channel into its value with the channel's reducer,
`value = reducer(value, update)`, one write at a time. The writes of one super-step
(two parallel nodes, two tool calls of one model turn) are applied in a deterministic
task order, so a replay merges them the same way; a reducer documented as
*order-insensitive* also gives the same value whichever of two concurrent writes
comes first, so no node's write depends on which node LangGraph happened to sort first.

Rules shared by every reducer here:

- An update of `None` means "no change".
- A malformed update raises `InvalidStateUpdate` (422 through the API, naming the
  channel); a second, different sandbox id raises `SandboxConflict` (409). Both fail
  closed (G3): none of the step's writes are applied. In a run, the writes of the
  step's finished tasks stay pending on the head checkpoint, so reading that
  checkpoint (`get_state`) or resuming it raises the same error again; a run with new
  input starts from the last good values.
- To *replace* a value whatever the reducer says (a rollback, a compaction, an operator
  fixing a thread), write `langgraph.types.Overwrite(value)`: LangGraph stores it
  without calling the reducer (at most one Overwrite per channel per super-step).
- A channel whose empty value is not a container (sandbox, promoted and the scalars)
  stores its very first write as is; LangGraph calls the reducer only from the second
  write on. List and dict channels start empty, so every write goes through the reducer.

`messages` is not here: it keeps LangGraph's `add_messages`, which `ThreadState` inherits
from LangChain's `AgentState` unchanged (re-exported below with REMOVE_ALL_MESSAGES).
Invariant: a message with a known id replaces the old one in place, a new id is
appended, `RemoveMessage(id)` deletes a known id (an unknown id raises ValueError),
and `RemoveMessage(REMOVE_ALL_MESSAGES)` drops everything before it in the state and
in the update — the compaction commit of C2 is
`[RemoveMessage(REMOVE_ALL_MESSAGES), *preserved]`. What follows REMOVE_ALL in an update
is stored as it is, not merged by id, so send each id once there. A removed id comes
back only if a later write sends a message with that id again. Not order-insensitive.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages

from shared.errors import Conflict, ValidationFailed

if TYPE_CHECKING:
    from shared.state.thread_state import (
        BackgroundTask,
        Delegation,
        PromotedTools,
        SandboxState,
        Todo,
        UploadedFile,
        ViewedImage,
    )

__all__ = [
    "ACTIVE_STATUSES",
    "REMOVE_ALL_MESSAGES",
    "TERMINAL_STATUSES",
    "InvalidStateUpdate",
    "SandboxConflict",
    "add_messages",
    "keep_last",
    "merge_artifacts",
    "merge_background_tasks",
    "merge_delegations",
    "merge_promoted",
    "merge_sandbox",
    "merge_todos",
    "merge_uploaded_files",
    "merge_viewed_images",
]

T = TypeVar("T")
R = TypeVar("R", bound=Mapping[str, Any])

TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})
"""Statuses a delegation or background task never leaves."""
ACTIVE_STATUSES = frozenset({"pending", "running"})
"""Statuses a delegation or background task may still leave."""


class SandboxConflict(Conflict):
    """A second, different sandbox id for one thread (S2, G3): refused, never one picked."""

    code = "sandbox_conflict"

    def __init__(self, existing_id: object, new_id: object) -> None:
        super().__init__(existing_id, new_id)
        self.existing_id = existing_id
        self.new_id = new_id

    def __str__(self) -> str:
        return (
            f"sandbox conflict: this thread is bound to sandbox {self.existing_id!r}, "
            f"refusing a write of sandbox {self.new_id!r}"
        )


class InvalidStateUpdate(ValidationFailed):
    """A state update whose shape its channel's reducer refuses; `field` names the channel."""

    code = "invalid_state_update"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message, field=field)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.field))


# --- scalars --------------------------------------------------------------------------


def keep_last(existing: T | None, new: T | None) -> T | None:
    """Last write wins; `None` is no change (title, goal, summary_text, thread_data, skill_context).

    Idempotent. Not order-insensitive: of two concurrent writes, the later in task order
    wins. To clear a text field write "" (an empty string is a value, not "no change").
    """
    return existing if new is None else new


# --- sandbox --------------------------------------------------------------------------


def merge_sandbox(existing: SandboxState | None, new: SandboxState | None) -> SandboxState | None:
    """One sandbox per thread: the same `sandbox_id` again is a no-op, another id raises.

    Several lazy tools may acquire the sandbox in one step and all write its id; they
    merge to one value. Two different ids mean two execution environments claim one
    thread's files, so the write raises `SandboxConflict` instead of picking one (G3).
    Order-insensitive and idempotent: both orders give the same value or both raise.
    """
    if new is None:
        return existing
    new_id = _sandbox_id(new)
    if existing is None:
        return new
    existing_id = existing.get("sandbox_id") if isinstance(existing, Mapping) else None
    if existing_id != new_id:
        raise SandboxConflict(existing_id, new_id)
    return existing


def _sandbox_id(value: object) -> str:
    sandbox_id = value.get("sandbox_id") if isinstance(value, Mapping) else None
    if not isinstance(sandbox_id, str) or not sandbox_id:
        raise InvalidStateUpdate(
            f'sandbox must be {{"sandbox_id": <non-empty string>}}, got {value!r}',
            field="sandbox",
        )
    return sandbox_id


# --- append-only ledgers: artifacts, promoted ------------------------------------------


def merge_artifacts(existing: list[str] | None, new: Sequence[str] | None) -> list[str]:
    """Artifact paths in order of first appearance, each once; nothing is ever dropped.

    An update lists workspace-relative paths (`outputs/report.md`) to add; an empty list
    adds nothing (artifacts are a ledger the delivery receipt relies on, J5 — replace it
    only with an Overwrite). Idempotent and associative; order-insensitive as a set: two
    concurrent writes give the same paths in either order (listed in task order).
    """
    paths = _str_items(new, "artifacts", "a list of artifact paths")
    return _dedupe([*(existing or ()), *paths])


def merge_promoted(
    existing: PromotedTools | None, new: PromotedTools | None
) -> PromotedTools | None:
    """Promoted tools of one tool catalog: a new catalog hash replaces the value wholesale.

    Value: `{"catalog_hash": str, "items": [tool name, ...]}`. Names promoted from a
    catalog are valid only against that catalog, so an update with another hash drops
    the old items entirely. With the same hash the items are unioned (order of first
    appearance, each once): promotion only grows within one catalog. Idempotent; with
    one hash, order-insensitive as a set. Two concurrent writes with different hashes:
    the later in task order wins (the next step rewrites against the live catalog).
    """
    if new is None:
        return existing
    catalog_hash = new.get("catalog_hash") if isinstance(new, Mapping) else None
    if not isinstance(catalog_hash, str) or not catalog_hash:
        raise InvalidStateUpdate(
            f'promoted must be {{"catalog_hash": <non-empty string>, "items": [...]}}, got {new!r}',
            field="promoted",
        )
    items = _str_items(new.get("items"), "promoted", "a list of tool names under 'items'")
    if existing is None or existing.get("catalog_hash") != catalog_hash:
        return {"catalog_hash": catalog_hash, "items": _dedupe(items)}
    return {"catalog_hash": catalog_hash, "items": _dedupe([*existing.get("items", ()), *items])}


# --- current views: todos, uploaded_files, viewed_images --------------------------------


def merge_todos(existing: list[Todo] | None, new: Sequence[Todo] | None) -> list[Todo]:
    """The todo list, replaced wholesale; `[]` is an explicit clear, `None` no change.

    The writer (a `write_todos` tool) always sends the whole current list. Idempotent.
    Not order-insensitive: of two concurrent lists, the later in task order wins, so
    only one node should write todos per step (LangChain's todo prompt says the same).
    """
    if new is None:
        return list(existing or ())
    return _records(new, "todos", key=None)


def merge_uploaded_files(
    existing: list[UploadedFile] | None, new: Sequence[UploadedFile] | None
) -> list[UploadedFile]:
    """Uploaded files keyed by `path`, in order of first upload; `[]` clears.

    A record for a known path replaces the old record in place (a re-upload updates
    size/type); a new path is appended. Idempotent; order-insensitive as a set of paths
    (if two concurrent writes describe the same path, the later in task order wins).
    """
    return _merge_keyed(existing, new, "uploaded_files")


def merge_viewed_images(
    existing: list[ViewedImage] | None, new: Sequence[ViewedImage] | None
) -> list[ViewedImage]:
    """Images the model has been shown, keyed by `path`, in order of first view; `[]` clears.

    Same rule as `merge_uploaded_files`. The clear exists so that whoever injects the
    images into a model call can empty the list once they have been shown.
    """
    return _merge_keyed(existing, new, "viewed_images")


# --- status ledgers: delegations, background_tasks -------------------------------------


def merge_delegations(
    existing: dict[str, Delegation] | None, new: Mapping[str, Delegation] | None
) -> dict[str, Delegation]:
    """Delegations keyed by id; a terminal record is never reverted to a non-terminal one.

    A record is `{"status": ..., "version": int, ...}` and replaces the previous record
    of its id wholesale when it is *newer*: records are ordered by (terminal?, version),
    so a terminal status (completed/failed/cancelled) outranks any non-terminal one
    whatever its version, and among records of the same kind the higher `version`
    (monotonic per id, set by the writer; missing = 0) wins. Equal rank with different
    content is a writer bug; it is settled by comparing the records' canonical JSON, so
    that the outcome still does not depend on order. The merge is a join: idempotent,
    associative and order-insensitive; ids are never removed.
    """
    return _merge_ledger(existing, new, "delegations")


def merge_background_tasks(
    existing: dict[str, BackgroundTask] | None, new: Mapping[str, BackgroundTask] | None
) -> dict[str, BackgroundTask]:
    """Background tasks keyed by task id, with exactly the rule of `merge_delegations`."""
    return _merge_ledger(existing, new, "background_tasks")


# --- helpers ---------------------------------------------------------------------------


def _dedupe(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _str_items(value: object, field: str, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise InvalidStateUpdate(f"{field} update must be {what}, got {value!r}", field=field)
    for item in value:
        if not isinstance(item, str) or not item:
            raise InvalidStateUpdate(
                f"{field} update must be {what}; {item!r} is not a non-empty string",
                field=field,
            )
    return list(value)


def _records(value: object, field: str, key: str | None) -> list[Any]:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise InvalidStateUpdate(
            f"{field} update must be a list of objects, got {value!r}", field=field
        )
    for record in value:
        if not isinstance(record, Mapping):
            raise InvalidStateUpdate(
                f"{field} update must be a list of objects; {record!r} is not one", field=field
            )
        if key is not None and (not isinstance(record.get(key), str) or not record[key]):
            raise InvalidStateUpdate(
                f"{field} records need a non-empty string {key!r}; got {record!r}", field=field
            )
    return list(value)


def _merge_keyed(existing: list[R] | None, new: Sequence[R] | None, field: str) -> list[R]:
    if new is None:
        return list(existing or ())
    records: list[R] = _records(new, field, key="path")
    if not records:
        return []
    merged = list(existing or ())
    at = {record["path"]: i for i, record in enumerate(merged)}
    for record in records:
        i = at.get(record["path"])
        if i is None:
            at[record["path"]] = len(merged)
            merged.append(record)
        else:
            merged[i] = record
    return merged


def _rank(record: Mapping[str, Any], field: str, key: str) -> tuple[bool, int]:
    status = record.get("status")
    if status not in TERMINAL_STATUSES and status not in ACTIVE_STATUSES:
        raise InvalidStateUpdate(
            f"{field}[{key!r}].status must be one of "
            f"{sorted(ACTIVE_STATUSES | TERMINAL_STATUSES)}, got {status!r}",
            field=field,
        )
    version = record.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InvalidStateUpdate(
            f"{field}[{key!r}].version must be a non-negative integer, got {version!r}",
            field=field,
        )
    return status in TERMINAL_STATUSES, version


def _canonical(record: Mapping[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, default=repr, separators=(",", ":"))


def _newer(candidate: Mapping[str, Any], current: Mapping[str, Any], field: str, key: str) -> bool:
    a, b = _rank(candidate, field, key), _rank(current, field, key)
    if a != b:
        return a > b
    return _canonical(candidate) > _canonical(current)


def _merge_ledger(
    existing: Mapping[str, R] | None, new: Mapping[str, R] | None, field: str
) -> dict[str, R]:
    merged = dict(existing or {})
    if new is None:
        return merged
    if not isinstance(new, Mapping):
        raise InvalidStateUpdate(
            f"{field} update must be an object keyed by id, got {new!r}", field=field
        )
    for key, record in new.items():
        if not isinstance(key, str) or not key:
            raise InvalidStateUpdate(f"{field} ids must be non-empty strings, got {key!r}", field)
        if not isinstance(record, Mapping):
            raise InvalidStateUpdate(f"{field}[{key!r}] must be an object, got {record!r}", field)
        current = merged.get(key)
        if current is None:
            _rank(record, field, key)
            merged[key] = record
        elif _newer(record, current, field, key):
            merged[key] = record
    return merged
