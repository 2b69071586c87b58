"""R4, P7: fair dispatch. Free worker slots go to runs in priority order, not queue order.

Before, the runs queue was one FIFO across users: cron firings queued first, then a
user's burst, ran before another user's first run that came after them
(`python -m bench.cron_load`: a chat behind 20 users' firings did not finish). Now a run a
caller asked for is ahead of every cron firing, and among those, a user's first runs are
ahead of another user's many (shared/runs/priority.py): real Celery, real Redis priority
lists, a worker that takes a message only for a free slot.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import psycopg
import pytest

from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ClusterFactory, human

pytestmark = pytest.mark.e2e

USERS = ("hog", "chat", "sched", "cron1", "cron2", "cron3", "cron4")
KEYS = {u: f"key-{u}" for u in USERS}
ENV = {
    "THREADRUN_API_KEYS": ",".join(f"{k}:{u}" for u, k in KEYS.items()),
    "THREADRUN_CRON_TICK_S": "0.3",
    "THREADRUN_CRON_MIN_INTERVAL_S": "1",
    "THREADRUN_DISPATCH_POSITION_STEP": "4",
}
SHORT = {"configurable": {"tokens": 1, "token_delay_ms": 0}}
CRON_USERS = ("cron1", "cron2", "cron3", "cron4")
SCHED_RUNS = "SELECT count(*) FROM runs r JOIN threads t USING (thread_id) WHERE t.owner = 'sched'"


def post(url: str, user: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}{path}", json=body, headers={"x-api-key": KEYS[user]}, timeout=30)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def runs_by_start(dsn: str) -> list[tuple[str, str]]:
    """(user, run id) of every run, in the order the worker started them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT t.owner, r.run_id::text FROM runs r JOIN threads t USING (thread_id)"
            " ORDER BY r.started_at, r.run_id"
        ).fetchall()
    return [(str(u), str(r)) for u, r in rows]


def count(dsn: str, sql: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def fire_then_delete(c: Cluster, n: int) -> int:
    """A cron of `sched` on every second, deleted once it fired `n` times (no worker runs
    them yet); how many firings it left pending."""
    cron = post(
        c.url,
        "sched",
        "/runs/crons",
        {
            "assistant_id": "lead_agent",
            "schedule": "* * * * * *",
            "input": human("tick"),
            "config": SHORT,
            "on_run_completed": "keep",  # its runs stay to be counted
        },
    )
    wait_for(lambda: count(c.settings.dsn, SCHED_RUNS) >= n, timeout=30, what=f"{n} firings")
    r = httpx.delete(f"{c.url}/runs/crons/{cron['cron_id']}", headers={"x-api-key": KEYS["sched"]})
    assert r.status_code in (200, 204), r.text
    time.sleep(0.5)  # a firing in flight when the cron was deleted commits first
    return count(c.settings.dsn, SCHED_RUNS)


def test_r4_p7_slots_go_to_callers_before_crons_and_to_a_users_first_runs_first(
    private_cluster: ClusterFactory,
) -> None:
    """With no worker running: a cron of `sched` fires three times, then `hog` asks for 8
    runs and `chat` for 2. A one-slot worker then starts hog's first 4 and chat's 2 (the
    first priority), then hog's other 4 (their user had 4 runs already), and the firings
    last, though they were queued first."""
    with private_cluster("fair-dispatch", ENV) as c:
        c.side_by_side(c.start_web, c.start_scheduler)
        fired = fire_then_delete(c, 3)
        asked: dict[str, list[str]] = {"hog": [], "chat": []}
        for user, n in (("hog", 8), ("chat", 2)):
            for i in range(n):
                body = {
                    "assistant_id": "lead_agent",
                    "input": human(f"{user} {i}"),
                    "config": SHORT,
                }
                tid = post(c.url, user, "/threads", {})["thread_id"]
                asked[user].append(str(post(c.url, user, f"/threads/{tid}/runs", body)["run_id"]))
        total = fired + 10
        c.start_worker("fair", concurrency=1)
        wait_for(
            lambda: (
                count(
                    c.settings.dsn,
                    "SELECT count(*) FROM runs WHERE status NOT IN ('pending', 'running')",
                )
                >= total
            ),
            timeout=120,
            what="every run to end",
        )
        order = runs_by_start(c.settings.dsn)
        assert len(order) == total
        users = [u for u, _ in order]
        # The firings, queued first, start after every run a caller asked for.
        assert users[-fired:] == ["sched"] * fired, users
        ids = [r for _, r in order]
        # The first priority (hog's first 4, chat's 2) before hog's further 4, in FIFO order
        # within each priority.
        assert ids[:6] == asked["hog"][:4] + asked["chat"], users
        assert ids[6:10] == asked["hog"][4:], users


def run_of(c: Cluster, user: str, config: dict[str, Any]) -> tuple[str, str]:
    """(thread id, run id) of a new run of `user` on a new thread."""
    tid = str(post(c.url, user, "/threads", {})["thread_id"])
    body = {"assistant_id": "lead_agent", "input": human(user), "config": config}
    return tid, str(post(c.url, user, f"/threads/{tid}/runs", body)["run_id"])


def status_of(c: Cluster, user: str, ids: tuple[str, str]) -> str:
    r = httpx.get(f"{c.url}/threads/{ids[0]}/runs/{ids[1]}", headers={"x-api-key": KEYS[user]})
    assert r.status_code == 200, r.text
    return str(r.json()["status"])


def test_r4_p7_a_callers_run_over_the_worker_share_does_not_yield_to_cron_firings(
    private_cluster: ClusterFactory,
) -> None:
    """A 4-slot worker whose per-user share is 1 slot. `chat` runs a 12 s run; crons of
    four other users then fill the 3 background slots with 6 s firings and queue more.
    chat's second run takes the first slot that frees, while its first still runs: it is
    not put back for the firings, which wait behind callers' runs by design. Before, the
    share check counted a cron user with no slot as waiting and put chat's run back until
    its first ended."""
    # The firings do not yield (`background_yield_slots` 0): they fill their share.
    env = {**ENV, "THREADRUN_WORKER_USER_SHARE": "0.25", "THREADRUN_BACKGROUND_YIELD_SLOTS": "0"}
    with private_cluster("fair-share-classes", env) as c:
        c.side_by_side(c.start_web, c.start_scheduler, lambda: c.start_worker("fair", 4))
        first = run_of(c, "chat", {"configurable": {"tokens": 24, "token_delay_ms": 500}})
        wait_for(lambda: status_of(c, "chat", first) == "running", timeout=30, what="chat's run")
        for user in CRON_USERS:
            post(
                c.url,
                user,
                "/runs/crons",
                {
                    "assistant_id": "lead_agent",
                    "schedule": "* * * * * *",
                    "input": human("tick"),
                    "config": {"configurable": {"tokens": 12, "token_delay_ms": 500}},
                },
            )
        firings = (
            "SELECT count(*) FROM runs r JOIN threads t USING (thread_id)"
            " WHERE t.owner LIKE 'cron%' AND r.status = '{}'"
        )
        wait_for(
            lambda: (
                count(c.settings.dsn, firings.format("running")) >= 3
                and count(c.settings.dsn, firings.format("pending")) >= 4
            ),
            timeout=30,
            what="three firings running and more waiting",
        )
        second = run_of(c, "chat", SHORT)
        wait_for(
            lambda: status_of(c, "chat", second) == "success", timeout=60, what="chat's 2nd run"
        )
        assert status_of(c, "chat", first) == "running"


def test_p7_firings_run_on_the_background_worker_and_callers_runs_on_the_runs_worker(
    private_cluster: ClusterFactory,
) -> None:
    """`make run`'s topology: a runs worker on `runs` only, a background worker on
    `runs.background` at nice 10 (shared/tools/supervisor.py). A cron's firings are taken
    by the background worker, whose process runs at the lower priority; a caller's run by
    the runs worker."""
    with private_cluster("background-worker", ENV) as c:
        _, runs, background, _ = c.side_by_side(
            c.start_web,
            lambda: c.start_worker("fg", 2, queues="runs"),
            lambda: c.start_worker(
                "bg",
                2,
                queues="runs.background",
                env={"THREADRUN_PROCESS_NICE": "10", "THREADRUN_WORKER_BACKGROUND_SHARE": "1"},
            ),
            c.start_scheduler,
        )
        fire_then_delete(c, 3)
        chat = run_of(c, "chat", SHORT)
        wait_for(lambda: status_of(c, "chat", chat) == "success", timeout=60, what="chat's run")
        wait_for(
            lambda: count(c.settings.dsn, SCHED_RUNS + " AND r.status = 'success'") >= 3,
            timeout=60,
            what="the firings to run",
        )
        with psycopg.connect(c.settings.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT t.owner, r.owner FROM runs r JOIN threads t USING (thread_id)"
                " WHERE r.status = 'success'"
            ).fetchall()
        pids: dict[str, set[int]] = {str(user): set() for user, _ in rows}
        for user, worker in rows:
            pids[str(user)].add(int(str(worker).split(":")[1]))  # worker id: host:pid:hex
        assert pids["sched"] == {background.pid} and pids["chat"] == {runs.pid}
        with open(f"/proc/{background.pid}/stat") as f:
            assert int(f.read().rsplit(")", 1)[1].split()[16]) == 10  # its nice value
