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
from workers.background_share import CALLERS_TTL_S, BackgroundShare, CallerActivity


def drain(q: RunQueue) -> list[str]:
    out = []
    while (taken := q.pop()) is not None:
        out.append(taken.run_id)
    return out


def queue(settings: Settings, rclient: redis.Redis) -> RunQueue:
    return RunQueue(rclient, Keys(f"{settings.redis_prefix}rq{uuid.uuid4().hex[:8]}:"))


@hsettings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=30))
def test_r4_p7_runs_are_taken_by_priority_then_age(
    settings: Settings, rclient: redis.Redis, priorities: list[int]
) -> None:
    """R4, P7: whatever the order they were queued in, runs come out by priority, and in the
    order they were queued within one priority."""
    q = queue(settings, rclient)
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


def test_r4_a_run_queued_again_keeps_its_place_and_its_class(
    settings: Settings, rclient: redis.Redis
) -> None:
    """R4, P7: the reaper's re-dispatch of a run still waiting neither sends it to the back
    nor makes a second entry, nor moves a cron firing out of the background; `pop(below)`
    takes only priorities under the bound, and says which priority it took."""
    q = queue(settings, rclient)
    assert q.push("a", FOREGROUND[0])
    time.sleep(0.002)
    assert q.push("b", FOREGROUND[0])
    time.sleep(0.002)
    assert not q.push("a", FOREGROUND[0])  # again: keeps its older place
    assert q.push("firing", BACKGROUND[0])
    assert not q.push("firing", REDISPATCH)  # a re-dispatch: still a background run
    assert q.depth() == 3
    assert q.pop(below=BACKGROUND[0]) == ("a", FOREGROUND[0])
    assert q.pop(below=BACKGROUND[0]) == ("b", FOREGROUND[0])
    assert q.pop(below=BACKGROUND[0]) is None  # only the firing waits
    assert q.pop() == ("firing", BACKGROUND[0])


def test_p7_background_runs_hold_at_most_their_share_and_owed_messages_come_back(
    settings: Settings, rclient: redis.Redis
) -> None:
    """P7: with a cap of 2, two firings start; the next slot takes a caller's run queued
    after them, then finds only firings and owes its message; when a firing ends, the
    message is due again and the third firing starts."""
    q = queue(settings, rclient)
    share = BackgroundShare(2)
    for i in range(3):
        q.push(f"firing{i}", BACKGROUND[1])
    q.push("chat", FOREGROUND[0])
    first = share.take(q)
    assert first == ("chat", FOREGROUND[0])  # the best first, whatever the cap
    assert not share.done(first)
    one, two = share.take(q), share.take(q)
    assert one is not None and two is not None
    assert (one.run_id, two.run_id) == ("firing0", "firing1") and share.running == 2
    q.push("chat2", FOREGROUND[0])
    assert share.take(q) == ("chat2", FOREGROUND[0])  # the kept slots serve callers
    assert share.take(q) is None and share.owed == 1  # firing2 waits for the cap
    assert share.done(one)  # a background slot freed: send the owed message
    assert share.owed == 0 and share.running == 1
    third = share.take(q)
    assert third == ("firing2", BACKGROUND[1]) and share.running == 2
    assert not share.done(two) and not share.done(third)  # nothing owed
    assert share.running == 0 and q.depth() == 0


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
    assert d.queue.pop() == (run, FOREGROUND[1])
    rclient.delete(keys.celery_queue(RUNS_QUEUE), keys.run_queue())


def test_r4_p7_waiting_lists_the_runs_at_a_priority_or_better_best_first(
    settings: Settings, rclient: redis.Redis
) -> None:
    """R4, P7: who a slot's run yields to (workers/fairness.py): the runs queued at its
    priority or better, best first, none of the worse ones, and nothing is taken."""
    q = queue(settings, rclient)
    q.push("bg", BACKGROUND[0])
    q.push("fg1", FOREGROUND[1])
    q.push("re", REDISPATCH)
    q.push("fg0", FOREGROUND[0])
    try:
        assert q.waiting(FOREGROUND[0]) == ["fg0"]
        assert q.waiting(FOREGROUND[1]) == ["fg0", "fg1"]
        assert q.waiting(REDISPATCH) == ["fg0", "fg1", "re"]
        assert q.waiting(BACKGROUND[-1], limit=2) == ["fg0", "fg1"]
        assert q.depth() == 4
    finally:
        rclient.delete(q.key)


def test_p7_background_runs_yield_while_callers_runs_run_and_catch_up_after(
    settings: Settings, rclient: redis.Redis
) -> None:
    """P7: while a caller's run runs somewhere (the signal a runs worker keeps set), a
    background worker starts firings on at most its yield slots and owes the rest of their
    messages; when the signal is gone, the next firing that ends sends every owed message
    the cap has room for, not one."""
    q = queue(settings, rclient)
    busy = [True]
    share = BackgroundShare(8, yield_slots=2, callers_busy=lambda: busy[0])
    share.callers_here = False  # a background worker
    for i in range(6):
        q.push(f"firing{i}", BACKGROUND[0])
    started = [share.take(q, background=True) for _ in range(6)]
    running = [t for t in started if t is not None]
    assert [t.run_id for t in running] == ["firing0", "firing1"] and share.owed == 4
    busy[0] = False
    assert share.done(running[0]) == 4  # room for all four now
    assert share.owed == 0
    again = [share.take(q, background=True) for _ in range(4)]
    assert all(t is not None for t in again) and share.running == 5 and q.depth() == 0


def test_p7_the_callers_signal_is_set_while_a_callers_run_runs_and_expires_after(
    settings: Settings, rclient: redis.Redis
) -> None:
    """P7: a worker running a caller's run keeps the signal set (from a thread of its own,
    not on the run's path); once its runs end the key expires within its TTL."""
    key = f"{settings.redis_prefix}callers-busy-{uuid.uuid4().hex[:8]}"
    sig, reader = CallerActivity(rclient, key), CallerActivity(rclient, key)
    try:
        assert not reader.busy()
        sig.begin()
        deadline = time.monotonic() + 5
        while not rclient.exists(key) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # past the reader's cache of its first look
        assert reader.busy()
        sig.end()
        ttl = rclient.ttl(key)
        assert 0 < ttl <= CALLERS_TTL_S
    finally:
        rclient.delete(key)


def test_p7_a_background_message_takes_a_callers_run_first_only_where_callers_are_served(
    settings: Settings, rclient: redis.Redis
) -> None:
    """P7: on a worker of both queues the broker hands out their messages in turn, so a
    background message takes the best waiting run (the caller's); a background worker,
    which never sees the runs queue, takes only the firing."""
    q = queue(settings, rclient)
    q.push("firing", BACKGROUND[0])
    q.push("chat", FOREGROUND[0])
    both = BackgroundShare(4)
    assert both.take(q, background=True) == ("chat", FOREGROUND[0])
    q.push("chat", FOREGROUND[0])
    background_only = BackgroundShare(4)
    background_only.callers_here = False
    assert background_only.take(q, background=True) == ("firing", BACKGROUND[0])
    assert q.waiting(BACKGROUND[-1]) == ["chat"]
    rclient.delete(q.key)
