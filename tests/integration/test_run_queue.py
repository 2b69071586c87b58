"""R4, P7: the run queue a free worker slot takes the best waiting run from (real Redis).

Priorities first (0 before 9), the oldest first among equals; a run queued again keeps
its place, or moves up to a better priority, never back; a dispatch puts the run in the
queue and sends a message that names no run (shared/runs/run_queue.py).
"""

from __future__ import annotations

import base64
import time
import uuid

import hypothesis.strategies as st
import orjson
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings

from shared.redis_keys import Keys
from shared.runs.priority import BACKGROUND, FOREGROUND, REDISPATCH
from shared.runs.run_queue import NEXT, RunQueue
from shared.runs.taskqueue import RUNS_QUEUE, Dispatcher
from shared.settings import Settings


def drain(q: RunQueue) -> list[str]:
    out = []
    while (run := q.pop()) is not None:
        out.append(run)
    return out


@hsettings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=30))
def test_r4_p7_runs_are_taken_by_priority_then_age(
    settings: Settings, rclient: redis.Redis, priorities: list[int]
) -> None:
    """R4, P7: whatever the order they were queued in, runs come out by priority, and in the
    order they were queued within one priority."""
    q = RunQueue(rclient, Keys(f"{settings.redis_prefix}rq{uuid.uuid4().hex[:8]}:"))
    queued = []
    for i, p in enumerate(priorities):
        run = f"{i:04d}-{uuid.uuid4()}"
        q.push(run, p)
        queued.append((p, run))
        if i % 7 == 0:
            time.sleep(0.002)  # some share a millisecond, some do not
    assert q.depth() == len(priorities)
    got = drain(q)
    assert got == [run for _, run in sorted(queued, key=lambda x: (x[0], x[1][:4]))]
    assert q.depth() == 0


def test_r4_a_run_queued_again_keeps_its_place_or_moves_up(
    settings: Settings, rclient: redis.Redis
) -> None:
    """R4, P7: the reaper's re-dispatch of a run still waiting does not send it to the back
    (nor make a second entry); a better priority moves it up; a worse one does not move it."""
    q = RunQueue(rclient, Keys(f"{settings.redis_prefix}rq{uuid.uuid4().hex[:8]}:"))
    q.push("a", FOREGROUND[0])
    time.sleep(0.002)
    q.push("b", FOREGROUND[0])
    time.sleep(0.002)
    q.push("a", FOREGROUND[0])  # again, same priority: keeps its older place
    q.push("starved", BACKGROUND[0])
    q.push("b", BACKGROUND[-1])  # worse: no move
    q.push("starved", REDISPATCH)  # better: moves up, still behind the foreground
    assert q.depth() == 3
    assert drain(q) == ["a", "b", "starved"]


def test_r4_a_dispatch_queues_the_run_and_sends_a_message_naming_none(
    settings: Settings, rclient: redis.Redis
) -> None:
    """R4: after `dispatch_run` the run waits in the run queue and the runs queue holds one
    message whose argument is NEXT; `dispatch_later` names its run and skips the queue."""
    d = Dispatcher.of(settings, rclient)
    keys = Keys(settings.redis_prefix)
    run = str(uuid.uuid4())
    rclient.delete(keys.celery_queue(RUNS_QUEUE), keys.run_queue())
    d.dispatch_run(run, FOREGROUND[1])
    assert d.queue.depth() == 1
    raw = rclient.lindex(keys.celery_queue(RUNS_QUEUE), 0)
    assert raw is not None
    body = orjson.loads(base64.b64decode(orjson.loads(raw)["body"]))
    assert body[0] == [NEXT]
    assert d.queue.pop() == run
    rclient.delete(keys.celery_queue(RUNS_QUEUE), keys.run_queue())
