"""The error hierarchy and the one table that maps errors to HTTP (app/errors.py).

Every error class the project defines descends from `ThreadrunError` (the HTTP client's
family is its own root, see shared/errors.py); `REPLIES` answers each with the status and
body the API has always given, which the e2e tests check end to end.
"""

from __future__ import annotations

import ast
from pathlib import Path

import psycopg
import psycopg_pool
import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.exceptions import Forbidden, HTTPException
from werkzeug.exceptions import NotFound as HTTPNotFound

from app import create_app
from app.errors import REPLIES, Reply, register, reply_for, unavailable_service
from app.limits import LimitExceeded
from shared.agent.graphs import GraphConfigError, GraphNotFound
from shared.agent.middleware.summarization import NothingToCompact, SummaryFailed
from shared.auth.tokens import InvalidToken
from shared.errors import (
    AssistantNotFound,
    ConfigError,
    LeaseLost,
    RunNotFound,
    StoreError,
    StreamCursorInvalid,
    ThreadBusy,
    ThreadrunError,
    ValidationFailed,
)
from shared.memory.extraction import ExtractionFailed
from shared.settings import Settings
from shared.state.modes import CheckpointModeMismatch, CheckpointModeRecordMismatch
from shared.state.reducers import InvalidStateUpdate
from shared.tools.devservices import DevServicesError, free_port
from tests.unit.sources import parse

ROOT = Path(__file__).resolve().parents[2]
BUILTIN_BASES = {
    "Exception",
    "BaseException",
    "KeyError",
    "LookupError",
    "ValueError",
    "TypeError",
    "RuntimeError",
    "OSError",
}
# The server's one root. The client package (clients/python, import name `threadrun`) has
# its own, `ThreadrunClientError`: it never imports the server, so it cannot share this one.
OWN_ROOTS = {("shared/errors.py", "ThreadrunError")}


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _outside_the_root() -> list[str]:
    """Classes whose every base is a builtin exception (they start a hierarchy of their own)."""
    found = []
    for top in ("app", "shared", "workers"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(parse(path, rel)):
                if not isinstance(node, ast.ClassDef) or not node.bases:
                    continue
                bases = {_base_name(b) for b in node.bases}
                if bases <= BUILTIN_BASES and (rel, node.name) not in OWN_ROOTS:
                    found.append(f"{rel}: class {node.name}({', '.join(sorted(bases))})")
    return found


def test_every_error_class_descends_from_the_root() -> None:
    """No error class starts a hierarchy of its own: subclass ThreadrunError or a kind."""
    assert _outside_the_root() == []


def test_errors_keep_their_builtin_bases_where_callers_catch_them() -> None:
    """Joining the root keeps what `except KeyError` / `except RuntimeError` relied on."""
    assert issubclass(GraphNotFound, KeyError) and issubclass(GraphNotFound, AssistantNotFound)
    assert issubclass(CheckpointModeRecordMismatch, RuntimeError)
    assert issubclass(DevServicesError, RuntimeError)
    for cls in (GraphConfigError, CheckpointModeRecordMismatch, DevServicesError):
        assert issubclass(cls, ConfigError)
    for cls in (LimitExceeded, InvalidToken, SummaryFailed, ExtractionFailed):
        assert issubclass(cls, ThreadrunError)
    assert str(GraphNotFound("g")) == "no graph or assistant 'g' is registered"


def body(code: str, message: str, field: str | None = None) -> dict[str, object]:
    out: dict[str, object] = {"error": code, "message": message, "detail": message}
    if field:
        out["field"] = field
    return out


CASES: list[tuple[Exception, Reply]] = [
    (ValidationFailed("x: bad", field="x"), Reply(422, body("invalid_request", "x: bad", "x"))),
    (
        ValidationFailed("not JSON", field="body", status=400),
        Reply(400, body("invalid_request", "not JSON", "body")),
    ),
    (
        InvalidStateUpdate("values: bad", field="values"),
        Reply(422, body("invalid_state_update", "values: bad", "values")),
    ),
    (
        StreamCursorInvalid("bad id"),
        Reply(400, body("invalid_last_event_id", "bad id", "Last-Event-ID")),
    ),
    (RunNotFound("run r not found"), Reply(404, body("not_found", "run r not found"))),
    (
        GraphNotFound("g"),
        Reply(404, body("not_found", "no graph or assistant 'g' is registered")),
    ),
    (ThreadBusy("busy"), Reply(409, body("thread_busy", "busy"))),
    (NothingToCompact("nothing"), Reply(409, body("nothing_to_compact", "nothing"))),
    (CheckpointModeMismatch("delta"), Reply(409, body("checkpoint_mode_mismatch", "delta"))),
    (LeaseLost("lost"), Reply(409, body("lease_lost", "lost"))),
    (SummaryFailed("down"), Reply(502, body("summary_failed", "down"))),
    (ExtractionFailed("bad JSON"), Reply(502, body("memory_extraction_failed", "bad JSON"))),
    (StoreError("db down"), Reply(500, body("store_error", "db down"))),
    (GraphConfigError("/etc/graphs.json"), Reply(500, body("internal_error", "internal error"))),
    (KeyError("k"), Reply(500, body("internal_error", "internal error"))),
    (
        psycopg.errors.NumericValueOutOfRange("x"),
        Reply(422, body("invalid_request", "a value is out of range or cannot be stored")),
    ),
    (Forbidden("ops only"), Reply(403, body("forbidden", "ops only"))),
    *[
        (
            exc,
            Reply(
                503,
                body(
                    "service_unavailable",
                    f"{svc} is unavailable to this server; retry in a few seconds",
                ),
                {"Retry-After": "5"},
            ),
        )
        for exc, svc in [
            (redis.ConnectionError("Error 111 connecting to 10.0.0.1:6379"), "Redis"),
            (redis.TimeoutError("Timeout reading from socket"), "Redis"),
            (redis.exceptions.BusyLoadingError("loading"), "Redis"),
            (psycopg.OperationalError("connection failed"), "PostgreSQL"),
            (psycopg_pool.PoolTimeout("couldn't get a connection after 5.00 sec"), "PostgreSQL"),
            (psycopg.errors.AdminShutdown("terminating connection"), "PostgreSQL"),
        ]
    ],
    (
        LimitExceeded("runs_per_minute", "slow down", retry_after=3),
        Reply(
            429,
            {**body("limit_exceeded", "slow down"), "limit": "runs_per_minute", "retry_after": 3},
            {"Retry-After": "3"},
        ),
    ),
    (
        LimitExceeded("max_input_bytes", "too big", status=422, field="input"),
        Reply(422, {**body("limit_exceeded", "too big", "input"), "limit": "max_input_bytes"}),
    ),
]


@pytest.mark.parametrize("exc,reply", CASES, ids=[type(e).__name__ for e, _ in CASES])
def test_the_table_answers_each_error(exc: Exception, reply: Reply) -> None:
    """Each error's status, body and headers, by the most specific row of its class."""
    assert reply_for(exc) == reply


def test_flask_dispatches_every_error_through_the_table() -> None:
    """Registered on an app, the table answers raised errors and werkzeug's own 404/405."""
    app = Flask(__name__)
    register(app)

    @app.get("/raise/<kind>")
    def _raise(kind: str) -> str:
        raise {
            "limit": LimitExceeded("runs_per_minute", "slow down", retry_after=2),
            "missing": RunNotFound("run r not found"),
            "unexpected": ZeroDivisionError("x"),
        }[kind]

    client = app.test_client()
    res = client.get("/raise/limit")
    assert res.status_code == 429 and res.headers["Retry-After"] == "2"
    assert res.json == {
        **body("limit_exceeded", "slow down"),
        "limit": "runs_per_minute",
        "retry_after": 2,
    }
    res = client.get("/raise/missing")
    assert res.status_code == 404 and res.json == body("not_found", "run r not found")
    res = client.get("/raise/unexpected")
    assert res.status_code == 500 and res.json == body("internal_error", "internal error")
    res = client.get("/nowhere")
    assert res.status_code == 404 and res.json is not None and res.json["error"] == "not_found"
    res = client.post("/raise/limit")
    assert res.status_code == 405 and res.json is not None
    assert res.json["error"] == "method_not_allowed"
    assert HTTPException in REPLIES and HTTPNotFound not in REPLIES  # werkzeug's: one row


def test_a1_web_without_redis_answers_503_with_retry_after(settings: Settings) -> None:
    """A web process that cannot reach Redis answers a stream request 503
    `service_unavailable` naming Redis, with Retry-After (the connection limiter's call
    fails first), not a 500 `internal_error`; PostgreSQL-only endpoints still answer."""
    dead = f"redis://127.0.0.1:{free_port()}/0"
    app = create_app(
        Settings(
            database_url=settings.database_url,
            redis_url=dead,
            redis_prefix=settings.redis_prefix,
            data_dir=settings.data_dir,
            api_keys="key-a:alice",
        )
    )
    # The first request starts the ops connection reporter; stop it with the test, or it
    # retries the dead Redis in the background for the rest of the session.
    reporter = app.extensions["threadrun_ops"].reporter
    try:
        _answers_503_without_redis(app.test_client())
    finally:
        reporter.halt()


def _answers_503_without_redis(client: FlaskClient) -> None:
    headers = {"x-api-key": "key-a"}
    res = client.post("/threads", headers=headers, json={})
    assert res.status_code == 200, res.json
    tid = res.json["thread_id"]
    body_ = {"assistant_id": "lead_agent", "input": {"messages": []}}
    res = client.post(f"/threads/{tid}/runs/stream", headers=headers, json=body_)
    assert res.status_code == 503, res.data
    assert res.headers["Retry-After"] == "5"
    assert res.json is not None and res.json["error"] == "service_unavailable"
    assert "Redis" in res.json["message"]


def test_a2_a1_unreachable_services_are_named_for_the_websocket_frame_and_the_503() -> None:
    """The WebSocket `service_unavailable` frame and the HTTP 503 name the same service for
    every error that means it is unreachable; any other error names none."""
    for exc, service in [
        (redis.ConnectionError("refused"), "redis"),
        (redis.TimeoutError("slow"), "redis"),
        (psycopg.OperationalError("no connection"), "postgres"),
        (psycopg_pool.PoolTimeout("pool exhausted"), "postgres"),
        (redis.ResponseError("WRONGTYPE"), None),
        (ValueError("bad"), None),
    ]:
        assert unavailable_service(exc) == service, exc
        if service is not None:
            reply = reply_for(exc)
            assert reply.status == 503 and reply.headers == {"Retry-After": "5"}
            assert {"redis": "Redis", "postgres": "PostgreSQL"}[service] in str(reply.body)
