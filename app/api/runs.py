"""Runs: create (background / stream / wait, on a thread or without one), batch, list, get,
delete, join, join stream, cancel (one run, or many)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, request, stream_with_context

from app import thread_ids
from app.api.shapes import run_json
from app.auth import principal
from app.http import (
    checked_run_id,
    checked_thread_id,
    json_response,
    parse_body,
    parse_query,
    read_json_body,
    validate,
    validate_items,
)
from app.schemas import (
    BatchRunCreate,
    CancelManyQuery,
    CancelQuery,
    JoinStreamQuery,
    RunCreate,
    RunListQuery,
    RunsCancel,
    StatelessRunCreate,
)
from app.services import current_services
from app.streaming.frames import event_filter
from app.streaming.sse import sse_body
from shared import serde
from shared.bridge.base import BEFORE_FIRST, END_EVENT, Event, Gap
from shared.errors import NotFound
from shared.runs.model import CancelAction, OnDisconnect, Run
from shared.runs.result import final_result

bp = Blueprint("runs", __name__)
log = logging.getLogger(__name__)


def _admit(thread_id: str) -> tuple[Run, RunCreate]:
    body = parse_body(RunCreate)
    wanted = thread_ids.on_thread(body.to_request(checked_thread_id(thread_id)))
    run = current_services().runs.admit(principal().user_id, wanted)
    return run, body


def _admit_stateless() -> tuple[Run, StatelessRunCreate]:
    body = parse_body(StatelessRunCreate)
    run = current_services().runs.admit(principal().user_id, body.to_request())
    return run, body


def _locations(run: Run, tail: str) -> dict[str, str]:
    base = f"/threads/{run.thread_id}/runs/{run.run_id}"
    return {"Location": f"{base}{tail}", "Content-Location": base}


def is_terminal(run_id: str) -> bool:
    return current_services().runs.is_terminal(run_id)


def _stream_response(
    run: Run,
    last_event_id: str | None,
    *,
    cancel_on_disconnect: bool,
    modes: list[str] | None = None,
    status: int = 200,
    admitted: bool = False,
) -> Response:
    svc = current_services()
    run_id, thread_id = run.run_id, run.thread_id
    owner = principal().user_id
    # 400 before any byte is sent. A stream created with its run reads from before the first
    # event, so a start trimmed before the first read (a web host cut from Redis meanwhile)
    # is a gap, never a silent hole (B5); that cursor cannot be beyond the last event.
    if last_event_id == BEFORE_FIRST:
        cursor = BEFORE_FIRST
    else:
        cursor = svc.subscriber.check_cursor(run_id, last_event_id)

    def on_close(ended: bool) -> None:
        if not ended and cancel_on_disconnect:
            log.info(
                "client disconnected; cancelling (on_disconnect=cancel)", extra={"run_id": run_id}
            )
            svc.runs.cancel(
                owner=owner, thread_id=thread_id, run_id=run_id, action=CancelAction.INTERRUPT
            )

    batches = svc.subscriber.subscribe_batches(
        run_id,
        cursor,
        is_terminal=lambda: is_terminal(run_id),
        unstarted_end=lambda: svc.runs.unstarted_end(run_id),
        admitted=admitted,
    )
    body = sse_body(batches, keep=event_filter(modes), on_close=on_close, run_id=run_id)
    headers = {**_locations(run, "/stream"), "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return Response(
        stream_with_context(body), status=status, mimetype="text/event-stream", headers=headers
    )


def _final_result(run: Run) -> bytes:
    """What /wait and /join return (JSON): last values, or `__error__` (A1).

    A run whose temporary thread is deleted when it ends answers what its worker stored
    before the `end` (`Keys.result`); without it (a run that ended without a worker) the
    thread is read, which the recovery pass keeps for a grace period after the end.
    """
    svc = current_services()
    if run.deletes_thread:
        stored = svc.runs.stored_result(run.run_id)
        if stored is not None:
            return stored
    try:
        ended = svc.store.get_run(run.thread_id, run.run_id, principal().user_id)
    except NotFound:
        if not run.deletes_thread:
            raise
        log.warning("the temporary thread is gone; no result", extra={"run_id": run.run_id})
        return b"{}"  # as the official server, for a stateless run with nothing to show
    state = svc.state.get(ended.thread_id, ended.graph_id)
    return serde.dumps(
        final_result(ended.status, ended.error, state["values"], state["interrupts"])
    )


def _await_end(run_id: str) -> Iterator[bytes]:
    """Block until the run's stream ends (its `end`, or a gap when the stream is gone),
    yielding a newline per idle heartbeat so proxies and the SDK keep the connection.

    It follows from the newest retained event rather than replaying the whole stream:
    only the end matters here.
    """
    svc = current_services()
    while True:
        last = svc.subscriber.last_event(run_id)
        if last is not None and last.event == END_EVENT:
            return
        for batch in svc.subscriber.subscribe_batches(
            run_id,
            last.id if last is not None else None,
            is_terminal=lambda: is_terminal(run_id),
            unstarted_end=lambda: svc.runs.unstarted_end(run_id),
        ):
            if any(isinstance(i, Event) and i.event == END_EVENT for i in batch):
                return
            if any(isinstance(i, Gap) for i in batch):
                break  # the stream was lost (Redis restart): end only once the run has
            if not any(isinstance(i, Event) for i in batch):
                yield b"\n"
        if is_terminal(run_id):
            return
        yield b"\n"
        time.sleep(svc.settings.stream_heartbeat_s / 5)


def _wait_body(run: Run, *, cancel_on_disconnect: bool) -> Iterator[bytes]:
    """Whitespace while waiting (keeps proxies and the SDK happy), then the JSON result."""
    svc = current_services()
    run_id, thread_id = run.run_id, run.thread_id
    owner = principal().user_id
    finished = False
    try:
        if not run.terminal:
            yield from _await_end(run_id)
        finished = True
        yield _final_result(run)
    finally:
        if not finished and cancel_on_disconnect:
            svc.runs.cancel(
                owner=owner, thread_id=thread_id, run_id=run_id, action=CancelAction.INTERRUPT
            )


def _wait_response(run: Run, *, cancel_on_disconnect: bool) -> Response:
    return Response(
        stream_with_context(_wait_body(run, cancel_on_disconnect=cancel_on_disconnect)),
        mimetype="application/json",
        headers=_locations(run, "/join"),
    )


@bp.post("/threads/<thread_id>/runs")
def create(thread_id: str) -> Response:
    """Create a background run."""
    run, _ = _admit(thread_id)
    return json_response(run_json(run), headers=_locations(run, "/stream"))


@bp.post("/threads/<thread_id>/runs/stream")
def create_stream(thread_id: str) -> Response:
    """Create a run and stream its events (SSE)."""
    run, body = _admit(thread_id)
    cancel_on_disconnect = body.on_disconnect is OnDisconnect.CANCEL
    return _stream_response(
        run, BEFORE_FIRST, cancel_on_disconnect=cancel_on_disconnect, admitted=True
    )


@bp.post("/threads/<thread_id>/runs/wait")
def create_wait(thread_id: str) -> Response:
    """Create a run and wait for its final values."""
    run, body = _admit(thread_id)
    return _wait_response(run, cancel_on_disconnect=body.on_disconnect is OnDisconnect.CANCEL)


@bp.post("/runs")
def create_stateless() -> Response:
    """Create a background run on a new temporary thread (`on_completion`: delete | keep)."""
    run, _ = _admit_stateless()
    return json_response(run_json(run), headers=_locations(run, "/stream"))


@bp.post("/runs/stream")
def create_stateless_stream() -> Response:
    """Create a run on a new temporary thread and stream its events (SSE)."""
    run, body = _admit_stateless()
    cancel_on_disconnect = body.on_disconnect is OnDisconnect.CANCEL
    return _stream_response(
        run, BEFORE_FIRST, cancel_on_disconnect=cancel_on_disconnect, admitted=True
    )


@bp.post("/runs/wait")
def create_stateless_wait() -> Response:
    """Create a run on a new temporary thread and wait for its final values."""
    run, body = _admit_stateless()
    return _wait_response(run, cancel_on_disconnect=body.on_disconnect is OnDisconnect.CANCEL)


@bp.post("/runs/batch")
def create_batch() -> Response:
    """Create background runs, each on its `thread_id` or a new temporary thread, all or
    nothing; answers the runs in request order."""
    items = validate_items(BatchRunCreate, read_json_body())
    wanted = []
    for item in items:
        one = item.to_request()
        if item.thread_id is not None:  # the client's id: its storage id (A4)
            tid = thread_ids.resolve(str(item.thread_id))
            one = thread_ids.on_thread(dataclasses.replace(one, thread_id=tid))
        wanted.append(one)
    runs = current_services().runs.admit_batch(principal().user_id, wanted)
    return json_response([run_json(r) for r in runs])


@bp.post("/runs/cancel")
def cancel_many() -> Response:
    """Cancel runs of one thread by id, or every pending/running run of the caller (R5)."""
    q = parse_query(CancelManyQuery)
    body = parse_body(RunsCancel)
    current_services().runs.cancel_many(
        owner=principal().user_id,
        action=q.action,
        statuses=body.status.statuses if body.status is not None else None,
        thread_id=thread_ids.resolve(str(body.thread_id)) if body.thread_id is not None else None,
        run_ids=[str(r) for r in body.run_ids] if body.run_ids is not None else None,
    )
    return Response(status=204)


@bp.get("/threads/<thread_id>/runs")
def list_runs(thread_id: str) -> Response:
    """Runs of the thread, newest first."""
    q = parse_query(RunListQuery)
    tid = checked_thread_id(thread_id)
    runs = current_services().store.list_runs(
        tid, principal().user_id, limit=q.limit, offset=q.offset, status=q.status
    )
    return json_response([run_json(r) for r in runs])


@bp.get("/threads/<thread_id>/runs/<run_id>")
def get(thread_id: str, run_id: str) -> Response:
    """One run."""
    run = current_services().store.get_run(
        checked_thread_id(thread_id), checked_run_id(run_id), principal().user_id
    )
    return json_response(run_json(run))


@bp.delete("/threads/<thread_id>/runs/<run_id>")
def delete(thread_id: str, run_id: str) -> Response:
    """Delete a finished run."""
    current_services().store.delete_run(
        checked_thread_id(thread_id), checked_run_id(run_id), principal().user_id
    )
    return Response(status=204)


@bp.get("/threads/<thread_id>/runs/<run_id>/join")
def join(thread_id: str, run_id: str) -> Response:
    """Wait for the run to end; return the thread's final values."""
    cancel = request.args.get("cancel_on_disconnect", "false").lower() in ("1", "true")
    run = current_services().store.get_run(
        checked_thread_id(thread_id), checked_run_id(run_id), principal().user_id
    )
    return _wait_response(run, cancel_on_disconnect=cancel)


@bp.get("/threads/<thread_id>/runs/<run_id>/stream")
def join_stream(thread_id: str, run_id: str) -> Response:
    """Join a run's stream; `Last-Event-ID` resumes exactly after that event (B4, B5)."""
    # The SDK sends `stream_mode=` (empty) when it has none: treat empties as absent.
    args: dict[str, Any] = {k: v for k, v in request.args.items() if v != ""}
    modes = [m for m in request.args.getlist("stream_mode") if m]
    args.pop("stream_mode", None)
    if modes:
        args["stream_mode"] = modes
    q = validate(JoinStreamQuery, args)
    run = current_services().store.get_run(
        checked_thread_id(thread_id), checked_run_id(run_id), principal().user_id
    )
    last_event_id = request.headers.get("Last-Event-ID") or q.last_event_id
    return _stream_response(
        run, last_event_id, cancel_on_disconnect=q.cancel_on_disconnect, modes=q.stream_mode
    )


@bp.post("/threads/<thread_id>/runs/<run_id>/cancel")
def cancel(thread_id: str, run_id: str) -> Response:
    """Cancel a run (R5); `wait=1` returns once the run has a terminal status."""
    q = parse_query(CancelQuery)
    svc = current_services()
    tid, rid = checked_thread_id(thread_id), checked_run_id(run_id)
    owner = principal().user_id
    outcome = svc.runs.cancel(owner=owner, thread_id=tid, run_id=rid, action=q.action)
    run = svc.store.get_run(tid, rid, owner)
    if not q.wait:
        return json_response({**run_json(run), "cancel": outcome.value}, status=202)

    def body() -> Iterator[bytes]:
        if not run.terminal:
            yield from _await_end(rid)
        final = svc.store.get_run(tid, rid, owner)
        yield serde.dumps({**run_json(final), "cancel": outcome.value})

    return Response(
        stream_with_context(body()), mimetype="application/json", headers=_locations(run, "/join")
    )
