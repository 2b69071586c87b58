"""Crons: create on a thread or without one, search, count, update, delete.

Each body's run fields are validated by `CronPayload` (RunCreate) now, so a bad payload is a
4xx naming the field at create time, never a failure at firing time. Owner-scoped like
threads: another user's cron id answers exactly like a missing one.
"""

from __future__ import annotations

import datetime as dt

from flask import Blueprint, Response

from app import public_ids
from app.auth import principal
from app.errors import LimitExceeded
from app.http import answers, body, validate
from app.ids import canonical_id
from app.limits import run_sized
from app.responses import json_response
from app.schemas import CronCount, CronCreate, CronPayload, CronSearch, CronUpdate
from app.services import current_services
from shared.crons.model import CronNotFound, CronPatch, CronSpec, TooManyCrons
from shared.errors import ValidationFailed
from shared.runs.model import OnCompletion

bp = Blueprint("crons", __name__)


def _checked_cron_id(cron_id: str) -> str:
    """A cron id that is not a UUID cannot exist: 404, exactly like a missing one."""
    return canonical_id(cron_id, lambda m: CronNotFound(f"cron {m}"))


def _create(thread_id: str | None, body: CronCreate) -> Response:
    if thread_id is not None and body.on_run_completed is not None:
        raise ValidationFailed(
            "on_run_completed: only for a cron without a thread (POST /runs/crons); the runs"
            " of a thread's cron stay on that thread",
            field="on_run_completed",
        )
    on_completed = None if thread_id else (body.on_run_completed or OnCompletion.DELETE)
    payload = body.payload()
    spec = CronSpec(
        assistant_id=body.assistant_id,
        schedule=body.schedule,
        request=body.to_cron_request(on_completed),
        payload=payload,
        thread_id=thread_id,
        timezone=body.timezone,
        metadata=body.metadata,
        enabled=body.enabled,
        end_time=body.end_time,
        on_run_completed=on_completed,
    )
    owner = principal().user_id
    svc = current_services()
    if thread_id is not None:
        svc.store.get_thread(thread_id, owner)  # 404 for a missing or another user's thread
    try:
        cron = svc.crons.create(owner, spec)
    except TooManyCrons as exc:
        raise LimitExceeded("cron_max_per_user", str(exc), retry_after=60) from exc
    return json_response(cron.as_json())


# A cron's body holds a run's fields: sized as a run's are (422 naming the field).
@bp.post("/threads/<thread_id>/runs/crons")
@run_sized
@body(CronCreate)
def create_for_thread(thread_id: str, body: CronCreate) -> Response:
    """A cron whose every firing is a run on this thread."""
    return _create(public_ids.resolve(thread_id), body)


@bp.post("/runs/crons")
@run_sized
@body(CronCreate)
def create(body: CronCreate) -> Response:
    """A cron whose every firing runs on a new thread (`on_run_completed`: delete | keep)."""
    return _create(None, body)


@bp.patch("/runs/crons/<cron_id>")
@run_sized
@body(CronUpdate)
def patch(cron_id: str, body: CronUpdate) -> Response:
    """Change the schedule, timezone, end_time, enabled or the run payload."""
    owner = principal().user_id
    svc = current_services()
    cid = _checked_cron_id(cron_id)
    cron = svc.crons.get(owner, cid)
    if cron.thread_id is not None and body.on_run_completed is not None:
        raise ValidationFailed(
            "on_run_completed: only for a cron without a thread", field="on_run_completed"
        )
    changes = body.payload_changes()
    on_completed = body.on_run_completed or cron.on_run_completed
    payload = request_obj = None
    if changes or body.on_run_completed is not None:
        merged = validate(CronPayload, {**cron.payload, **changes})
        payload = merged.payload()
        request_obj = merged.to_cron_request(on_completed)
    result = svc.crons.patch(
        owner,
        cid,
        CronPatch(
            given=frozenset(body.model_fields_set),
            schedule=body.schedule,
            timezone=body.timezone,
            end_time=body.end_time,
            enabled=body.enabled,
            on_run_completed=body.on_run_completed,
            payload=payload,
            request=request_obj,
            metadata=body.metadata,
        ),
    )
    return json_response(result.as_json())


@bp.delete("/runs/crons/<cron_id>")
@answers(204, "deleted")
def delete(cron_id: str) -> Response:
    """Delete the cron; it fires no more."""
    current_services().crons.delete(principal().user_id, _checked_cron_id(cron_id))
    return Response(status=204)


@bp.post("/runs/crons/search")
@body(CronSearch, required=False)
def search(body: CronSearch) -> Response:
    """The caller's crons, filtered and sorted."""
    crons = current_services().crons.search(
        principal().user_id,
        assistant_id=body.assistant_id,
        thread_id=public_ids.resolve(str(body.thread_id)) if body.thread_id else None,
        enabled=body.enabled,
        metadata=body.metadata,
        limit=body.limit,
        offset=body.offset,
        sort_by=body.sort_by,
        sort_order=body.sort_order,
    )
    now = dt.datetime.now(dt.UTC)
    objects = [{**c.as_json(), "now": now} for c in crons]
    if body.select is None:
        return json_response([{k: v for k, v in o.items() if k != "now"} for o in objects])
    return json_response([{k: v for k, v in o.items() if k in body.select} for o in objects])


@bp.post("/runs/crons/count")
@body(CronCount, required=False)
def count(body: CronCount) -> Response:
    """How many of the caller's crons match."""
    n = current_services().crons.count(
        principal().user_id,
        assistant_id=body.assistant_id,
        thread_id=public_ids.resolve(str(body.thread_id)) if body.thread_id else None,
        enabled=body.enabled,
        metadata=body.metadata,
    )
    return json_response(n)
