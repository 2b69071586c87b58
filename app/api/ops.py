"""The ops view (ops role only): a JSON API, the live page at /ops, and Prometheus /metrics.

Flower sees Celery tasks but not leases, streams or runs; this view reads them
(shared/ops/collector.py says where each figure comes from). Cancel and requeue are
audited in Postgres (`ops_audit`) and listed at /ops/api/audit.

The page is plain HTML/JS/CSS from app/static (no build step). Opening it needs an ops key,
in the `x-api-key` header or, since a browser cannot set headers on a link, `?api_key=`;
the page then calls the JSON API with that key in the header.
"""

from __future__ import annotations

import atexit
import uuid
from dataclasses import dataclass

from flask import Blueprint, Response, current_app, request
from flask.blueprints import BlueprintSetupState
from psycopg.conninfo import make_conninfo
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from werkzeug.exceptions import Forbidden

from app.api.ui import page_response, static_response
from app.auth import authenticate_builtin, require_ops
from app.http import body, query, returns
from app.responses import json_response
from shared import logs, metrics
from shared.crons.store import CronStore
from shared.db import make_pool
from shared.errors import RunNotFound, ValidationFailed
from shared.ops.actions import OpsActions
from shared.ops.collector import OpsCollector
from shared.ops.connections import TRACKER, ConnectionReporter
from shared.ops.store import OpsStore
from shared.redis_keys import Keys
from shared.runs.manager import RunManager
from shared.runs.model import CancelAction, RunStatus
from shared.runs.store import RunStore
from shared.runs.taskqueue import Dispatcher, make_celery

bp = Blueprint("ops", __name__)
_STATIC_FILES = frozenset({"ops.js", "ops.css"})
OPS_POOL_MAX = 4


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpsRunsQuery(_Strict):
    """GET /ops/api/runs: no status = the inflight runs; `prefix` = the runs (any status)
    whose id starts with it (how the CLI resolves the short ids the page shows)."""

    status: RunStatus | None = None
    prefix: str | None = Field(default=None, min_length=1, max_length=36)
    limit: int = Field(default=100, ge=1, le=1000)


class OpsFailuresQuery(_Strict):
    """GET /ops/api/failures: runs ended error/timeout within `hours` (default: the
    health strip's window, THREADRUN_OPS_FAILURE_WINDOW_S)."""

    limit: int = Field(default=50, ge=1, le=500)
    hours: float | None = Field(default=None, gt=0, le=24 * 31)


class OpsAuditQuery(_Strict):
    """GET /ops/api/audit."""

    run_id: uuid.UUID | None = None
    limit: int = Field(default=100, ge=1, le=1000)


class OpsWorkerLossesQuery(_Strict):
    """GET /ops/api/worker-losses."""

    limit: int = Field(default=50, ge=1, le=500)


class OpsCronsQuery(_Strict):
    """GET /ops/api/crons: any user's crons, or `user_id`'s; `enabled` filters."""

    user_id: str | None = Field(default=None, min_length=1, max_length=200)
    enabled: bool | None = None
    limit: int = Field(default=100, ge=1, le=1000)


class OpsCancel(_Strict):
    """POST /ops/api/runs/<run_id>/cancel."""

    action: CancelAction = CancelAction.INTERRUPT


class OpsRequeue(_Strict):
    """POST /ops/api/runs/<run_id>/requeue."""

    reason: str = Field(default="stuck", min_length=1, max_length=500)


@dataclass
class OpsServices:
    """The ops view's parts in one web process."""

    collector: OpsCollector
    actions: OpsActions
    reporter: ConnectionReporter


def _init(state: BlueprintSetupState) -> None:
    """Configure metrics and logs, build the collector and start the connection reporter."""
    app = state.app
    svc = app.extensions["threadrun"]
    settings = svc.settings
    metrics.configure(settings)
    logs.configure(settings)
    # Actions wait at most ops_lock_timeout_s for a run row (see shared/ops/actions.py).
    timeout_ms = int(settings.ops_lock_timeout_s * 1000)
    dsn = make_conninfo(settings.dsn, options=f"-c lock_timeout={timeout_ms}")
    ops_settings = settings.model_copy(update={"database_url": SecretStr(dsn)})
    pool = make_pool(ops_settings, name="ops", max_size=OPS_POOL_MAX)
    store = OpsStore(pool)
    celery = make_celery(settings)
    dispatcher = Dispatcher.of(settings, svc.redis, celery)
    manager = RunManager(RunStore(pool), dispatcher, svc.redis, Keys(settings.redis_prefix))
    reporter = ConnectionReporter(
        svc.redis, Keys(settings.redis_prefix), TRACKER, settings.ops_report_s
    )
    # Started by the first request, so an app built only to be inspected (tests, scripts)
    # runs no background thread.
    app.before_request(reporter.start)
    atexit.register(reporter.stop)
    app.extensions["threadrun_ops"] = OpsServices(
        collector=OpsCollector(settings, store, svc.redis, celery),
        actions=OpsActions(settings, manager, store, dispatcher, svc.redis, CronStore(pool)),
        reporter=reporter,
    )


bp.record_once(_init)


def _ops() -> OpsServices:
    return current_app.extensions["threadrun_ops"]  # type: ignore[no-any-return]


# --- the page -------------------------------------------------------------------------------
@bp.get("/ops")
@bp.get("/ops/")
@returns("text/html")
def page() -> Response:
    """The live ops page (ops role; the key may come as `?api_key=`)."""
    who = authenticate_builtin(extra_key=request.args.get("api_key"))
    if not who.is_ops:
        raise Forbidden("this page needs the ops role")
    return page_response("ops.html", websockets=False)


@bp.get("/ops/static/<path:filename>")
@returns("*/*")  # ops.js or ops.css
def static_file(filename: str) -> Response:
    """ops.js and ops.css (they hold no data)."""
    return static_response(filename, _STATIC_FILES)


# --- the JSON API -----------------------------------------------------------------------------
def _uuid(value: str, name: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise ValidationFailed(f"{name}: not a UUID: {value[:64]!r}", field=name) from None


def _run_id(run_id: str) -> str:
    return _uuid(run_id, "run_id")


@bp.get("/ops/api/overview")
def overview() -> Response:
    """Everything the page shows, in one document."""
    require_ops()
    return json_response(_ops().collector.overview())


@bp.get("/ops/api/runs")
@query(OpsRunsQuery)
def runs(query: OpsRunsQuery) -> Response:
    """Runs with owner, epoch, lease time left and attempt (inflight unless `status`)."""
    require_ops()
    c = _ops().collector
    if query.prefix is not None:
        try:
            found = c.runs_by_prefix(query.prefix, limit=query.limit)
        except ValueError as exc:
            raise ValidationFailed(f"prefix: {exc}", field="prefix") from None
        if query.status is not None:
            found = [r for r in found if r["status"] == query.status]
        return json_response({"runs": found})
    return json_response(
        {"summary": c.runs_summary(), "runs": c.runs(status=query.status, limit=query.limit)}
    )


@bp.get("/ops/api/health")
def health() -> Response:
    """Is anything wrong? Tiles (workers per queue, stuck runs, failure rate, queue wait,
    crons, graphs), each `ok`/`warn`/`bad` with its reason, the verdict, and `graphs`:
    each graph's load state and error, as the runs workers found them at start-up."""
    require_ops()
    return json_response(_ops().collector.health())


@bp.get("/ops/api/failures")
@query(OpsFailuresQuery)
def failures(query: OpsFailuresQuery) -> Response:
    """Runs that ended `error` or `timeout` recently, latest first, with their error."""
    require_ops()
    c = _ops().collector
    window_s = query.hours * 3600 if query.hours is not None else c.settings.ops_failure_window_s
    return json_response({"window_s": window_s, "failures": c.failures(query.limit, window_s)})


@bp.get("/ops/api/runs/<run_id>")
def run(run_id: str) -> Response:
    """One run: lease, stream, audit."""
    require_ops()
    rid = _run_id(run_id)
    found = _ops().collector.run(rid)
    if found is None:
        raise RunNotFound(f"run {rid} not found")
    return json_response(found)


@bp.post("/ops/api/runs/<run_id>/cancel")
@body(OpsCancel, required=False)
def cancel(run_id: str, body: OpsCancel) -> Response:
    """Cancel any user's run; audited. 409 `locked` when the run row stays locked."""
    who = require_ops()
    rid = _run_id(run_id)
    res = _ops().actions.cancel(who.user_id, rid, body.action)
    doc = {"outcome": res.outcome, "ok": res.ok, "audit": res.audit}
    return json_response(doc, status=409 if res.outcome == "locked" else 200)


@bp.post("/ops/api/runs/<run_id>/requeue")
@body(OpsRequeue, required=False)
def requeue(run_id: str, body: OpsRequeue) -> Response:
    """Requeue a stuck run (expired lease, or pending and never dispatched); audited.
    409 when the run is not eligible (the audit records the refusal too)."""
    who = require_ops()
    rid = _run_id(run_id)
    res = _ops().actions.requeue(who.user_id, rid, body.reason)
    doc = {"outcome": res.outcome, "ok": res.ok, "audit": res.audit}
    return json_response(doc, status=200 if res.ok else 409)


@bp.get("/ops/api/crons")
@query(OpsCronsQuery)
def crons(query: OpsCronsQuery) -> Response:
    """Any user's crons, newest first, each with its last firing (`last_outcome`: a revoked
    owner's or a deleted assistant's cron reads `disabled`)."""
    require_ops()
    found = _ops().actions.crons(user_id=query.user_id, enabled=query.enabled, limit=query.limit)
    return json_response({"crons": found})


@bp.delete("/ops/api/crons/<cron_id>")
def delete_cron(cron_id: str) -> Response:
    """Delete any user's cron (a revoked user cannot delete theirs); audited. 404 when
    there is none."""
    who = require_ops()
    res = _ops().actions.delete_cron(who.user_id, _uuid(cron_id, "cron_id"))
    return json_response({"outcome": res.outcome, "ok": res.ok, "audit": res.audit})


@bp.get("/ops/api/audit")
@query(OpsAuditQuery)
def audit(query: OpsAuditQuery) -> Response:
    """Ops actions, newest first."""
    require_ops()
    rid = str(query.run_id) if query.run_id else None
    return json_response({"audit": _ops().actions.list_audit(run_id=rid, limit=query.limit)})


@bp.get("/ops/api/queues")
def queues() -> Response:
    """Depth and oldest age of the runs and memory queues."""
    require_ops()
    return json_response(_ops().collector.queues())


@bp.get("/ops/api/workers")
def workers() -> Response:
    """Workers answering a Celery inspect broadcast, with their queues, active runs and
    finished-run counts per terminal status."""
    require_ops()
    c = _ops().collector
    ws = c.workers()
    return json_response({"workers": ws, "online": c.workers_online(ws)})


@bp.get("/ops/api/supervisors")
def supervisors() -> Response:
    """`make run` supervisors (one per host) and their children: each one's state
    (`running`, `restarting` with `restart_in_s`, `crash_loop`: given up on, down until
    the supervisor restarts), pid, restarts and how it last exited. Empty where no
    supervisor runs (a deployment's own process manager)."""
    require_ops()
    return json_response({"supervisors": _ops().collector.supervisors()})


@bp.get("/ops/api/worker-losses")
@query(OpsWorkerLossesQuery)
def worker_losses(query: OpsWorkerLossesQuery) -> Response:
    """Lost workers, latest first (kept THREADRUN_OPS_WORKER_HISTORY_S): when the loss was
    first seen, the worker, how (`not answering`: gone from the worker broadcast while runs
    named it their owner; `leases expired`: the reaper found its runs' leases gone), the
    runs it held with their status now, and the runs it had finished."""
    require_ops()
    c = _ops().collector
    return json_response(
        {
            "losses": c.worker_losses(query.limit),
            "retention_s": c.settings.ops_worker_history_s,
        }
    )


@bp.get("/ops/api/streams")
def streams() -> Response:
    """Streams of inflight runs and of runs with subscribers: length and subscribers."""
    require_ops()
    c = _ops().collector
    conns = c.connections()
    ids = [r["run_id"] for r in c.runs()]
    ids += [r for r in conns["subscribers"] if r not in ids]
    return json_response({"streams": c.streams(ids, conns["subscribers"]), "connections": conns})


@bp.get("/metrics")
@returns("text/plain")  # the Prometheus exposition format
def metrics_endpoint() -> Response:
    """Prometheus exposition: this host's counters + gauges computed now (any process agrees)."""
    if current_app.extensions["threadrun"].settings.metrics_require_ops:
        require_ops()
    body = metrics.render(metrics.OpsGauges(_ops().collector.figures))
    return Response(body, mimetype=None, content_type=metrics.CONTENT_TYPE)
