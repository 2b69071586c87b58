"""Thread ids are per owner (A4): the web's edge between the ids a client sees and sends
(public ids) and the ids threads are stored under (shared/runs/thread_ids.py).

In: every thread id a request names (URL, body, WebSocket frame) goes through `resolve`,
one indexed query on (owner, public_id). Out: every storage id resolved during the request
is written back as its public id in the response (JSON bodies, SSE streams, Location
headers; WebSocket frames through the session's `aliases`). A thread the server named has
one id for both, so its requests add no translation.

The ops endpoints and page (cross-owner, the ops role) show storage ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from flask import Flask, Response, g

from app import authz
from app.auth import principal
from app.ids import parsed_thread_id
from app.services import current_services
from shared.errors import ThreadNotFound
from shared.runs.model import RunRequest, Thread
from shared.runs.thread_ids import AliasRewriter

REWRITTEN_TYPES = ("application/json", "text/event-stream")
"""Only our JSON and SSE bodies are rewritten; files (artifacts) go out as they are."""


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


def _rewritten(body: Iterable[bytes] | Iterable[str], rewriter: AliasRewriter) -> Iterator[bytes]:
    try:
        for chunk in body:
            out = rewriter.feed(chunk.encode() if isinstance(chunk, str) else chunk)
            if out:
                yield out
        tail = rewriter.flush()
        if tail:
            yield tail
    finally:  # the client left: close the inner stream (its on-close actions run)
        close: Any = getattr(body, "close", None)
        if close is not None:
            close()


def translate(response: Response) -> Response:
    """Public ids in place of the storage ids this request resolved."""
    found = g.get("thread_aliases")
    if not found:
        return response
    rewriter = AliasRewriter(found)
    if not rewriter:
        return response
    for header in ("Location", "Content-Location"):
        value = response.headers.get(header)
        if value:
            response.headers[header] = rewriter.rewrite(value.encode()).decode()
    if response.direct_passthrough or response.mimetype not in REWRITTEN_TYPES:
        return response
    if response.is_streamed:
        response.response = _rewritten(response.response, rewriter)
    else:
        response.set_data(rewriter.rewrite(response.get_data()))
    return response


def init_app(app: Flask) -> None:
    """Translate every response (after the error handlers made theirs)."""
    app.after_request(translate)
