"""Crons: create on a thread or without one, search, count, update, delete.

Each body's run fields are validated by `CronPayload` (RunCreate) now, so a bad payload is a
4xx naming the field at create time, never a failure at firing time. Owner-scoped like
threads: another user's cron id answers exactly like a missing one.

Under the project's auth (`auth.path`) every route asks `crons.<action>`: a filter narrows
search and count and hides a cron it leaves out (404); the handler's edited metadata is
stored; each firing runs as the user who made (or last changed) the cron, under that
user's limits (app/admission.py `with_caller`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from flask import Blueprint, Response

from app import authz, public_ids
from app.admission import with_caller
from app.auth import principal
from app.errors import LimitExceeded
from app.http import answers, body, validate
from app.ids import canonical_id
from app.limits import run_sized
from app.responses import json_response
from app.schemas import CronCount, CronCreate, CronPayload, CronSearch, CronUpdate
from app.services import current_services
from shared.crons.model import Cron, CronNotFound, CronPatch, CronSpec, TooManyCrons
from shared.errors import ValidationFailed
from shared.runs.model import OnCompletion

bp = Blueprint("crons", __name__)


def _checked_cron_id(cron_id: str) -> str:
    """A cron id that is not a UUID cannot exist: 404, exactly like a missing one."""
    return canonical_id(cron_id, lambda m: CronNotFound(f"cron {m}"))


def visible_cron(cron_id: str, action: str = "read", value: dict[str, Any] | None = None) -> Cron:
    """The caller's cron (`crons.<action>`, its filter on the cron's metadata), else 404."""
    cid = _checked_cron_id(cron_id)
    decision = authz.authorize("crons", action, {"cron_id": cid, **(value or {})})
    cron = current_services().crons.get(principal().user_id, cid)
    authz.require_visible(decision, cron.metadata, CronNotFound(f"cron {cid}"))
    return cron


def _create(thread_id: str | None, body: CronCreate) -> Response:
    if thread_id is not None and body.on_run_completed is not None:
        raise ValidationFailed(
            "on_run_completed: only for a cron without a thread (POST /runs/crons); the runs"
            " of a thread's cron stay on that thread",
            field="on_run_completed",
        )
    on_completed = None if thread_id else (body.on_run_completed or OnCompletion.DELETE)
    payload = body.payload()
    metadata = body.metadata
    decision = authz.authorize(
        "crons",
        "create",
        {
            "payload": payload,
            "schedule": body.schedule,
            "cron_id": None,
            "thread_id": public_ids.public_of(thread_id) if thread_id else None,
            "user_id": principal().subject,
            "end_time": body.end_time,
            "metadata": dict(metadata),
        },
    )
    if decision is not None:
        metadata = decision.value.get("metadata") or {}
    spec = CronSpec(
        assistant_id=body.assistant_id,
        schedule=body.schedule,
        request=with_caller(body.to_cron_request(on_completed)),
        payload=payload,
        thread_id=thread_id,
        timezone=body.timezone,
        metadata=metadata,
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
    return _create(public_ids.resolve(thread_id, None), body)  # crons.create decides


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
    cron = visible_cron(cron_id, "update", {"schedule": body.schedule})
    cid = cron.cron_id
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
        request_obj = with_caller(merged.to_cron_request(on_completed))
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
    cid = visible_cron(cron_id, "delete").cron_id if authz.active() else _checked_cron_id(cron_id)
    current_services().crons.delete(principal().user_id, cid)
    return Response(status=204)


@bp.post("/runs/crons/search")
@body(CronSearch, required=False)
def search(body: CronSearch) -> Response:
    """The caller's crons, filtered and sorted."""
    decision = authz.authorize(
        "crons",
        "search",
        {
            "assistant_id": body.assistant_id,
            "thread_id": str(body.thread_id) if body.thread_id else None,
            "limit": body.limit,
            "offset": body.offset,
        },
    )
    crons = current_services().crons.search(
        principal().user_id,
        assistant_id=body.assistant_id,
        thread_id=public_ids.resolve(str(body.thread_id), None) if body.thread_id else None,
        enabled=body.enabled,
        metadata=authz.narrowed(decision, body.metadata),
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
    decision = authz.authorize(
        "crons",
        "search",
        {
            "assistant_id": body.assistant_id,
            "thread_id": str(body.thread_id) if body.thread_id else None,
        },
    )
    n = current_services().crons.count(
        principal().user_id,
        assistant_id=body.assistant_id,
        thread_id=public_ids.resolve(str(body.thread_id), None) if body.thread_id else None,
        enabled=body.enabled,
        metadata=authz.narrowed(decision, body.metadata),
    )
    return json_response(n)
