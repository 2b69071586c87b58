"""Thread ids are per owner (A4): the web's edge between the ids a client sees and sends
(public ids) and the ids threads are stored under (shared/runs/thread_ids.py).

In: every thread id a request names (URL, body, WebSocket frame) goes through `resolve`,
one indexed query on (owner, public_id). Out: the storage ids resolved during the request
are written back as public ids at the positions that hold a thread id, never inside what a
user wrote (`shared.runs.thread_ids.PublicIds`). Threads, runs and crons are shaped with
their public id by their views; what carries storage ids from below is translated here by
its shape: the state and history answers (checkpoint configs), journal pages, memory
facts, the SSE streams event by event (only the events that hold an id, and only when a
storage id occurs in them: the others, and those the worker wrote with the public id
already, `PublicIds.at_source`, are relayed byte for byte), error messages and
Location headers; WebSocket frames through the session's `aliases` (`ws_frame`). A thread
the server named has one id for both, so its requests add no translation.

The ops endpoints and page (cross-owner, the ops role) show storage ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from flask import Flask, Response, g, request

from app import authz
from app.auth import principal
from app.ids import parsed_thread_id
from app.services import current_services
from shared import serde
from shared.errors import ThreadNotFound
from shared.runs.model import RunRequest, Thread
from shared.runs.thread_ids import (
    PublicIds,
    Shape,
    SseTranslator,
    each,
    field,
    protocol_event_data,
    run_event_data,
)

_events = field("events", each(PublicIds.owned))
JSON_SHAPES: dict[str, Shape] = {
    "state.get_state": PublicIds.snapshot,
    "state.get_state_at": PublicIds.snapshot,
    "state.post_state_at": PublicIds.snapshot,
    "state.update_state": PublicIds.snapshot,
    "state.get_history": each(PublicIds.snapshot),
    "state.post_history": each(PublicIds.snapshot),
    "events.run_events": _events,
    "events.thread_events": _events,
    "events.message_page": _events,
    "runs.create": PublicIds.run,
    "runs.create_batch": each(PublicIds.run),
    "runs.list_runs": each(PublicIds.run),
    "runs.get": PublicIds.run,
    "runs.cancel": PublicIds.run,
    "memory.list_facts": field("facts", each(lambda ids, f: ids.owned(f, "source_thread_id"))),
}
"""The JSON answers that carry storage ids from below (run rows, LangGraph's checkpoint
configs, the journal's and memory's rows), by view; every other answer (threads, crons, a
run's final values) is shaped with public ids by its view or is the user's own, and goes
out as it is (only an error's message is translated). A streamed answer is translated
chunk by chunk, each chunk one JSON document (`cancel?wait=1`: its heartbeats, then the run)."""

SSE_DATA: dict[str, Callable[[PublicIds, str, bytes], bytes]] = {
    "thread_stream_protocol.stream_events": protocol_event_data,
}
"""How an SSE view's `data:` is read (default: a run event's data, by its event name)."""


def aliases() -> dict[str, str]:
    """This request's storage id -> public id of every thread it resolved (the dict is
    shared: a WebSocket session keeps it for its sending threads)."""
    if "thread_aliases" not in g:
        g.thread_aliases = {}
    out: dict[str, str] = g.thread_aliases
    return out


def remember(storage: str, public: str) -> None:
    """Write `public` in place of `storage` in this request's responses."""
    if storage != public:
        aliases()[storage] = public


def remember_thread(thread: Thread) -> Thread:
    """`remember` a thread read by its public id; returns it."""
    remember(thread.thread_id, thread.client_id)
    return thread


def resolve(
    thread_id: str, action: str | None = "read", value: dict[str, Any] | None = None
) -> str:
    """The storage id of the caller's thread the client calls `thread_id` (a missing one:
    the id it would be stored under, so that it answers 404 and `if_not_exists=create`
    makes it there). A thread id that is not a UUID cannot exist: 404, exactly like a
    missing one.

    Under the project's auth, the caller must also be allowed `action` on the thread
    (`threads.<action>` with `{"thread_id": ..., **value}`), and an existing thread must
    pass the handler's filter (404 otherwise). `action=None`: the caller authorizes
    itself (run creation: `threads.create_run` in app/admission.py)."""
    public = parsed_thread_id(thread_id)
    storage = next((s for s, known in aliases().items() if known == public), None)
    if storage is None:  # not resolved yet in this request
        storage = current_services().store.resolve_thread_id(principal().user_id, public)
        remember(storage, public)
    if action is not None and authz.active():
        authorize_thread(storage, public, action, value or {})
    return storage


def authorize_thread(storage: str, public: str, action: str, value: dict[str, Any]) -> None:
    """`threads.<action>` on the thread (Denied when refused); an existing thread the
    filter leaves out is a 404, a missing one is left to the caller (404 or create)."""
    decision = authz.authorize("threads", action, {"thread_id": public, **value})
    if decision is None or decision.containment is None:
        return
    try:
        thread = current_services().store.get_thread(storage, principal().user_id)
    except ThreadNotFound:
        return
    authz.require_visible(decision, thread.metadata, ThreadNotFound(f"thread {public} not found"))


def public_of(storage: str) -> str:
    """The public id of a storage id this request resolved (else the id itself)."""
    return aliases().get(storage, storage)


def on_thread(request: RunRequest) -> RunRequest:
    """A run request on a resolved thread, with the client's id for the thread it may make
    (`if_not_exists=create`)."""
    return dataclasses.replace(request, public_thread_id=public_of(request.thread_id))


def ws_frame(text: str, known: dict[str, str]) -> str:
    """A WebSocket frame of the session whose resolved ids are `known`, translated."""
    return PublicIds(known).ws_frame(text) if known else text


def protocol_text(text: str, known: dict[str, str]) -> str:
    """A thread streaming protocol message, translated (its WebSocket)."""
    return protocol_event_data(PublicIds(known), "", text.encode()).decode() if known else text


def _translated(body: Iterable[bytes] | Iterable[str], sse: SseTranslator) -> Iterator[bytes]:
    try:
        for chunk in body:
            out = sse.feed(chunk.encode() if isinstance(chunk, str) else chunk)
            if out:
                yield out
        tail = sse.flush()
        if tail:
            yield tail
    finally:  # the client left: close the inner stream (its on-close actions run)
        close: Any = getattr(body, "close", None)
        if close is not None:
            close()


def _document(data: bytes, shape: Shape, ids: PublicIds) -> bytes:
    if not ids.occurs_in(data):
        return data
    try:
        obj = serde.loads(data)
    except ValueError:
        return data  # not a whole document (a heartbeat, a part): as it is
    shape(ids, obj)
    return serde.dumps(obj)


def _documents(
    body: Iterable[bytes] | Iterable[str], shape: Shape, ids: PublicIds
) -> Iterator[bytes]:
    try:
        for chunk in body:
            yield _document(chunk.encode() if isinstance(chunk, str) else chunk, shape, ids)
    finally:
        close: Any = getattr(body, "close", None)
        if close is not None:
            close()


def translate(response: Response) -> Response:
    """Public ids in place of the storage ids this request resolved, at their positions."""
    found = g.get("thread_aliases")
    if not found:
        return response
    ids = PublicIds(found)
    if not ids:
        return response
    for header in ("Location", "Content-Location"):
        value = response.headers.get(header)
        if value:
            response.headers[header] = ids.text(value)
    if response.direct_passthrough:
        return response
    endpoint = request.endpoint or ""
    if response.mimetype == "text/event-stream" and response.is_streamed:
        data_of = SSE_DATA.get(endpoint, run_event_data)
        response.response = _translated(response.response, SseTranslator(ids, data_of))
    elif response.mimetype == "application/json":
        shape = PublicIds.message if response.status_code >= 400 else JSON_SHAPES.get(endpoint)
        if shape is None:
            pass
        elif response.is_streamed:
            response.response = _documents(response.response, shape, ids)
        else:
            response.set_data(_document(response.get_data(), shape, ids))
    return response


def init_app(app: Flask) -> None:
    """Translate every response (after the error handlers made theirs)."""
    app.after_request(translate)
