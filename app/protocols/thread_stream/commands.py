"""The thread streaming protocol's commands (`POST /threads/{id}/commands`, and every frame of
its WebSocket): validated with the protocol's own types (`langchain_protocol`), answered with
its envelopes, acted on through the REST API's admission, ownership and state reads.

`run.start` admits a run on the thread (made when missing, as the official server does) that
publishes LangChain protocol events (`StreamOptions.protocol_events`); input sent while the
thread waits on an interrupt resumes it. `input.respond` resumes the interrupts it names, with
the thread's assistant; `input.inject` queues a run with the message; `state.fork` runs from a
checkpoint. Concurrency follows the SDK's `multitaskStrategy`, else `enqueue`.

Errors a client made in a command are protocol errors (`{"type": "error", "error": <code>}`,
HTTP 200, as the official server answers); what is wrong with the request itself (not JSON,
no integer id or string method, too large, unauthenticated, over a per-user limit, a thread
that is not the caller's) keeps its HTTP status.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, cast

from langchain_protocol import protocol as p
from pydantic import TypeAdapter, ValidationError

from app import public_ids
from app.admission import admit_run
from app.api.threads import graph_id_of, owned_thread
from app.auth import principal
from app.schemas import RunCreate
from app.services import current_services
from shared import serde
from shared.authz.decide import Denied
from shared.bridge.protocol import agent_tree as agent_tree_of
from shared.errors import (
    AssistantNotFound,
    CheckpointNotFound,
    Conflict,
    RunNotFound,
    ThreadNotFound,
    ThreadrunError,
    ValidationFailed,
)
from shared.runs.model import Run, Thread, ThreadStatus
from shared.vocab import MultitaskStrategy

SETTLE_POLL_S = 0.05
DEFAULT_STRATEGY = "enqueue"
"""A `run.start` without `multitaskStrategy` queues behind the thread's run (the official
server's default on this protocol)."""


class CommandError(ThreadrunError):
    """A protocol error answer: its code (`langchain_protocol.ErrorCode`) and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


Handler = Callable[[str, dict[str, Any]], dict[str, Any]]

_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "run.start": TypeAdapter(p.RunStartParams),
    "input.respond": TypeAdapter(p.InputRespondParams),
    "input.inject": TypeAdapter(p.InputInjectParams),
    "state.get": TypeAdapter(p.StateGetParams),
    "state.listCheckpoints": TypeAdapter(p.ListCheckpointsParams),
    "state.fork": TypeAdapter(p.StateForkParams),
    "agent.getTree": TypeAdapter(p.AgentGetTreeParams),
    "subscription.subscribe": TypeAdapter(p.SubscribeParams),
    "subscription.unsubscribe": TypeAdapter(p.UnsubscribeParams),
    "subscription.reconnect": TypeAdapter(p.ReconnectParams),
}


def params_of(method: str, params: Any) -> dict[str, Any]:
    """`params` validated as `method`'s (strictly: `true` is not a number); CommandError
    `invalid_argument` naming the field."""
    try:
        return cast(dict[str, Any], _ADAPTERS[method].validate_python(params or {}, strict=True))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"] if not str(x).startswith("function-"))
        raise CommandError(
            "invalid_argument", f"{method}: params.{where}: {first['msg']}" if where else str(exc)
        ) from None


def success(command_id: int, result: dict[str, Any]) -> dict[str, Any]:
    """A `CommandResponse`."""
    return {"type": "success", "id": command_id, "result": result}


def error(command_id: int | None, code: str, message: str) -> dict[str, Any]:
    """An `ErrorResponse`."""
    return {"type": "error", "id": command_id, "error": code, "message": message}


def answer(thread_id: str, command: dict[str, Any], handlers: dict[str, Handler]) -> dict[str, Any]:
    """The answer to one well-formed command (integer id, string method): its result, or
    the protocol error its params or its action met."""
    cid, method = command["id"], command["method"]
    handler = handlers.get(method)
    if handler is None:
        return error(cid, "unknown_command", f"unknown command {method!r}")
    raw = command.get("params")
    try:
        params = params_of(method, raw)
        if isinstance(raw, dict) and "multitaskStrategy" in raw:  # the SDK's, beside the type
            params["multitaskStrategy"] = raw["multitaskStrategy"]
        return success(cid, handler(thread_id, params))
    except CommandError as exc:
        return error(cid, exc.code, exc.message)
    except ValidationFailed as exc:
        return error(cid, "invalid_argument", str(exc))
    except Denied as exc:
        return error(cid, "permission_denied", exc.detail)
    except CheckpointNotFound as exc:
        return error(cid, "no_such_checkpoint", str(exc))
    except (RunNotFound, AssistantNotFound) as exc:
        return error(
            cid, "no_such_run" if isinstance(exc, RunNotFound) else "invalid_argument", str(exc)
        )
    except Conflict as exc:
        return error(cid, "invalid_argument", str(exc))


# --- runs -----------------------------------------------------------------------------------
def _strategy(params: dict[str, Any]) -> MultitaskStrategy:
    value = params.get("multitaskStrategy")
    allowed = ("reject", "rollback", "interrupt", "enqueue")
    return cast(MultitaskStrategy, value if value in allowed else DEFAULT_STRATEGY)


def _admit(thread_id: str, fields: dict[str, Any]) -> Run:
    """Admit a protocol run on the caller's thread (made when missing)."""
    fields = {"if_not_exists": "create", "stream_subgraphs": True, **fields}
    try:
        body = RunCreate.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise CommandError("invalid_argument", f"{where}: {first['msg']}") from None
    storage = public_ids.resolve(thread_id, None)
    wanted = public_ids.on_thread(body.to_request(storage))
    wanted = dataclasses.replace(wanted, kwargs={**wanted.kwargs, "protocol_events": True})
    return admit_run(principal().user_id, wanted, raw=fields)


def _settled(thread_id: str, *, settle: bool = False) -> Thread | None:
    """The caller's thread (None when it is missing).

    A client may answer an interrupt as soon as its event arrives, while the run that asked
    is still being finished (the thread busy): that settles within moments, so with
    `settle` this waits for it, up to `interrupt_settle_s`."""
    until = time.monotonic() + (current_services().settings.interrupt_settle_s if settle else 0)
    while True:
        try:
            thread = owned_thread(thread_id)
        except ThreadNotFound:
            return None
        if thread.status is not ThreadStatus.BUSY or time.monotonic() >= until:
            return thread
        time.sleep(SETTLE_POLL_S)


def _waiting_on(thread: Thread | None) -> list[str]:
    """The ids of the interrupts the thread waits on."""
    if thread is None or thread.status is not ThreadStatus.INTERRUPTED:
        return []
    state = current_services().state.get(thread.thread_id, graph_id_of(thread))
    return [i["id"] for i in state.get("interrupts") or [] if isinstance(i, dict) and "id" in i]


def run_start(thread_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """`run.start`: a new run, or a resume when the thread waits on an interrupt."""
    fields: dict[str, Any] = {
        "assistant_id": params["assistant_id"],
        "config": params.get("config"),
        "metadata": params.get("metadata") or {},
        "multitask_strategy": _strategy(params),
    }
    value = params.get("input")
    if value is not None and _waiting_on(_settled(thread_id)):
        fields["command"] = {"resume": value}
    else:
        fields["input"] = value
    checkpoint_id = ((params.get("config") or {}).get("configurable") or {}).get("checkpoint_id")
    if isinstance(checkpoint_id, str):
        fields["checkpoint_id"] = checkpoint_id
    return {"run_id": _admit(thread_id, fields).run_id}


def _thread_assistant(thread: Thread) -> str:
    """The assistant of the thread's runs (the one its newest run used)."""
    assistant = thread.metadata.get("assistant_id")
    if not isinstance(assistant, str):
        raise CommandError("no_such_run", "no run has been started on this thread")
    return assistant


def input_respond(thread_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """`input.respond`: resume the named interrupts (one or several) in one run."""
    entries = params.get("responses") or [params]
    thread = _settled(thread_id, settle=True)
    waiting = set(_waiting_on(thread))
    resume: dict[str, Any] = {}
    for entry in entries:
        interrupt_id = entry["interrupt_id"]
        if interrupt_id not in waiting:
            raise CommandError(
                "no_such_interrupt", f"the thread does not wait on interrupt {interrupt_id!r}"
            )
        resume[interrupt_id] = entry.get("response")
    assert thread is not None  # a missing thread waits on nothing: refused above
    command: dict[str, Any] = {"resume": resume}
    for key in ("update", "goto"):
        if params.get(key) is not None:
            command[key] = params[key]
    run = _admit(
        thread_id,
        {
            "assistant_id": _thread_assistant(thread),
            "command": command,
            "config": params.get("config"),
            "metadata": params.get("metadata") or {},
            "multitask_strategy": DEFAULT_STRATEGY,
        },
    )
    return {"run_id": run.run_id}


def input_inject(thread_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """`input.inject`: the message as the input of a run queued on the thread."""
    if params["namespace"]:
        raise CommandError("no_such_namespace", "messages are injected at the root namespace []")
    run = _admit(
        thread_id,
        {
            "assistant_id": _thread_assistant(owned_thread(thread_id)),
            "input": {"messages": [dict(params["message"])]},
            "multitask_strategy": DEFAULT_STRATEGY,
        },
    )
    return {"run_id": run.run_id}


def state_fork(thread_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """`state.fork`: a run from the checkpoint (a 'no_such_checkpoint' if the thread has none)."""
    thread = owned_thread(thread_id)
    if not current_services().state.has_checkpoint(thread.thread_id, params["checkpoint_id"]):
        raise CommandError("no_such_checkpoint", f"no checkpoint {params['checkpoint_id']!r}")
    run = _admit(
        thread_id,
        {
            "assistant_id": _thread_assistant(thread),
            "input": params.get("input"),
            "config": params.get("config"),
            "checkpoint_id": params["checkpoint_id"],
            "multitask_strategy": DEFAULT_STRATEGY,
        },
    )
    return {"run_id": run.run_id, "thread_id": thread_id}


# --- state ----------------------------------------------------------------------------------
def _root_only(namespace: list[str] | None) -> None:
    if namespace:
        raise CommandError(
            "no_such_namespace",
            "only the root namespace [] has state of its own here; a subgraph's state is"
            " part of its parent's",
        )


def state_get(thread_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """`state.get`: the thread's current values (only `keys`, when given) and checkpoint."""
    _root_only(params["namespace"])
    thread = owned_thread(thread_id)
    state = current_services().state.get(thread.thread_id, graph_id_of(thread))
    values = state.get("values") or {}
    if params.get("keys") is not None and isinstance(values, dict):
        values = {k: values[k] for k in params["keys"] if k in values}
    out: dict[str, Any] = {"values": values}
    if state.get("checkpoint_id"):
        out["checkpoint"] = {"id": state["checkpoint_id"], "ns": ""}
    return out


def list_checkpoints(thread_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """`state.listCheckpoints`: newest first, `limit` of them, `before` a checkpoint id."""
    _root_only(params.get("namespace"))
    thread = owned_thread(thread_id)
    svc = current_services()
    limit = params.get("limit", 10)
    if not 1 <= limit <= 1000:
        raise CommandError("invalid_argument", "state.listCheckpoints: params.limit: 1 to 1000")
    before = params.get("before")
    page = svc.state.history(
        thread.thread_id,
        graph_id_of(thread),
        limit=limit,
        before={"checkpoint_ns": "", "checkpoint_id": before} if before else None,
        metadata=None,
        checkpoint=None,
    )
    return {"checkpoints": [_summary(state) for state in page.decoded()]}


def _summary(state: dict[str, Any]) -> dict[str, Any]:
    metadata = state.get("metadata") or {}
    out: dict[str, Any] = {
        "id": state["checkpoint_id"],
        "timestamp": str(state.get("created_at") or ""),
        "step": metadata.get("step", -1),
        "metadata": metadata,
    }
    writes = metadata.get("writes")
    if isinstance(writes, dict) and len(writes) == 1:
        out["node_name"] = next(iter(writes))
    return out


def agent_tree(thread_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """`agent.getTree`: the run's graph (`run_id`, else the thread's newest run), its status
    and the subgraphs it entered, from its own `lifecycle` events."""
    thread = owned_thread(thread_id)
    svc = current_services()
    run_id = params.get("run_id")
    if run_id is None:
        newest = svc.store.follow_start(thread.thread_id)[1]
        refs = svc.store.runs_after(thread.thread_id, newest - 1, 1) if newest else None
        run_id = refs[0].run_id if refs else None
    run = svc.store.get_run_by_id(run_id) if run_id else None
    if run is None or run.thread_id != thread.thread_id:
        raise CommandError(
            "no_such_run", f"no run {run_id} on this thread" if run_id else "no run yet"
        )
    lifecycles = [serde.loads(e.data) for e in svc.subscriber.retained(run.run_id, "lifecycle")]
    return {"tree": agent_tree_of(run.graph_id, run.status, lifecycles)}
