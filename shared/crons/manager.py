"""`CronManager`: create, read, change and delete crons, and fire the due ones.

Each firing is an ordinary admission through `RunManager` (the assistant the cron's owner
may use, `multitask_strategy`, the delay limit), written inside the firing transaction of
`CronStore.fire_due`, and dispatched after commit exactly as `RunManager.admit` dispatches.

A firing counts against its owner's per-user run limits like every admission (A3, A4:
`runs_per_minute`, `max_active_runs`, shared/runs/limits.py): the slot is reserved before
the admission, bound to the run once the batch committed, released when no run came of it
(a batch that rolls back leaves reservations that expire after `limit_slot_ttl_s`). A
firing over a limit admits nothing and is recorded `limited`, with the limit's message:
the tick is spent, as for `rejected`, and the next tick tries again.

A firing whose owner has no credential left (every key revoked) or whose assistant is gone
could never admit again: it is recorded `disabled` and the cron is disabled in the same
transaction, rather than failing at every tick. Re-enabling it (`PATCH enabled`) is the
owner's, once it can call the API again; ops can list and delete any user's crons.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg.rows import DictRow

from shared.authz.users import run_subject
from shared.crons import schedule as sched
from shared.crons.model import (
    Cron,
    CronCannotFire,
    CronPatch,
    CronSpec,
    FiringOutcome,
    request_to_json,
)
from shared.crons.store import CronStore, Fired
from shared.errors import ValidationFailed
from shared.runs.limits import RunLimits, RunSlot
from shared.runs.manager import RunManager
from shared.runs.priority import run_priority
from shared.runs.store import Admission
from shared.vocab import JSONObject

log = logging.getLogger(__name__)

Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    """The current time, aware, in UTC."""
    return dt.datetime.now(dt.UTC)


@dataclasses.dataclass
class TickReport:
    """What one scheduler tick did."""

    batches: int = 0
    admitted: int = 0
    rejected: int = 0
    limited: int = 0  # the owner was at a per-user run limit
    disabled: int = 0  # the cron could not fire any more (owner revoked, assistant gone)
    failed: int = 0
    skipped: int = 0  # ticks whose firing row already existed (fired by another scheduler)

    @property
    def fired(self) -> int:
        """Ticks this tick handled, whatever came of them."""
        return self.admitted + self.rejected + self.limited + self.disabled + self.failed


class CronManager:
    """Decisions about crons; the API and the scheduler call this, never the store."""

    def __init__(
        self,
        store: CronStore,
        runs: RunManager,
        *,
        max_per_user: int = 100,
        min_interval_s: float = 60.0,
        batch_size: int = 100,
        clock: Clock = utc_now,
        limits: RunLimits | None = None,
        throttled: Callable[[str], bool] = lambda subject: True,
        owner_valid: Callable[[str], bool] = lambda owner: True,
        position_step: int = 4,
    ) -> None:
        """`limits`: the per-user run limits the firings count against (None: none, for
        the web's manager, which never fires); `throttled(subject)`: whether they apply to
        that user (not to the one user of local single-user mode, as on the API);
        `owner_valid(owner)`: whether the owner still has a credential
        (`shared.auth.keys.OwnerCredentials`): a revoked user's crons are disabled;
        `position_step`: `dispatch_position_step` (shared/runs/priority.py)."""
        self.store = store
        self._runs = runs
        self._limits = limits
        self._throttled = throttled
        self._owner_valid = owner_valid
        self._slots: dict[tuple[str, dt.datetime], RunSlot] = {}  # a batch's reservations
        self._max_per_user = max_per_user
        self._min_interval_s = min_interval_s
        self._batch_size = batch_size
        self._clock = clock
        self._position_step = position_step

    # --- the API -----------------------------------------------------------------------------
    def check_schedule(self, schedule: str, timezone: str | None) -> None:
        """422 naming `schedule` or `timezone` for what croniter or zoneinfo refuse, or a
        schedule that ticks more often than `cron_min_interval_s`."""
        try:
            sched.check(schedule)
        except ValueError as exc:
            raise ValidationFailed(f"schedule: {exc}", field="schedule") from exc
        try:
            sched.zone(timezone)
        except ValueError as exc:
            raise ValidationFailed(f"timezone: {exc}", field="timezone") from exc
        try:
            gap = sched.min_gap_s(schedule, timezone, self._clock())
        except ValueError as exc:  # croniter's errors are ValueErrors ("0 0 31 2 *")
            raise ValidationFailed(f"schedule: {exc}", field="schedule") from exc
        if gap < self._min_interval_s:
            raise ValidationFailed(
                f"schedule: ticks {gap:g} s apart; at least {self._min_interval_s:g} s"
                " (cron_min_interval_s)",
                field="schedule",
            )

    def create(self, owner: str, spec: CronSpec) -> Cron:
        """A new cron of `owner` (404 for an assistant or thread the owner cannot see)."""
        self.check_schedule(spec.schedule, spec.timezone)
        # The assistant is resolved now, so a bad one is a 404 at create time, and the cron
        # keeps the assistant's id (not a graph name) as the official server does.
        item = self._runs.admit_item(owner, spec.request)
        assistant_id = item.request.assistant_id
        spec = dataclasses.replace(
            spec,
            assistant_id=assistant_id,
            request=dataclasses.replace(spec.request, assistant_id=assistant_id),
        )
        next_run_at = sched.first_run(spec.schedule, spec.timezone, self._clock(), spec.end_time)
        cron = self.store.create(
            spec, owner, next_run_at=next_run_at, max_per_user=self._max_per_user
        )
        log.info(
            "cron created",
            extra={"cron_id": cron.cron_id, "user_id": owner, "thread_id": cron.thread_id},
        )
        return cron

    def get(self, owner: str, cron_id: str) -> Cron:
        """The owner's cron, or 404."""
        return self.store.get(cron_id, owner)

    def patch(self, owner: str, cron_id: str, patch: CronPatch) -> Cron:
        """Change the cron; a new schedule, timezone, end_time or enabled recomputes the next
        tick from now (a re-enabled cron does not fire the ticks it missed while disabled)."""
        cron = self.store.get(cron_id, owner)
        values: JSONObject = {}
        for name in ("schedule", "timezone", "enabled", "on_run_completed", "metadata"):
            if name in patch.given and getattr(patch, name) is not None:
                values[name] = getattr(patch, name)
        if "end_time" in patch.given:
            values["end_time"] = patch.end_time
        if patch.request is not None:
            item = self._runs.admit_item(owner, patch.request)  # 404 for a bad assistant now
            request = dataclasses.replace(patch.request, assistant_id=item.request.assistant_id)
            values["request"] = request_to_json(request)
            values["payload"] = patch.payload
        if patch.reschedules:
            schedule = values.get("schedule", cron.schedule)
            timezone = values.get("timezone", cron.timezone)
            self.check_schedule(schedule, timezone)
            end_time = values.get("end_time", cron.end_time)
            values["next_run_at"] = sched.first_run(schedule, timezone, self._clock(), end_time)
        return self.store.update(cron_id, owner, values)

    def delete(self, owner: str, cron_id: str) -> None:
        """Delete the owner's cron (404 otherwise); it fires no more."""
        self.store.delete(cron_id, owner)
        log.info("cron deleted", extra={"cron_id": cron_id, "user_id": owner})

    def search(self, owner: str, **filters: Any) -> list[Cron]:
        """The owner's crons matching `CronStore.search`'s filters."""
        return self.store.search(owner, **filters)

    def count(self, owner: str, **filters: Any) -> int:
        """How many of the owner's crons match `CronStore.count`'s filters."""
        return self.store.count(owner, **filters)

    # --- the scheduler -------------------------------------------------------------------------
    def tick(
        self,
        *,
        budget_s: float | None = None,
        before_commit: Callable[[Sequence[Fired]], None] | None = None,
    ) -> TickReport:
        """Fire every due cron, a batch per transaction, until none is due (or `budget_s` is
        spent); dispatch each admitted run after its batch committed."""
        report = TickReport()
        deadline = None if budget_s is None else time.monotonic() + budget_s
        while True:
            try:
                fired = self.store.fire_due(
                    self._batch_size, self._admit, self._advance, before_commit=before_commit
                )
            except BaseException:
                self._release_slots()  # rolled back: no run holds them
                raise
            report.batches += 1
            for f in fired:
                self._after_commit(f, report)
            if len(fired) < self._batch_size:
                return report
            if deadline is not None and time.monotonic() > deadline:
                return report

    def _admit(self, conn: psycopg.Connection[DictRow], cron: Cron) -> Admission:
        """The firing's run: on the cron's thread, or on a new temporary thread of its own,
        under its owner's run limits (LimitExceeded: the firing is `limited`)."""
        if not self._owner_valid(cron.user_id):
            raise CronCannotFire(f"the owner {cron.user_id!r} has no active credential")
        thread_id = cron.thread_id or str(uuid.uuid4())
        request = cron.run_request(thread_id)
        subject = run_subject(cron.user_id, request.config) or cron.user_id
        if self._limits is not None and self._throttled(subject):
            self._limits.check_rate(subject)
            assert cron.next_run_at is not None  # selected as due
            self._slots[(cron.cron_id, cron.next_run_at)] = self._limits.reserve(subject)
        return self._runs.admit_in(conn, cron.user_id, request)

    def _release_slots(self) -> None:
        for slot in self._slots.values():
            try:
                slot.release()
            except Exception:
                log.warning("could not release a cron firing's run slot", exc_info=True)
        self._slots.clear()

    @staticmethod
    def _advance(cron: Cron, now: dt.datetime) -> dt.datetime | None:
        """The next tick; None (the cron is done) when croniter finds none: a cron that
        cannot advance must not fail its whole batch at every tick."""
        assert cron.next_run_at is not None
        try:
            return sched.advance(cron.schedule, cron.timezone, cron.next_run_at, now, cron.end_time)
        except ValueError:
            log.exception("cron has no next tick; it stops", extra={"cron_id": cron.cron_id})
            return None

    def _after_commit(self, fired: Fired, report: TickReport) -> None:
        """Dispatch the committed run and log the firing (its row is the audit record)."""
        run = None
        slot = self._slots.pop((fired.cron.cron_id, fired.tick_at), None)
        if fired.admission is not None:
            # Behind every run a caller asked for, by its owner's runs in flight (R4, P7).
            position = slot.position if slot is not None else 0
            priority = run_priority(position, background=True, step=self._position_step)
            run = self._runs.after_commit(fired.admission, priority)
        if slot is not None:
            try:
                if run is not None:
                    slot.bind(run.run_id)
                else:
                    slot.release()
            except Exception:
                log.warning("could not settle a cron firing's run slot", exc_info=True)
        if fired.outcome is None:
            report.skipped += 1
        elif fired.outcome is FiringOutcome.ADMITTED:
            report.admitted += 1
        elif fired.outcome is FiringOutcome.REJECTED:
            report.rejected += 1
        elif fired.outcome is FiringOutcome.LIMITED:
            report.limited += 1
        elif fired.outcome is FiringOutcome.DISABLED:
            report.disabled += 1
        else:
            report.failed += 1
        log.info(
            "cron fired",
            extra={
                "cron_id": fired.cron.cron_id,
                "user_id": fired.cron.user_id,
                "tick_at": fired.tick_at.isoformat(),
                "outcome": fired.outcome.value if fired.outcome else "already_fired",
                "run_id": run.run_id if run else None,
                "thread_id": run.thread_id if run else fired.cron.thread_id,
                "next_run_at": fired.next_run_at.isoformat() if fired.next_run_at else None,
                "error": fired.error,
            },
        )
