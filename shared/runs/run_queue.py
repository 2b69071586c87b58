"""The runs waiting for a worker slot, taken in priority order when a slot frees (R4, P7).

A dispatch puts the run id in one Redis sorted set, scored by its priority
(shared/runs/priority.py) and then the time it was queued, and sends a Celery message that
names no run (`NEXT`). A worker slot that starts such a message takes the best waiting
run at that moment (run_queue_pop.lua). The messages are interchangeable, so neither the queue's
FIFO nor the messages a worker has prefetched decide which run goes first.

Why not Celery's own priorities: kombu's Redis transport keeps a list per priority, but a
threads worker prefetches up to `worker_concurrency` messages and starts them in the order
they came, and `worker_disable_prefetch` left a freed slot idle until the next second's
poll (measured: one run a second on a one-slot worker).

What can go wrong, and why nothing is lost (R4):
- the message is lost after the run was queued: the run stays pending, and the reaper
  re-dispatches a pending run undispatched for `dispatch_stale_s` (a new message);
- a worker dies after taking the run and before claiming it: the same;
- a run is queued twice (the reaper's re-dispatch of a run still waiting): it keeps one
  entry, its first place and priority; the spare message finds the set empty or starts
  another run, which is no worse than the FIFO it replaces;
- a taken run cannot be claimed (cancelled, not its thread's head any more): the claim
  says so, as it did for a message naming it.
"""

from __future__ import annotations

from typing import NamedTuple

import redis

from shared import lua
from shared.redis_keys import Keys
from shared.runs.priority import PRIORITY_STEPS

NEXT = ""
"""The run task's argument that means "the best waiting run" (a run id names one)."""
NEXT_BACKGROUND = "background"
"""The argument that means "the best waiting background run" (the background queue's
messages: a background worker never takes a caller's run)."""

PRIORITY_SCALE = 10**13
"""A queued run's score: priority * PRIORITY_SCALE + the ms it was queued (run_queue_push.lua)."""


class Taken(NamedTuple):
    """A run taken from the queue, with the priority it was queued at."""

    run_id: str
    priority: int


class Queued(NamedTuple):
    """What a push did: whether the run was queued now, and the priority it waits at (its
    first one when it was queued already)."""

    added: bool
    priority: int


class RunQueue:
    """The waiting runs of one deployment, in Redis (a sorted set under the prefix)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis = client
        self.key = keys.run_queue()
        self._push = lua.register(client, "run_queue_push")
        self._pop = lua.register(client, "run_queue_pop")

    def enqueue(self, run_id: str, priority: int) -> Queued:
        """Queue `run_id` at `priority`; a run queued already keeps its place and its
        priority (which class of message it needs, shared/runs/taskqueue.py)."""
        added, at = self._push(keys=[self.key], args=[priority, run_id])
        return Queued(bool(added), int(at))

    def push(self, run_id: str, priority: int) -> bool:
        """Queue `run_id` at `priority`; False when it was queued already."""
        return self.enqueue(run_id, priority).added

    def pop(self, below: int = len(PRIORITY_STEPS), at_least: int = 0) -> Taken | None:
        """Take the best waiting run with a priority below `below` and at least `at_least`:
        the lowest priority number, the oldest among equals."""
        got = self._pop(keys=[self.key], args=[below, at_least])
        if not got:
            return None
        member, score = got
        run_id = member.decode() if isinstance(member, bytes) else str(member)
        return Taken(run_id, int(float(score) // PRIORITY_SCALE))

    def waiting(self, through: int, limit: int = 50) -> list[str]:
        """Up to `limit` waiting runs at priority `through` or better, best first (who a
        slot's run yields to, workers/fairness.py)."""
        got = self.redis.zrangebyscore(
            self.key, "-inf", f"({(through + 1) * PRIORITY_SCALE}", start=0, num=limit
        )
        return [m.decode() if isinstance(m, bytes) else str(m) for m in got]

    def depth(self) -> int:
        """How many runs wait."""
        return int(self.redis.zcard(self.key))
