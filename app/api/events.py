"""Audit trail over HTTP (J4, G1): run events, a thread's message pages, token usage, receipts.

Every endpoint checks ownership first (A4); the live stream is never consulted here.
"""

from __future__ import annotations

from typing import Any, Literal

from flask import Blueprint, Response, request
from pydantic import Field

from app.api.threads import owned_thread
from app.auth import principal
from app.http import query
from app.ids import checked_run_id
from app.responses import json_response
from app.schemas import Strict
from app.services import current_services
from shared.errors import NotFound, ValidationFailed
from shared.journal import Category, EventPage, parse_thread_cursor

bp = Blueprint("events", __name__)
CATEGORIES = {c.value for c in Category}


class RunEventsQuery(Strict):
    """GET …/runs/{run_id}/events."""

    after_seq: int | None = Field(default=None, ge=0)
    before_seq: int | None = Field(default=None, ge=1)
    category: list[str] | None = None
    limit: int | None = Field(default=None, ge=1)
    direction: Literal["forward", "backward"] | None = None


class ThreadEventsQuery(Strict):
    """GET /threads/{id}/events and /messages/page (cursors are "<run_seq>:<seq>")."""

    after: str | None = None
    before: str | None = None
    category: list[str] | None = None
    limit: int | None = Field(default=None, ge=1)
    direction: Literal["forward", "backward"] | None = None


def _event_args() -> dict[str, Any]:
    """The query string, `category` repeated or comma-separated, unknown ones refused."""
    args: dict[str, Any] = {k: v for k, v in request.args.items() if v != ""}
    cats = [c for c in request.args.getlist("category") for c in c.split(",") if c]
    args.pop("category", None)
    if cats:
        unknown = sorted(set(cats) - CATEGORIES)
        if unknown:
            raise ValidationFailed(
                f"category: unknown {', '.join(unknown)}; known: {', '.join(sorted(CATEGORIES))}",
                field="category",
            )
        args["category"] = cats
    return args


def _page(page: EventPage) -> dict[str, Any]:
    return {
        "events": [e.to_json() for e in page.events],
        "has_more": page.has_more,
        "first": page.first,
        "last": page.last,
    }


@bp.get("/threads/<thread_id>/runs/<run_id>/events")
@query(RunEventsQuery, args=_event_args)
def run_events(thread_id: str, run_id: str, query: RunEventsQuery) -> Response:
    """A page of one run's audit events (seq cursor, category filter)."""
    thread = owned_thread(thread_id)
    svc = current_services()
    rid = checked_run_id(run_id)
    svc.store.get_run(thread.thread_id, rid, principal().user_id)
    try:
        page = svc.events.list_run_events(
            rid,
            after_seq=query.after_seq,
            before_seq=query.before_seq,
            categories=query.category,
            limit=query.limit,
            direction=query.direction,
        )
    except ValueError as exc:
        raise ValidationFailed(str(exc), field="limit") from exc
    return json_response(_page(page))


def _thread_page(thread_id: str, q: ThreadEventsQuery, categories: list[str] | None) -> Response:
    thread = owned_thread(thread_id)
    try:
        after = parse_thread_cursor(q.after) if q.after else None
        before = parse_thread_cursor(q.before) if q.before else None
        page = current_services().events.list_thread_events(
            thread.thread_id,
            after=after,
            before=before,
            categories=categories,
            limit=q.limit,
            direction=q.direction,
        )
    except ValueError as exc:
        raise ValidationFailed(str(exc), field="after" if q.after else "before") from exc
    return json_response(_page(page))


@bp.get("/threads/<thread_id>/events")
@query(ThreadEventsQuery, args=_event_args)
def thread_events(thread_id: str, query: ThreadEventsQuery) -> Response:
    """A page of the thread's audit events, in run order then seq."""
    return _thread_page(thread_id, query, query.category)


@bp.get("/threads/<thread_id>/messages/page")
@query(ThreadEventsQuery, args=_event_args)
def message_page(thread_id: str, query: ThreadEventsQuery) -> Response:
    """A page of the thread's message events (the transcript as the journal recorded it)."""
    return _thread_page(thread_id, query, ["message"])


@bp.get("/threads/<thread_id>/token-usage")
def token_usage(thread_id: str) -> Response:
    """Token usage of the thread: total, by tag, by run (J2)."""
    thread = owned_thread(thread_id)
    tid = thread.thread_id
    return json_response({"thread_id": tid, **current_services().events.thread_usage(tid)})


@bp.get("/threads/<thread_id>/runs/<run_id>/delivery")
def delivery(thread_id: str, run_id: str) -> Response:
    """The run's delivery receipt (J5), latest attempt unless `attempt` is given."""
    thread = owned_thread(thread_id)
    svc = current_services()
    rid = checked_run_id(run_id)
    svc.store.get_run(thread.thread_id, rid, principal().user_id)
    attempt = request.args.get("attempt")
    if attempt is not None and not attempt.isdigit():
        raise ValidationFailed("attempt: must be a positive integer", field="attempt")
    receipt = svc.events.get_receipt(rid, int(attempt) if attempt else None)
    if receipt is None:
        raise NotFound(f"run {rid} has no delivery receipt")
    return json_response(receipt.to_json())
