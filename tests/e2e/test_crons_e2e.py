"""Crons end to end through the official langgraph-sdk against real processes (crons).

`client.crons.create_for_thread / create / search / count / update / delete` on a web
process, a runs worker and the cron scheduler (Celery beat with workers/cron_beat.py's
scheduler); a cron on a thread fires runs on it, a cron without a thread fires each run on
a temporary thread deleted after the run (`on_run_completed=delete`); ALICE and BOB do not
see each other's crons; bad schedules and payloads are 4xx naming the field. And two
schedulers, one SIGKILLed mid-way: every tick fired exactly once (one firing row, one run).
Firings count against their owner's run limits, and a revoked owner's cron is disabled.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx
import psycopg
import pytest
from langgraph_sdk.client import LangGraphClient

from shared.auth.keys import ApiKeyStore
from shared.db import make_pool
from shared.tools.testing import Cluster, wait_for
from tests.e2e.conftest import ALICE, BOB, FAST_LEASES, ClusterFactory, human
from tests.e2e.conftest import run_sdk as run

pytestmark = pytest.mark.e2e

FAST_CRONS = {"THREADRUN_CRON_TICK_S": "0.5", "THREADRUN_CRON_MIN_INTERVAL_S": "1"}
EVERY_SECOND = "* * * * * *"  # croniter's sixth field: seconds


async def status_of(coro: Any) -> int:
    """The HTTP status an SDK call failed with (200 when it did not fail)."""
    try:
        await coro
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code
    return 200


def firings(c: Cluster, cron_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(c.settings.dsn, row_factory=psycopg.rows.dict_row) as conn:
        return list(
            conn.execute(
                "SELECT * FROM cron_firings WHERE cron_id = %s ORDER BY tick_at", (cron_id,)
            ).fetchall()
        )


def post(c: Cluster, path: str, body: dict[str, Any], key: str = ALICE) -> httpx.Response:
    return httpx.post(f"{c.url}{path}", json=body, headers={"x-api-key": key}, timeout=10)


def test_crons_through_the_sdk(private_cluster: ClusterFactory) -> None:
    """Crons: every crons.* call of the SDK; firing on a thread and without one (the
    temporary thread deleted after its run); owner isolation; 4xx naming the field."""
    with private_cluster("crons-sdk", {**FAST_LEASES, **FAST_CRONS}) as c:
        c.side_by_side(c.start_web, lambda: c.start_worker(concurrency=4), c.start_scheduler)

        async def on_thread(client: LangGraphClient) -> tuple[str, dict[str, Any]]:
            thread = await client.threads.create()
            cron = await client.crons.create_for_thread(
                thread["thread_id"],
                "lead_agent",
                schedule=EVERY_SECOND,
                input=human("tick"),
                metadata={"team": "a"},
                multitask_strategy="enqueue",
            )
            return thread["thread_id"], dict(cron)

        thread_id, cron = run(on_thread, c.url)
        assert cron["thread_id"] == thread_id and cron["schedule"] == EVERY_SECOND
        assert cron["enabled"] is True and cron["next_run_date"] is not None
        assert cron["user_id"] == "alice" and cron["payload"]["input"] == human("tick")

        async def cron_runs(client: LangGraphClient) -> list[Any]:
            runs = await client.runs.list(thread_id, limit=100)
            return [r for r in runs if r["metadata"].get("cron_id") == cron["cron_id"]]

        fired = wait_for(
            lambda: [r for r in run(cron_runs, c.url) if r["status"] == "success"],
            timeout=30,
            what="a successful run fired by the thread's cron",
            detail=lambda: c.tails(20),
        )
        assert fired[0]["thread_id"] == thread_id

        # A cron without a thread: each firing on a new thread, deleted after its run.
        async def stateless(client: LangGraphClient) -> dict[str, Any]:
            return dict(
                await client.crons.create("lead_agent", schedule=EVERY_SECOND, input=human("hi"))
            )

        free = run(stateless, c.url)
        assert free["thread_id"] is None and free["on_run_completed"] == "delete"
        first = wait_for(
            lambda: [f for f in firings(c, free["cron_id"]) if f["run_id"]],
            timeout=30,
            what="a firing of the cron without a thread",
        )[0]

        async def thread_gone(client: LangGraphClient) -> bool:
            return await status_of(client.threads.get(str(first["thread_id"]))) == 404

        wait_for(lambda: run(thread_gone, c.url), timeout=30, what="the temporary thread deleted")

        # search / count / isolation
        async def listing(client: LangGraphClient) -> tuple[Any, ...]:
            return (
                await client.crons.search(),
                await client.crons.count(),
                await client.crons.search(thread_id=thread_id, select=["cron_id", "schedule"]),
                await client.crons.count(metadata={"team": "a"}),
                await client.crons.search(sort_by="created_at", sort_order="asc", limit=1),
            )

        everything, n, on_that_thread, team, oldest = run(listing, c.url)
        assert n == 2 and {x["cron_id"] for x in everything} == {cron["cron_id"], free["cron_id"]}
        assert on_that_thread == [{"cron_id": cron["cron_id"], "schedule": EVERY_SECOND}]
        assert team == 1 and oldest[0]["cron_id"] == cron["cron_id"]

        async def bob(client: LangGraphClient) -> tuple[Any, ...]:
            return (
                await client.crons.search(),
                await client.crons.count(),
                await status_of(client.crons.update(cron["cron_id"], enabled=False)),
                await status_of(client.crons.delete(cron["cron_id"])),
                await status_of(
                    client.crons.create_for_thread(thread_id, "lead_agent", schedule="0 * * * *")
                ),
            )

        assert run(bob, c.url, BOB) == ([], 0, 404, 404, 404)

        # update: disable stops the firings; delete removes the cron
        async def disable(client: LangGraphClient) -> dict[str, Any]:
            return dict(await client.crons.update(free["cron_id"], enabled=False))

        assert run(disable, c.url)["enabled"] is False
        time.sleep(1.5)  # a firing already in its transaction may still commit
        settled = len(firings(c, free["cron_id"]))
        time.sleep(2.0)
        assert len(firings(c, free["cron_id"])) == settled

        async def change(client: LangGraphClient) -> tuple[Any, ...]:
            updated = await client.crons.update(
                cron["cron_id"], schedule="0 9 * * *", timezone="Europe/Paris", input=human("x")
            )
            await client.crons.delete(free["cron_id"])
            return (
                updated,
                await client.crons.count(),
                await status_of(client.crons.delete(free["cron_id"])),
            )

        updated, n, again = run(change, c.url)
        assert updated["schedule"] == "0 9 * * *" and updated["timezone"] == "Europe/Paris"
        assert updated["payload"]["input"] == human("x")
        assert updated["next_run_date"].endswith(("07:00:00+00:00", "08:00:00+00:00"))
        assert n == 1 and again == 404

        # 4xx naming the field, at create time
        bad = [
            ({"assistant_id": "lead_agent", "schedule": "every day"}, 422, "schedule"),
            ({"assistant_id": "lead_agent", "schedule": "hourly", "foo": 1}, 422, "schedule"),  # foo: ignored
            ({"assistant_id": "lead_agent"}, 422, "schedule"),
            ({"assistant_id": "lead_agent", "schedule": "0 * * * *", "timezone": "Mars/X"}, 422, "timezone"),
            ({"assistant_id": "lead_agent", "schedule": "0 * * * *", "multitask_strategy": "x"}, 422, "multitask_strategy"),
            ({"assistant_id": "lead_agent", "schedule": "0 * * * *", "stream_mode": ["nope"]}, 422, "stream_mode"),
            ({"assistant_id": "lead_agent", "schedule": "0 * * * *", "after_seconds": 5}, 422, None),
            ({"assistant_id": "no-such-assistant", "schedule": "0 * * * *"}, 404, None),
        ]  # fmt: skip
        for body, status, field in bad:
            resp = post(c, "/runs/crons", body)
            assert resp.status_code == status, (body, resp.text)
            if field:
                assert resp.json()["field"] == field, resp.json()
        resp = post(c, f"/threads/{thread_id}/runs/crons", {**bad[0][0]})
        assert resp.status_code == 422 and resp.json()["field"] == "schedule"
        resp = post(
            c, f"/threads/{thread_id}/runs/crons",
            {"assistant_id": "lead_agent", "schedule": "0 * * * *", "on_run_completed": "keep"},
        )  # fmt: skip
        assert resp.status_code == 422 and resp.json()["field"] == "on_run_completed"
        assert httpx.get(f"{c.url}/openapi.json").json()["paths"]["/runs/crons/search"]["post"]


def test_two_schedulers_one_killed_fire_each_tick_once(private_cluster: ClusterFactory) -> None:
    """Crons: two scheduler processes over 30 crons due every second, in batches of 4;
    one SIGKILLed mid-way. Every fired tick has exactly one firing row (the primary key) and
    exactly one run, every run of a cron belongs to one firing, and ticks go on after the
    kill. No runs worker: the runs stay pending, the proof is in PostgreSQL."""
    env = {**FAST_CRONS, "THREADRUN_CRON_BATCH_SIZE": "4"}
    with private_cluster("crons-two", env) as c:
        _, a, b = c.side_by_side(
            c.start_web,
            lambda: c.start_scheduler("scheduler-a"),
            lambda: c.start_scheduler("scheduler-b"),
        )

        async def create(client: LangGraphClient) -> list[str]:
            crons = [
                await client.crons.create(
                    "lead_agent", schedule=EVERY_SECOND, on_run_completed="keep"
                )
                for _ in range(30)
            ]
            return [x["cron_id"] for x in crons]

        ids = run(create, c.url)

        def fired_ticks(since: float = 0.0) -> set[str]:
            """The crons (of `ids`) with a firing of a tick later than `since` (epoch s)."""
            with psycopg.connect(c.settings.dsn) as conn:
                rows = conn.execute(
                    "SELECT DISTINCT cron_id::text FROM cron_firings"
                    " WHERE cron_id = ANY(%s::uuid[]) AND tick_at > to_timestamp(%s)",
                    (ids, since),
                ).fetchall()
            return {r[0] for r in rows}

        # Both schedulers are ticking: every cron fired at least once before the kill.
        wait_for(
            lambda: fired_ticks() == set(map(str, ids)),
            timeout=30,
            what="every cron to fire before the kill",
            detail=lambda: c.tails(10),
        )
        a.stop(signal.SIGKILL)
        killed_at = time.time()
        # B alone goes on: every cron fires a tick later than a second after the kill.
        wait_for(
            lambda: fired_ticks(killed_at + 1) == set(map(str, ids)),
            timeout=30,
            what="the surviving scheduler to fire every cron after the kill",
            detail=lambda: c.tails(10),
        )
        b.stop()
        # Which of the two fired a given tick is a race (SKIP LOCKED): at least one fired
        # before the kill, and B alone fired every cron after it (checked below).
        assert "cron tick:" in a.output() + b.output(), c.tails(10)

        with psycopg.connect(c.settings.dsn, row_factory=psycopg.rows.dict_row) as conn:
            rows = conn.execute(
                "SELECT f.cron_id, f.tick_at, f.run_id, f.outcome,"
                " (SELECT count(*) FROM runs r WHERE r.run_id = f.run_id) AS runs"
                " FROM cron_firings f WHERE f.cron_id = ANY(%s::uuid[])",
                (ids,),
            ).fetchall()
            per_cron = conn.execute(
                "SELECT metadata->>'cron_id' AS cron_id, count(*) AS n FROM runs"
                " WHERE metadata->>'cron_id' = ANY(%s) GROUP BY 1",
                ([str(i) for i in ids],),
            ).fetchall()
        assert rows and all(r["outcome"] == "admitted" and r["runs"] == 1 for r in rows)
        ticks = {(str(r["cron_id"]), r["tick_at"]) for r in rows}
        assert len(ticks) == len(rows)  # one firing row per (cron, tick): the primary key
        fired = {str(r["cron_id"]): 0 for r in rows}
        for r in rows:
            fired[str(r["cron_id"])] += 1
        assert {r["cron_id"]: r["n"] for r in per_cron} == fired  # one run per firing, no more
        after = [r for r in rows if r["tick_at"].timestamp() > killed_at + 1]
        assert {str(r["cron_id"]) for r in after} == set(map(str, ids))  # B fired on alone


def test_a4_cron_firings_and_api_runs_share_the_active_run_limit(
    private_cluster: ClusterFactory,
) -> None:
    """A4 through the real scheduler: `max_active_runs` 2 and no worker (runs stay pending),
    4 of alice's crons due every second on threads of their own: never more than 2 of her
    runs exist, the other firings are recorded `limited` naming the limit, and her next
    API run is a 429 naming `max_active_runs`; bob, under no cron, still runs."""
    env = {**FAST_LEASES, **FAST_CRONS, "THREADRUN_MAX_ACTIVE_RUNS": "2"}
    with private_cluster("crons-limits", env) as c:
        c.side_by_side(c.start_web, c.start_scheduler)

        async def four_crons(client: LangGraphClient) -> list[str]:
            out = []
            for _ in range(4):
                thread = await client.threads.create()
                cron = await client.crons.create_for_thread(
                    thread["thread_id"], "lead_agent", schedule=EVERY_SECOND, input=human("t")
                )
                out.append(cron["cron_id"])
            return out

        ids = run(four_crons, c.url)
        limited = wait_for(
            lambda: [f for cid in ids for f in firings(c, cid) if f["outcome"] == "limited"][3:],
            timeout=30,
            what="firings over the active-run limit",
            detail=lambda: c.tails(20),
        )
        assert all("at most 2 pending or running runs" in f["error"] for f in limited)
        with psycopg.connect(c.settings.dsn) as conn:
            (alices,) = conn.execute(
                "SELECT count(*) FROM runs JOIN threads USING (thread_id)"
                " WHERE threads.owner = 'alice'"
            ).fetchone() or (0,)
        assert alices == 2
        refused = post(c, "/runs", {"assistant_id": "lead_agent", "input": human("x")})
        assert refused.status_code == 429 and refused.json()["limit"] == "max_active_runs"
        assert post(c, "/threads", {}, key=BOB).status_code == 200


def test_a4_a_revoked_users_crons_stop_and_ops_deletes_them(
    private_cluster: ClusterFactory,
) -> None:
    """A4 through the real scheduler: carol's key fires her cron every second; once it is
    revoked, the next firing is `disabled` (the cron with it) and no run follows; carol can
    no longer delete it (401), ops lists it with its last outcome and deletes it, audited."""
    ops_key = "key-ops-crons"
    env = {
        **FAST_LEASES,
        **FAST_CRONS,
        "THREADRUN_API_KEYS": f"key-alice:alice,{ops_key}:operator:ops",
        "THREADRUN_API_KEY_CACHE_TTL_S": "1",
    }
    with private_cluster("crons-revoked", env) as c:
        c.side_by_side(c.start_web, c.start_scheduler)
        pool = make_pool(c.settings, name="test-crons-keys", max_size=1)
        try:
            record, secret = ApiKeyStore(pool).create("carol")
            made = post(
                c, "/runs/crons", {"assistant_id": "lead_agent", "schedule": EVERY_SECOND}, secret
            )
            assert made.status_code == 200, made.text
            cron_id = made.json()["cron_id"]
            wait_for(
                lambda: any(f["outcome"] == "admitted" for f in firings(c, cron_id)),
                timeout=30,
                what="carol's cron firing while her key is valid",
            )
            ApiKeyStore(pool).revoke(str(record.key_id))
            last = wait_for(
                lambda: [f for f in firings(c, cron_id) if f["outcome"] == "disabled"],
                timeout=30,
                what="the firing after the revocation",
                detail=lambda: c.tails(20),
            )[0]
            assert "has no active credential" in last["error"]
            time.sleep(2 * float(FAST_CRONS["THREADRUN_CRON_TICK_S"]))  # ticks that must not fire
            assert firings(c, cron_id)[-1]["tick_at"] == last["tick_at"]
        finally:
            pool.close()
        gone = httpx.delete(f"{c.url}/runs/crons/{cron_id}", headers={"x-api-key": secret})
        assert gone.status_code == 401

        ops = {"x-api-key": ops_key}
        listed = httpx.get(f"{c.url}/ops/api/crons", params={"user_id": "carol"}, headers=ops)
        assert listed.status_code == 200, listed.text
        (row,) = listed.json()["crons"]
        assert (row["cron_id"], row["enabled"], row["last_outcome"]) == (cron_id, False, "disabled")
        assert (
            httpx.get(f"{c.url}/ops/api/crons", headers={"x-api-key": "key-alice"}).status_code
            == 403
        )
        assert (
            httpx.get(f"{c.url}/ops/api/crons", params={"limit": 0}, headers=ops).status_code == 422
        )
        deleted = httpx.delete(f"{c.url}/ops/api/crons/{cron_id}", headers=ops)
        assert deleted.status_code == 200 and deleted.json()["audit"]["action"] == "cron.delete"
        assert deleted.json()["audit"]["detail"]["user_id"] == "carol"
        again = httpx.delete(f"{c.url}/ops/api/crons/{cron_id}", headers=ops)
        assert again.status_code == 404
        bad = httpx.delete(f"{c.url}/ops/api/crons/not-a-uuid", headers=ops)
        assert bad.status_code == 422 and bad.json()["field"] == "cron_id"
        assert httpx.get(f"{c.url}/ops/api/crons", headers=ops).json()["crons"] == []
