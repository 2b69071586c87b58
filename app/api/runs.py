"""Runs: create (background / stream / wait, on a thread or without one), batch, list, get,
delete, join, join stream, cancel (one run, or many)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, request, stream_with_context

from app import authz, public_ids
from app.admission import admit_batch, admit_run
from app.api.shapes import run_json
from app.auth import principal
from app.http import (
    answers,
    body,
    holds_connection,
    non_empty_args,
    query,
    streams_events,
)
from app.ids import checked_run_id
from app.limits import batch_sized, run_sized
from app.responses import json_response
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
from app.services import Services, current_services
from app.streaming.frames import event_filter
from app.streaming.sse import sse_body
from shared import serde
from shared.bridge.base import BEFORE_FIRST, END_EVENT, Event, Gap
from shared.errors import NotFound, PermissionDenied
from shared.runs.admission import CancelOutcome
from shared.runs.model import CancelAction, OnDisconnect, Run
from shared.runs.result import final_result

bp = Blueprint("runs", __name__)
log = logging.getLogger(__name__)


def _admit(thread_id: str, body: RunCreate) -> Run:
    # threads.create_run is asked in admit_run, with the whole request
    wanted = public_ids.on_thread(body.to_request(public_ids.resolve(thread_id, None)))
    return admit_run(principal().user_id, wanted)


def _admit_stateless(body: StatelessRunCreate) -> Run:
    return admit_run(principal().user_id, body.to_request())


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


def _await_end(svc: Services, run_id: str, stop: threading.Event) -> None:
    """Block until the run's stream ends (its `end`, or a gap when the stream is gone and
    the run is terminal), or until `stop` is set (the client left).

    It follows from the newest retained event rather than replaying the whole stream:
    only the end matters here.
    """
    while not stop.is_set():
        last = svc.subscriber.last_event(run_id)
        if last is not None and last.event == END_EVENT:
            return
        for batch in svc.subscriber.subscribe_batches(
            run_id,
            last.id if last is not None else None,
            is_terminal=lambda: svc.runs.is_terminal(run_id),
            unstarted_end=lambda: svc.runs.unstarted_end(run_id),
        ):
            if any(isinstance(i, Event) and i.event == END_EVENT for i in batch):
                return
            if any(isinstance(i, Gap) for i in batch):
                break  # the stream was lost (Redis restart): end only once the run has
            if stop.is_set():
                return
        if svc.runs.is_terminal(run_id):
            return
        stop.wait(svc.settings.stream_heartbeat_s / 5)


def _until_end(run_id: str) -> Iterator[bytes]:
    """A newline every `wait_keepalive_s` until the run's stream ends, events or not, as the
    official server sends them: a proxy sees bytes, a JSON parser skips the leading whitespace.

    The wait runs in a thread of its own (a greenlet under gevent) so that the keep-alive
    keeps its clock whatever the stream does: a run with an event every 3 s never leaves a
    follower idle for a heartbeat, and a newline per idle heartbeat sent none. Closing the
    response (the client left) stops the wait within a heartbeat.
    """
    svc = current_services()
    stop, done = threading.Event(), threading.Event()
    failed: list[Exception] = []

    def wait() -> None:
        try:
            _await_end(svc, run_id, stop)
        except Exception as exc:  # noqa: BLE001 - raised again in the response's thread
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=wait, name="run-wait", daemon=True).start()
    try:
        while not done.wait(svc.settings.wait_keepalive_s):
            yield b"\n"
    finally:
        stop.set()
    if failed:
        raise failed[0]


def _wait_body(run: Run, *, cancel_on_disconnect: bool) -> Iterator[bytes]:
    """Whitespace while waiting (keeps proxies and the SDK happy), then the JSON result."""
    svc = current_services()
    run_id, thread_id = run.run_id, run.thread_id
    owner = principal().user_id
    finished = False
    try:
        if not run.terminal:
            yield from _until_end(run_id)
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
@run_sized
@body(RunCreate)
def create(thread_id: str, body: RunCreate) -> Response:
    """Create a background run."""
    run = _admit(thread_id, body)
    return json_response(run_json(run), headers=_locations(run, "/stream"))


@bp.post("/threads/<thread_id>/runs/stream")
@streams_events
@run_sized
@body(RunCreate)
def create_stream(thread_id: str, body: RunCreate) -> Response:
    """Create a run and stream its events (SSE)."""
    run = _admit(thread_id, body)
    cancel_on_disconnect = body.on_disconnect is OnDisconnect.CANCEL
    return _stream_response(
        run, BEFORE_FIRST, cancel_on_disconnect=cancel_on_disconnect, admitted=True
    )


@bp.post("/threads/<thread_id>/runs/wait")
@holds_connection
@run_sized
@body(RunCreate)
def create_wait(thread_id: str, body: RunCreate) -> Response:
    """Create a run and wait for its final values."""
    run = _admit(thread_id, body)
    return _wait_response(run, cancel_on_disconnect=body.on_disconnect is OnDisconnect.CANCEL)


@bp.post("/runs")
@run_sized
@body(StatelessRunCreate)
def create_stateless(body: StatelessRunCreate) -> Response:
    """Create a background run on a new temporary thread (`on_completion`: delete | keep)."""
    run = _admit_stateless(body)
    return json_response(run_json(run), headers=_locations(run, "/stream"))


@bp.post("/runs/stream")
@streams_events
@run_sized
@body(StatelessRunCreate)
def create_stateless_stream(body: StatelessRunCreate) -> Response:
    """Create a run on a new temporary thread and stream its events (SSE)."""
    run = _admit_stateless(body)
    cancel_on_disconnect = body.on_disconnect is OnDisconnect.CANCEL
    return _stream_response(
        run, BEFORE_FIRST, cancel_on_disconnect=cancel_on_disconnect, admitted=True
    )


@bp.post("/runs/wait")
@holds_connection
@run_sized
@body(StatelessRunCreate)
def create_stateless_wait(body: StatelessRunCreate) -> Response:
    """Create a run on a new temporary thread and wait for its final values."""
    run = _admit_stateless(body)
    return _wait_response(run, cancel_on_disconnect=body.on_disconnect is OnDisconnect.CANCEL)


@bp.post("/runs/batch")
@batch_sized
@body(BatchRunCreate, items=True)
def create_batch(body: list[BatchRunCreate]) -> Response:
    """Create background runs, each on its `thread_id` or a new temporary thread, all or
    nothing; answers the runs in request order."""
    wanted = []
    for item in body:
        one = item.to_request()
        if item.thread_id is not None:  # the client's id: its storage id (A4)
            tid = public_ids.resolve(str(item.thread_id), None)  # create_run: admit_batch
            one = public_ids.on_thread(dataclasses.replace(one, thread_id=tid))
        wanted.append(one)
    runs = admit_batch(principal().user_id, wanted)
    return json_response([run_json(r) for r in runs])


@bp.post("/runs/cancel")
@answers(204, "the selected runs are cancelled")
@query(CancelManyQuery)
@body(RunsCancel)
def cancel_many(query: CancelManyQuery, body: RunsCancel) -> Response:
    """Cancel runs of one thread by id, or every pending/running run of the caller (R5).

    Under the project's auth every user shares one tenant, so a cancel across threads is
    allowed only when `threads.update` puts no filter on the caller (else 403: name the
    thread)."""
    action = {"action": query.action.value}
    if body.thread_id is not None:
        thread_id = public_ids.resolve(str(body.thread_id), "update", action)
    else:
        thread_id = None
        decision = authz.authorize("threads", "update", {"thread_id": None, **action})
        if decision is not None and decision.containment is not None:
            raise PermissionDenied(
                "cancelling runs across threads is not available under this project's"
                " authorization rules; name thread_id"
            )
    current_services().runs.cancel_many(
        owner=principal().user_id,
        action=query.action,
        statuses=body.status.statuses if body.status is not None else None,
        thread_id=thread_id,
        run_ids=[str(r) for r in body.run_ids] if body.run_ids is not None else None,
    )
    return Response(status=204)


@bp.get("/threads/<thread_id>/runs")
@query(RunListQuery)
def list_runs(thread_id: str, query: RunListQuery) -> Response:
    """Runs of the thread, newest first."""
    tid = public_ids.resolve(thread_id)
    runs = current_services().store.list_runs(
        tid, principal().user_id, limit=query.limit, offset=query.offset, status=query.status
    )
    return json_response([run_json(r) for r in runs])


@bp.get("/threads/<thread_id>/runs/<run_id>")
def get(thread_id: str, run_id: str) -> Response:
    """One run."""
    run = current_services().store.get_run(
        public_ids.resolve(thread_id), checked_run_id(run_id), principal().user_id
    )
    return json_response(run_json(run))


@bp.delete("/threads/<thread_id>/runs/<run_id>")
@answers(204, "deleted")
def delete(thread_id: str, run_id: str) -> Response:
    """Delete a finished run."""
    rid = checked_run_id(run_id)
    current_services().store.delete_run(
        public_ids.resolve(thread_id, "delete", {"run_id": rid}), rid, principal().user_id
    )
    return Response(status=204)


@bp.get("/threads/<thread_id>/runs/<run_id>/join")
@holds_connection
def join(thread_id: str, run_id: str) -> Response:
    """Wait for the run to end; return the thread's final values."""
    cancel = request.args.get("cancel_on_disconnect", "false").lower() in ("1", "true")
    run = current_services().store.get_run(
        public_ids.resolve(thread_id), checked_run_id(run_id), principal().user_id
    )
    return _wait_response(run, cancel_on_disconnect=cancel)


def _join_args() -> dict[str, Any]:
    # The SDK sends `stream_mode=` (empty) when it has none: empties are absent.
    return non_empty_args(multi=("stream_mode",))


@bp.get("/threads/<thread_id>/runs/<run_id>/stream")
@streams_events
@query(JoinStreamQuery, args=_join_args)
def join_stream(thread_id: str, run_id: str, query: JoinStreamQuery) -> Response:
    """Join a run's stream; `Last-Event-ID` resumes exactly after that event (B4, B5)."""
    run = current_services().store.get_run(
        public_ids.resolve(thread_id), checked_run_id(run_id), principal().user_id
    )
    last_event_id = request.headers.get("Last-Event-ID") or query.last_event_id
    return _stream_response(
        run, last_event_id, cancel_on_disconnect=query.cancel_on_disconnect, modes=query.stream_mode
    )


def _settle(svc: Services, run_id: str) -> None:
    """Give a running run's owner up to `cancel_settle_s` to stop it (R5), so that a read
    right after the 202 sees `interrupted` as the official server answers at once.

    The official server writes `interrupted` when the cancel is asked; here the status is the
    owner's to write, fenced, once the graph has stopped: a run shown ended while its worker
    still writes would free the thread for the next run under a live writer (R3, L2).
    """
    deadline = time.monotonic() + svc.settings.cancel_settle_s
    while not svc.runs.is_terminal(run_id) and time.monotonic() < deadline:
        time.sleep(0.05)


@bp.post("/threads/<thread_id>/runs/<run_id>/cancel")
@answers(202, "cancel accepted (wait=0)", json=True)
@query(CancelQuery)
def cancel(thread_id: str, run_id: str, query: CancelQuery) -> Response:
    """Cancel a run (R5); `wait=1` returns once the run has a terminal status."""
    svc = current_services()
    rid = checked_run_id(run_id)
    tid = public_ids.resolve(thread_id, "update", {"run_id": rid, "action": query.action.value})
    owner = principal().user_id
    outcome = svc.runs.cancel(owner=owner, thread_id=tid, run_id=rid, action=query.action)
    if not query.wait:
        if outcome in (CancelOutcome.REQUESTED, CancelOutcome.ALREADY_REQUESTED):
            _settle(svc, rid)
        run = svc.store.get_run(tid, rid, owner)
        return json_response({**run_json(run), "cancel": outcome.value}, status=202)
    run = svc.store.get_run(tid, rid, owner)

    def body() -> Iterator[bytes]:
        if not run.terminal:
            yield from _until_end(rid)
        final = svc.store.get_run(tid, rid, owner)
        yield serde.dumps({**run_json(final), "cancel": outcome.value})

    return Response(
        stream_with_context(body()), mimetype="application/json", headers=_locations(run, "/join")
    )
