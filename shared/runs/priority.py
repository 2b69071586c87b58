"""Which waiting run a free worker slot takes next: per-user fair dispatch (R4, P7).

Runs wait in the run queue (shared/runs/run_queue.py), a Redis sorted set by priority
(`PRIORITY_STEPS`, 0 first) and then age; a worker slot that frees takes the best one.
Before, the runs queue was one FIFO across users: 20 users' cron firings (each user up to
`max_active_runs` of them) stood in front of another user's chat run
(`python -m bench.cron_load`).

A run's priority is decided at admission from two facts known there:

- its class: a run a caller asked for (HTTP, WebSocket) is in the foreground; a cron
  firing is in the background, behind every waiting foreground run (a schedule can wait a
  moment, a person at a chat cannot);
- its user's position: how many of the user's runs were already pending or running (the
  active set `max_active_runs` counts). Every `dispatch_position_step` of them lowers the
  priority one step, down to the class's last, so a user with many runs queued does not
  keep another user's first runs waiting behind all of them.

A re-dispatch (the next run of a thread, a run the reaper recovered or found undispatched,
an ops retry) is `REDISPATCH`, between the classes: the run has waited already, and is
behind no fresh foreground run. A run still queued keeps its place and its class when it
is dispatched again (the reaper re-sends a pending run every `dispatch_stale_s`).

A worker keeps slots for the foreground: background runs hold at most
`worker_background_share` of its slots (workers/background_share.py), so a burst
of firings never fills a worker that a caller's run then waits for. Cron firings yield to
callers' runs; they are not starved by each other, and get every slot the foreground
leaves, up to that share.

A caller no limit applies to (the local user of single-user mode) has position 0: its
runs keep their class, and among themselves their order.
"""

from __future__ import annotations

PRIORITY_STEPS = tuple(range(10))
"""The priorities of the run queue, 0 taken first."""

FOREGROUND = (0, 1, 2, 3)
REDISPATCH = 4
BACKGROUND = (5, 6, 7, 8)
FIRST_PRIORITY = FOREGROUND[0]
"""A foreground run of a user with nothing else pending or running."""


def run_priority(position: int, *, background: bool, step: int) -> int:
    """The priority of a run admitted when its user already had `position` runs pending or
    running: its class's first step, one lower for every `step` of those."""
    steps = BACKGROUND if background else FOREGROUND
    return steps[min(len(steps) - 1, max(0, position) // max(1, step))]
