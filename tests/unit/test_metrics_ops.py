"""The pieces of the ops view that need no server: JSON logs and the connection tracker."""

from __future__ import annotations

import asyncio
import io
import json
import logging

from shared import logs
from shared.ops.connections import SUB_PREFIX, ConnectionTracker


def _json_logger(stream: io.StringIO) -> logging.Logger:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.json_formatter())
    handler.addFilter(logs.ContextFilter())
    logger = logging.getLogger(f"test-json-{id(stream)}")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_json_lines_carry_bound_run_identities() -> None:
    """One JSON object per line, with the fields bound in the context; `extra` wins."""
    out = io.StringIO()
    log = _json_logger(out)
    with logs.bound(thread_id="t1", run_id="r1", attempt=2, worker_id="w:1"):
        log.info("claimed")
        log.info("override", extra={"run_id": "r2"})
    log.info("outside")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["message"] == "claimed" and lines[0]["level"] == "INFO"
    assert {k: lines[0][k] for k in ("thread_id", "run_id", "attempt", "worker_id")} == {
        "thread_id": "t1",
        "run_id": "r1",
        "attempt": 2,
        "worker_id": "w:1",
    }
    assert lines[1]["run_id"] == "r2"
    assert "run_id" not in lines[2] and {"time", "logger"} <= set(lines[2])


def test_bound_fields_follow_each_asyncio_task() -> None:
    """Each run's task keeps its own identities (the executor binds per run)."""
    out = io.StringIO()
    log = _json_logger(out)

    async def run(run_id: str) -> None:
        logs.bind(run_id=run_id)
        await asyncio.sleep(0)
        log.info("step")

    async def main() -> None:
        await asyncio.gather(run("a"), run("b"))

    asyncio.run(main())
    assert sorted(json.loads(x)["run_id"] for x in out.getvalue().splitlines()) == ["a", "b"]
    assert logs.current() == {}


def test_tracker_counts_connections_and_subscribers() -> None:
    """Opens and closes by transport and run; nothing negative is left behind."""
    t = ConnectionTracker()
    a = t.open("sse", "run-1")
    b = t.open("ws")
    c = t.open(None, "run-1")
    assert t.snapshot() == {"sse": 1, "ws": 1, SUB_PREFIX + "run-1": 2}
    for ticket in (a, b, c):
        t.close(ticket)
    assert t.snapshot() == {}


def test_task_events_follow_the_setting() -> None:
    """Task events (worker and sent) always on by setting; off by default (Flower turns the
    workers' on while it runs: tests/e2e/test_ops.py)."""
    from shared.runs.taskqueue import make_celery
    from shared.settings import Settings

    on = make_celery(Settings(redis_prefix="t:", task_events=True))
    assert on.conf.worker_send_task_events and on.conf.task_send_sent_event
    off = make_celery(Settings(redis_prefix="t:"))
    assert not off.conf.worker_send_task_events and not off.conf.task_send_sent_event
    assert {q.name for q in on.conf.task_queues} == {
        "runs",
        "runs.background",
        "memory",
        "webhooks",
    }
    # What a worker decides, as Celery's WorkController does (`either`, the command line's
    # `-E` first): our workers pass no `-E`, so the setting decides for them too.
    for app, want in ((on, True), (off, False)):
        assert bool(app.either("worker_send_task_events", None)) is want
    assert app.either("worker_send_task_events", True)  # what `-E` would have forced


def test_flower_spec_keeps_the_password_out_of_argv() -> None:
    """`--flower` / `make flower`: Flower on flower_port; basic auth only through the env."""
    from pydantic import SecretStr

    from shared.settings import Settings
    from shared.tools.supervisor import flower_env, flower_spec

    s = Settings(flower_port=5601, flower_basic_auth=SecretStr("ops:pw"))
    spec = flower_spec(s)
    assert spec.name == "flower" and "flower" in spec.argv and "--port=5601" in spec.argv
    assert not any("pw" in a for a in spec.argv)
    assert flower_env(s) == {"FLOWER_BASIC_AUTH": "ops:pw"}
    assert flower_env(Settings()) == {}
