"""Admitting runs at the web edge: the one path every HTTP view and the WebSocket take.

    sizes (raw request) -> the project's `threads.create_run` -> runs per minute
        -> an active-run slot -> RunManager.admit -> bind

An invalid request uses no rate and no slot (its model validated it first); a refused or
failed admission frees its slot; an admitted run holds its slot until it ends (the
worker's finalize, a cancel of a pending run or the reaper take it out of the set). The
counters are app/limits.py's; the durable admission is shared/runs/manager.py's. An HTTP
view that admits runs declares `@run_sized` (or `@batch_sized`) so that the sizes are
checked on the body as sent.

Under the project's auth (shared/authz/) the run's `configurable` carries the caller as
the LangGraph Agent Server passes it (`langgraph_auth_user`, `langgraph_auth_user_id`,
`langgraph_auth_permissions`), whatever the client sent under those names; the request
headers `http.configurable_headers` admits are copied there too. The limits count per
identity (`Principal.subject`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from flask import request

from app import authz
from app.auth import principal
from app.errors import LimitExceeded
from app.limits import check_run_sizes, limiter
from app.services import current_project, current_services
from shared.errors import AssistantNotFound, ThreadNotFound
from shared.runs.limits import RunSlot
from shared.runs.model import Run, RunRequest
from shared.runs.priority import run_priority

AUTH_KEYS = ("langgraph_auth_user", "langgraph_auth_user_id", "langgraph_auth_permissions")
"""What only the server may put in a run's `configurable`."""


def admit_run(owner: str, wanted: RunRequest, raw: dict[str, Any] | None = None) -> Run:
    """Admit one run of `owner` under the per-user limits; 429/422 `LimitExceeded` when
    over one. `raw`: the request as sent, when its sizes were not checked yet (a WebSocket
    frame; an HTTP view's `@run_sized` checks them before validation)."""
    lim = limiter()
    if raw is not None:
        check_run_sizes(raw, lim.settings)
    wanted = prepared(owner, wanted)
    subject = principal().subject
    lim.check_run_rate(subject)
    slot = lim.reserve_run(subject)
    priority = _priority(slot)
    return _bound([slot], lambda: [current_services().runs.admit(owner, wanted, priority)])[0]


def admit_batch(owner: str, wanted: Sequence[RunRequest]) -> list[Run]:
    """Admit a batch of `owner`'s runs, all or none: the rate for all of them at once, one
    active-run slot per run (a batch larger than `max_active_runs` can never fit: 422)."""
    lim = limiter()
    if lim.throttled() and len(wanted) > lim.settings.max_active_runs:
        raise LimitExceeded(
            "max_active_runs",
            f"a batch of {len(wanted)} runs: at most {lim.settings.max_active_runs}"
            " pending or running runs per user",
            status=422,
            field="body",
        )
    wanted = [prepared(owner, w) for w in wanted]
    subject = principal().subject
    lim.check_run_rate(subject, len(wanted))
    slots: list[RunSlot] = []
    try:
        for _ in wanted:
            slots.append(lim.reserve_run(subject))
    except LimitExceeded:
        for slot in slots:
            slot.release()
        raise
    priorities = [_priority(slot) for slot in slots]
    return _bound(
        slots, lambda: current_services().runs.admit_batch(owner, list(wanted), priorities)
    )


def _priority(slot: RunSlot) -> int:
    """The queue priority of a run a caller asked for: the foreground, by how many runs the
    caller already had pending or running (fair dispatch, shared/runs/priority.py)."""
    step = limiter().settings.dispatch_position_step
    return run_priority(slot.position, background=False, step=step)


def prepared(owner: str, wanted: RunRequest) -> RunRequest:
    """The request as it is admitted: `threads.create_run` decided on it (the handler may
    edit its metadata; an existing thread must pass its filter), the caller and the
    admitted request headers in its `configurable`."""
    wanted = with_caller(wanted)
    if principal().auth_user is None:
        return wanted
    return dataclasses.replace(wanted, metadata=_create_run_decided(owner, wanted))


def with_caller(wanted: RunRequest) -> RunRequest:
    """`wanted` with the caller (under the project's auth) and the request headers
    `http.configurable_headers` admits in its `configurable` (also a cron's stored
    request, so that each firing runs as the user who made the cron)."""
    configurable = {
        k: v for k, v in (wanted.config.get("configurable") or {}).items() if k not in AUTH_KEYS
    }
    rules = current_project().http.configurable_headers
    if rules is not None:
        configurable.update(rules.pick(request.headers.items()))
    who = principal()
    if who.auth_user is not None:
        configurable["langgraph_auth_user"] = who.auth_user.dict()
        configurable["langgraph_auth_user_id"] = who.auth_user.identity
        configurable["langgraph_auth_permissions"] = who.auth_user.permissions
    config = dict(wanted.config)
    if configurable or "configurable" in config:
        config["configurable"] = configurable
    return dataclasses.replace(wanted, config=config)


def _create_run_decided(owner: str, wanted: RunRequest) -> dict[str, Any]:
    """`threads.create_run` on the request; the run's metadata as the handler left it."""
    value: dict[str, Any] = {
        "thread_id": None if wanted.stateless else wanted.public_thread_id or wanted.thread_id,
        "assistant_id": wanted.assistant_id,
        "run_id": None,
        "status": "pending",
        "metadata": dict(wanted.metadata),
        "prevent_insert_if_inflight": True,
        "multitask_strategy": wanted.multitask_strategy.value
        if wanted.multitask_strategy is not None
        else None,
        "if_not_exists": "create" if wanted.create_thread else "reject",
        "after_seconds": wanted.after_seconds,
        "kwargs": {
            "input": wanted.input,
            "command": wanted.command,
            "config": wanted.config,
            "context": wanted.context,
            **wanted.kwargs,
        },
    }
    decision = authz.authorize("threads", "create_run", value)
    _check_assistant(owner, wanted.assistant_id)
    if decision is not None and decision.containment is not None and not wanted.stateless:
        try:
            thread = current_services().store.get_thread(wanted.thread_id, owner)
        except ThreadNotFound:
            thread = None  # made by this run (if_not_exists=create), or a 404 from admit
        if thread is not None:
            authz.require_visible(
                decision,
                thread.metadata,
                ThreadNotFound(f"thread {value['thread_id']} not found"),
            )
    metadata = value.get("metadata")
    return dict(metadata) if isinstance(metadata, dict) else {}


def _check_assistant(owner: str, assistant_id: str) -> None:
    """As the official server does on run creation: a run on an assistant that is not a
    graph's system assistant needs `assistants.read` on it (its filter hides it: 404)."""
    try:
        assistant = current_services().assistants.get(owner, assistant_id)
    except AssistantNotFound:
        return  # RunManager.admit answers the 404 itself
    if assistant.system:
        return
    decision = authz.authorize("assistants", "read", {"assistant_id": assistant.assistant_id})
    authz.require_visible(
        decision, assistant.metadata, AssistantNotFound(f"assistant {assistant_id} not found")
    )


def _bound(slots: list[RunSlot], admit: Callable[[], list[Run]]) -> list[Run]:
    """Run `admit`; bind each slot to its run, or free them all when it fails."""
    try:
        runs = admit()
    except BaseException:
        for slot in slots:
            slot.release()
        raise
    for slot, run in zip(slots, runs, strict=True):
        slot.bind(run.run_id)
    return runs
