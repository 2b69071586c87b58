"""GET /threads/{thread_id}/stream: follow a thread, the events of every run on it as they
start (the SDK's `threads.join_stream`). The walk and the ids are in
shared/bridge/thread_follow.py; this is the HTTP edge: ownership, query, SSE."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from flask import Blueprint, Response, request, stream_with_context

from app import public_ids
from app.auth import principal
from app.http import query, streams_events
from app.schemas import ThreadStreamQuery
from app.services import current_services
from app.streaming.sse import sse_body
from shared.bridge.base import Event
from shared.bridge.thread_follow import keeps

bp = Blueprint("thread_stream", __name__)


def _args() -> dict[str, Any]:
    """The query string: `stream_mode` (the SDK, repeated) and `stream_modes` (the official
    server's name, comma-separated) as one `stream_mode` list; empties are absent (the SDK
    sends `stream_mode=` for none)."""
    args: dict[str, Any] = {
        k: v
        for k, v in request.args.items()
        if v != "" and k not in ("stream_mode", "stream_modes")
    }
    modes = _modes()
    if modes:
        args["stream_mode"] = modes
    return args


def _modes() -> list[str]:
    """`stream_mode` (the SDK, repeated) and `stream_modes` (the official server's name,
    comma-separated); empties are absent (the SDK sends `stream_mode=` for none)."""
    modes = [m for m in request.args.getlist("stream_mode") if m]
    for value in request.args.getlist("stream_modes"):
        modes.extend(m.strip() for m in value.split(",") if m.strip())
    return modes


@bp.get("/threads/<thread_id>/stream")
@streams_events
@query(ThreadStreamQuery, args=_args)
def join(thread_id: str, query: ThreadStreamQuery) -> Response:
    """Follow the thread until the client leaves (or the thread is deleted); `Last-Event-ID`
    resumes exactly after that event, across runs."""
    svc = current_services()
    tid = public_ids.resolve(thread_id)
    svc.store.get_thread(tid, principal().user_id)  # 404 for a missing or another user's thread
    start = svc.follower.check(tid, request.headers.get("Last-Event-ID") or query.last_event_id)
    wanted = set(query.stream_mode or ())

    def keep(event: Event) -> bool:
        return keeps(wanted, event)

    body = sse_body(svc.follower.follow(tid, start), keep=keep)
    # The SDK reconnects to Location (with the last id) when the connection drops; it sends
    # no query string then, so the modes travel in it.
    location = f"/threads/{tid}/stream"
    if query.stream_mode:
        location += "?" + urlencode([("stream_mode", m) for m in query.stream_mode])
    headers = {"Location": location, "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return Response(stream_with_context(body), mimetype="text/event-stream", headers=headers)
