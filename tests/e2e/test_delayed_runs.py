"""Delayed runs (`after_seconds`) through the official SDK: durable, cancellable, started once.

A delayed run is a pending row with its due time; the reaper dispatches it once due, so it
survives the death of every worker in between (R4), and the claim lets one attempt in (L3).
"""

from __future__ import annotations

import datetime as dt
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from shared.runs.model import TERMINAL_STATUSES
from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import FAST_LEASES, ClusterFactory, run_sdk

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def delayed(private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """Web + one worker, a fast reaper, on their own database and Redis prefix."""
    with private_cluster("delayed", FAST_LEASES) as c:
        c.side_by_side(c.start_web, lambda: c.start_worker("w1", concurrency=4))
        yield c


def _sdk(c: Cluster, fn: Any) -> Any:
    return run_sdk(fn, c.url)


def _create(c: Cluster, after_s: float) -> tuple[str, dict[str, Any]]:
    async def fn(client: Any) -> tuple[str, dict[str, Any]]:
        tid = (await client.threads.create())["thread_id"]
        run = await client.runs.create(
            tid,
            "lead_agent",
            input={"messages": [{"role": "user", "content": "later, please"}]},
            config={"configurable": {"tokens": 3}},
            after_seconds=after_s,
        )
        return tid, run

    result: tuple[str, dict[str, Any]] = _sdk(c, fn)
    return result


def _get(c: Cluster, tid: str, run_id: str) -> dict[str, Any]:
    async def fn(client: Any) -> dict[str, Any]:
        return dict(await client.runs.get(tid, run_id))

    result: dict[str, Any] = _sdk(c, fn)
    return result


def _ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value)


def test_r4_a_delayed_run_survives_a_worker_restart_and_starts_once(delayed: Cluster) -> None:
    """R4, L3: pending with its due time; its only worker killed (-9) before it is due and
    a new one started; it then runs once (attempt 1), not before its due time."""
    tid, run = _create(delayed, 4.0)
    assert run["status"] == "pending" and run["due_at"] is not None
    assert _ts(run["due_at"]) - _ts(run["created_at"]) >= dt.timedelta(seconds=3.9)
    (w1,) = delayed.workers()
    w1.stop(signal.SIGKILL)
    delayed.start_worker("w2", concurrency=4)
    wait_for(
        lambda: _get(delayed, tid, run["run_id"])["status"] in TERMINAL_STATUSES,
        40,
        what="the delayed run to end",
    )
    done = _get(delayed, tid, run["run_id"])
    assert done["status"] == "success" and done["attempt"] == 1
    assert _ts(done["started_at"]) >= _ts(run["due_at"])


def test_r5_a_delayed_run_cancelled_before_it_is_due_never_starts(delayed: Cluster) -> None:
    """R5: cancelling a delayed run before its due time ends it `interrupted` at once; it
    never starts, and the thread is free again."""
    tid, run = _create(delayed, 30.0)

    async def cancel(client: Any) -> None:
        await client.runs.cancel(tid, run["run_id"])

    _sdk(delayed, cancel)
    done = _get(delayed, tid, run["run_id"])
    assert done["status"] == "interrupted" and done["started_at"] is None

    async def thread(client: Any) -> dict[str, Any]:
        return dict(await client.threads.get(tid))

    assert _sdk(delayed, thread)["status"] == "idle"
