"""H2: a running run whose owner is no live worker is orphaned, with its recovery time."""

from __future__ import annotations

from typing import Any

from shared.ops.collector import WorkerInspector, live_processes, orphan_state

LIVE = live_processes([{"host": "h", "pid": 10}, {"host": "h", "pid": None}])


def state(
    status: str, owner: str | None, lease_left_s: float | None, idle_s: float
) -> tuple[bool, float | None]:
    return orphan_state(
        status=status,
        owner=owner,
        live=LIVE,
        lease_left_s=lease_left_s,
        idle_s=idle_s,
        lease_ttl_s=3.0,
        reaper_interval_s=0.5,
    )


def test_h2_live_processes_are_host_and_pid_of_answering_workers() -> None:
    """H2: a worker without a pid in its stats names no process."""
    assert frozenset({("h", "10")}) == LIVE


def test_h2_run_of_a_live_owner_is_not_orphaned() -> None:
    """H2: the owner `h:10:…` answered the broadcast."""
    assert state("running", "h:10:abc", 2.0, 0.5) == (False, None)


def test_h2_run_of_a_dead_owner_is_orphaned_until_its_lease_runs_out() -> None:
    """H2: recovers once the lease is gone and the row is a TTL old, plus one reaper pass."""
    assert state("running", "h:11:abc", 2.5, 0.2) == (True, 3.3)
    assert state("running", "h:11:abc", None, 9.0) == (True, 0.5)


def test_h2_pending_or_ownerless_runs_are_not_orphaned() -> None:
    """H2: only a running run has an owner to lose."""
    assert state("pending", None, None, 0.0) == (False, None)
    assert state("running", None, None, 0.0) == (False, None)


class CountingInspector(WorkerInspector):
    """A WorkerInspector whose broadcast is counted instead of sent."""

    def __init__(self) -> None:
        super().__init__(celery=None, timeout_s=0.5, cache_s=0.0)  # type: ignore[arg-type]
        self.asked = 0

    def _inspect(self) -> list[dict[str, Any]]:
        self.asked += 1
        return [{"host": "h", "pid": self.asked}]


def test_h2_one_view_asks_the_workers_once() -> None:
    """H2: within `pinned()` (one overview or health document) every panel gets the same
    answer from one broadcast, nested blocks included; outside it the cache rules again."""
    insp = CountingInspector()
    with insp.pinned():
        first = insp.workers()
        with insp.pinned():
            assert insp.workers() is first
        assert insp.workers() is first
    assert insp.asked == 1
    assert insp.workers() != first and insp.asked == 2
