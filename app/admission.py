"""Admitting runs at the web edge: the one path every HTTP view and the WebSocket take.

    sizes (raw request) -> runs per minute -> an active-run slot -> RunManager.admit -> bind

An invalid request uses no rate and no slot (its model validated it first); a refused or
failed admission frees its slot; an admitted run holds its slot until it ends (the
worker's finalize, a cancel of a pending run or the reaper take it out of the set). The
counters are app/limits.py's; the durable admission is shared/runs/manager.py's. An HTTP
view that admits runs declares `@run_sized` (or `@batch_sized`) so that the sizes are
checked on the body as sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from app.errors import LimitExceeded
from app.limits import RunSlot, check_run_sizes, limiter
from app.services import current_services
from shared.runs.model import Run, RunRequest


def admit_run(owner: str, wanted: RunRequest, raw: dict[str, Any] | None = None) -> Run:
    """Admit one run of `owner` under the per-user limits; 429/422 `LimitExceeded` when
    over one. `raw`: the request as sent, when its sizes were not checked yet (a WebSocket
    frame; an HTTP view's `@run_sized` checks them before validation)."""
    lim = limiter()
    if raw is not None:
        check_run_sizes(raw, lim.settings)
    lim.check_run_rate(owner)
    slot = lim.reserve_run(owner)
    return _bound([slot], lambda: [current_services().runs.admit(owner, wanted)])[0]


def admit_batch(owner: str, wanted: Sequence[RunRequest]) -> list[Run]:
    """Admit a batch of `owner`'s runs, all or none: the rate for all of them at once, one
    active-run slot per run (a batch larger than `max_active_runs` can never fit: 422)."""
    lim = limiter()
    if lim.throttled() and len(wanted) > lim.settings.max_active_runs:
        raise LimitExceeded(
            "max_active_runs",
            f"a batch of {len(wanted)} runs: at most {lim.settings.max_active_runs}"
            " pending or running runs per user",
            status=422,
            field="body",
        )
    lim.check_run_rate(owner, len(wanted))
    slots: list[RunSlot] = []
    try:
        for _ in wanted:
            slots.append(lim.reserve_run(owner))
    except LimitExceeded:
        for slot in slots:
            slot.release()
        raise
    return _bound(slots, lambda: current_services().runs.admit_batch(owner, list(wanted)))


def _bound(slots: list[RunSlot], admit: Callable[[], list[Run]]) -> list[Run]:
    """Run `admit`; bind each slot to its run, or free them all when it fails."""
    try:
        runs = admit()
    except BaseException:
        for slot in slots:
            slot.release()
        raise
    for slot, run in zip(slots, runs, strict=True):
        slot.bind(run.run_id)
    return runs
