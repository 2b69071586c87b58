"""A2A tasks over runs: admit a message as a run, find a task, read its view, cancel it.

The same calls the REST API makes, in the same order: the thread id through
`public_ids.resolve` (A4 and `threads.read`), the run through `app/admission.py`
(`threads.create_run`, the per-user rate and active-run limits), reads through the run store
with the caller as owner (another user's task is not found), cancels through
`RunManager.cancel` (R5). Nothing is kept in the web process: a task is found again from
its id (context and first run) and the runs of its thread, so any web process answers.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from app import authz, public_ids
from app.admission import admit_run
from app.auth import principal
from app.http import validate
from app.ids import checked_run_id
from app.protocols.a2a import mapping
from app.protocols.a2a.mapping import TaskView
from app.protocols.a2a.wire import Code, RpcError, SendParams
from app.schemas import RunCreate
from app.services import current_services
from shared.assistants.model import Assistant
from shared.errors import NotFound, ValidationFailed
from shared.runs.admission import CancelOutcome
from shared.runs.model import CancelAction, Run, Thread, ThreadStatus

STREAM_MODES = ["messages-tuple"]
"""What an A2A run streams: the AI text chunks become artifact updates; the outcome is
read from the thread once the run ends."""


def agent(id_or_graph: str) -> Assistant:
    """The assistant an A2A URL names (an id or a graph id), as a run on it would see it
    (a non-system one needs `assistants.read`); INVALID_PARAMS naming it otherwise."""
    svc = current_services()
    try:
        found = svc.assistants.resolve(principal().user_id, id_or_graph)
        if not found.system:
            decision = authz.authorize("assistants", "read", {"assistant_id": found.assistant_id})
            authz.require_visible(decision, found.metadata, NotFound("hidden"))
    except (NotFound, ValidationFailed) as exc:
        raise RpcError(
            Code.INVALID_PARAMS, f"assistant {id_or_graph[:256]} not found", field="assistant_id"
        ) from exc
    return found


@dataclass(frozen=True, slots=True)
class Found:
    """A task as stored: its first run, its latest, and the newest runs of its thread."""

    task_id: str
    context_id: str  # the thread's public id
    thread: Thread
    first: Run
    latest: Run
    newest: Run  # the thread's newest run (only it can leave the thread interrupted)


def not_found(task_id: str) -> RpcError:
    """The error of a task the caller has not."""
    return RpcError(Code.TASK_NOT_FOUND, f"task {task_id[:600]} not found", field="id")


def find(task_id: str, assistant: Assistant) -> Found:
    """The caller's task `task_id` on `assistant`; TASK_NOT_FOUND otherwise (also for
    another user's task, or one of another assistant)."""
    parsed = mapping.parse_task_id(task_id)
    if parsed is None:
        raise not_found(task_id)
    context_id, run_id = parsed
    svc, owner = current_services(), principal().user_id
    try:
        tid = public_ids.resolve(context_id)
        first = svc.store.get_run(tid, checked_run_id(run_id), owner)
        thread = svc.store.get_thread(tid, owner)
        runs = svc.store.list_runs(
            tid, owner, limit=svc.settings.a2a_task_scan_runs, offset=0, status=None
        )
    except NotFound as exc:
        raise not_found(task_id) from exc
    if first.assistant_id != assistant.assistant_id:
        raise not_found(task_id)
    latest = next((r for r in runs if task_of(r) == task_id), first)
    if latest.created_at < first.created_at:
        latest = first
    return Found(
        task_id, public_ids.public_of(tid), thread, first, latest, runs[0] if runs else first
    )


def task_of(run: Run) -> str | None:
    """The task a run resumed (its metadata), if it did."""
    meta = run.metadata.get("a2a")
    value = meta.get("task_id") if isinstance(meta, dict) else None
    return value if isinstance(value, str) else None


def view(found: Found, *, history: bool = True) -> TaskView:
    """What the task shows now: state, artifact, status message and history."""
    latest = found.latest
    is_newest = found.newest.run_id == latest.run_id
    interrupted = is_newest and found.thread.status is ThreadStatus.INTERRUPTED
    state = mapping.task_state(latest.status, interrupted=interrupted)
    artifact: dict[str, Any] | None = None
    message: dict[str, Any] | None = None
    ids = {"context_id": found.context_id, "task_id": found.task_id}
    if is_newest and state in (mapping.COMPLETED, mapping.INPUT_REQUIRED):
        values = current_services().state.get(latest.thread_id, latest.graph_id)
        if state == mapping.COMPLETED:
            artifact = mapping.response_artifact(values["values"])
        else:
            parts = mapping.interrupt_parts(values["interrupts"])
            message = mapping.agent_message(parts, message_id=f"{latest.run_id}:input", **ids)
    elif state == mapping.FAILED:
        text = str((latest.error or {}).get("message") or f"run {latest.status.value}")
        message = mapping.agent_message(
            [{"text": text}], message_id=f"{latest.run_id}:error", **ids
        )
    turns = _history(found, artifact) if history else []
    meta = {"threadrun": {"runId": latest.run_id, "runStatus": latest.status.value}}
    return TaskView(
        found.task_id, found.context_id, state, latest.updated_at, artifact, message, turns, meta
    )


def _history(found: Found, artifact: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The user's messages of the task's runs (oldest first), then the agent's answer."""
    ids = {"context_id": found.context_id, "task_id": found.task_id}
    runs = [found.first]
    if found.latest.run_id != found.first.run_id:
        runs.append(found.latest)
    out = [m for r in runs if (m := mapping.user_message(r.input, r.command, **ids)) is not None]
    if artifact is not None:
        message_id = f"{artifact['artifactId']}:answer"
        out.append(mapping.agent_message(artifact["parts"], message_id=message_id, **ids))
    return out


@dataclass(frozen=True, slots=True)
class Admitted:
    """A message admitted as a run: the run, and the task it serves."""

    run: Run
    task_id: str
    context_id: str


def send(params: SendParams, assistant: Assistant) -> Admitted:
    """Admit the message as a run: a new task (on its context's thread, made when needed),
    or the resume of the task it names when that task waits for input."""
    message = params.message
    if message.role != "user":
        raise RpcError(Code.INVALID_PARAMS, "message.role must be user", field="message.role")
    command: dict[str, Any] | None = None
    task_id: str | None = None
    context_id = message.context_id
    if message.task_id is not None:
        found = find(message.task_id, assistant)
        if context_id is not None and context_id != found.context_id:
            raise RpcError(
                Code.INVALID_PARAMS,
                f"message.contextId {context_id} is not the context of task {found.task_id}",
                field="message.contextId",
            )
        state = view(found, history=False).state
        if state != mapping.INPUT_REQUIRED:
            raise RpcError(
                Code.UNSUPPORTED_OPERATION,
                f"task {found.task_id} is {mapping.state_name(state)}: only a task that"
                " requires input takes another message (send without taskId to continue"
                " the context)",
                field="message.taskId",
            )
        command = {"resume": mapping.resume_value(message.parts)}
        task_id, context_id = found.task_id, found.context_id
    context_id = context_id or str(uuid.uuid4())
    raw: dict[str, Any] = {
        "assistant_id": assistant.assistant_id,
        "stream_mode": STREAM_MODES,
        "if_not_exists": "create",
        "metadata": {
            "a2a": {"message_id": message.message_id, **({"task_id": task_id} if task_id else {})}
        },
    }
    if command is not None:
        raw["command"] = command
    else:
        raw["input"] = mapping.graph_input(message.parts, message.message_id)
    try:
        body = validate(RunCreate, raw)
        tid = public_ids.resolve(context_id, None)  # threads.create_run: admit_run
    except ValidationFailed as exc:
        raise RpcError(Code.INVALID_PARAMS, f"message: {exc}", field="message") from exc
    except NotFound as exc:
        raise RpcError(
            Code.INVALID_PARAMS,
            f"message.contextId {context_id[:256]} is not a UUID",
            field="message.contextId",
        ) from exc
    run = admit_run(principal().user_id, public_ids.on_thread(body.to_request(tid)), raw=raw)
    return Admitted(run, task_id or mapping.task_id_of(context_id, run.run_id), context_id)


def submitted(admitted: Admitted) -> TaskView:
    """The view of a task whose run was just admitted."""
    return TaskView(
        admitted.task_id, admitted.context_id, mapping.SUBMITTED, admitted.run.created_at
    )


def found_after(admitted: Admitted, assistant: Assistant) -> Found:
    """The task of an admitted run, read again (once it has ended)."""
    return find(admitted.task_id, assistant)


def cancel(found: Found) -> CancelOutcome:
    """Cancel the task's latest run (R5); TASK_NOT_CANCELABLE once it has ended, and
    while it waits for input (its run has ended: there is nothing to stop)."""
    svc, run = current_services(), found.latest
    if run.terminal:
        raise RpcError(
            Code.TASK_NOT_CANCELABLE,
            f"task {found.task_id} is {mapping.state_name(view(found, history=False).state)}"
            ": it cannot be canceled",
            field="id",
        )
    if authz.active():  # as POST .../cancel asks: threads.update on the task's thread
        action = {"run_id": run.run_id, "action": CancelAction.INTERRUPT.value}
        public_ids.authorize_thread(run.thread_id, found.context_id, "update", action)
    outcome = svc.runs.cancel(
        owner=principal().user_id,
        thread_id=run.thread_id,
        run_id=run.run_id,
        action=CancelAction.INTERRUPT,
    )
    if outcome in (CancelOutcome.REQUESTED, CancelOutcome.ALREADY_REQUESTED):
        deadline = time.monotonic() + svc.settings.cancel_settle_s
        while not svc.runs.is_terminal(run.run_id) and time.monotonic() < deadline:
            time.sleep(0.05)
    return outcome
