"""GET /threads/{thread_id}/stream: follow a thread, the events of every run on it as they
start (the SDK's `threads.join_stream`). The walk and the ids are in
shared/bridge/thread_follow.py; this is the HTTP edge: ownership, query, SSE."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from flask import Blueprint, Response, request, stream_with_context

from app.auth import principal
from app.http import checked_thread_id, validate
from app.schemas import ThreadStreamQuery
from app.services import current_services
from app.streaming.sse import sse_body
from shared.bridge.base import Event
from shared.bridge.thread_follow import keeps

bp = Blueprint("thread_stream", __name__)


def _modes() -> list[str]:
    """`stream_mode` (the SDK, repeated) and `stream_modes` (the official server's name,
    comma-separated); empties are absent (the SDK sends `stream_mode=` for none)."""
    modes = [m for m in request.args.getlist("stream_mode") if m]
    for value in request.args.getlist("stream_modes"):
        modes.extend(m.strip() for m in value.split(",") if m.strip())
    return modes


@bp.get("/threads/<thread_id>/stream")
def join(thread_id: str) -> Response:
    """Follow the thread until the client leaves (or the thread is deleted); `Last-Event-ID`
    resumes exactly after that event, across runs."""
    args: dict[str, Any] = {
        k: v
        for k, v in request.args.items()
        if v != "" and k not in ("stream_mode", "stream_modes")
    }
    modes = _modes()
    if modes:
        args["stream_mode"] = modes
    q = validate(ThreadStreamQuery, args)
    svc = current_services()
    tid = checked_thread_id(thread_id)
    svc.store.get_thread(tid, principal().user_id)  # 404 for a missing or another user's thread
    start = svc.follower.check(tid, request.headers.get("Last-Event-ID") or q.last_event_id)
    wanted = set(q.stream_mode or ())

    def keep(event: Event) -> bool:
        return keeps(wanted, event)

    body = sse_body(svc.follower.follow(tid, start), keep=keep)
    # The SDK reconnects to Location (with the last id) when the connection drops; it sends
    # no query string then, so the modes travel in it.
    location = f"/threads/{tid}/stream"
    if q.stream_mode:
        location += "?" + urlencode([("stream_mode", m) for m in q.stream_mode])
    headers = {"Location": location, "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return Response(stream_with_context(body), mimetype="text/event-stream", headers=headers)
