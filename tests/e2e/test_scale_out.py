"""Scale-out on one machine: two web processes and three runs workers sharing one
database and Redis prefix; clients alternate between the web processes' base URLs (round
robin), creating a run through one and joining, streaming or cancelling it through the other.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from shared.runs.model import TERMINAL_STATUSES
from shared.tools.testing import Cluster, read_stream
from tests.e2e.conftest import ALICE, ClusterFactory

pytestmark = pytest.mark.e2e

WEBS, WORKERS, WORKER_CONCURRENCY = 2, 3, 8
THREADS, RUNS_PER_THREAD, CLIENTS = 50, 4, 8
TOKENS = 3


@pytest.fixture(scope="module")
def scaled(private_cluster: ClusterFactory) -> Iterator[tuple[Cluster, str]]:
    """2 web processes + 3 runs workers on a database and prefix of their own. One user drives
    the whole load: the per-user limits (A3) are lifted, as in every test cluster."""
    with private_cluster("scale") as c:
        workers = [f"runs{i}" for i in range(WORKERS)]
        c.start(webs=WEBS, workers=workers, concurrency=WORKER_CONCURRENCY)
        yield c, c.settings.dsn


class RoundRobin:
    """Alternates requests between the web processes' base URLs; `other` is the next one
    after a given URL (used to finish a run through a web process that did not create it)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self._next = itertools.count()
        self._lock = threading.Lock()
        self._clients = {u: httpx.Client(base_url=u, headers={"x-api-key": ALICE}) for u in urls}

    def pick(self) -> tuple[str, httpx.Client]:
        with self._lock:
            url = self.urls[next(self._next) % len(self.urls)]
        return url, self._clients[url]

    def other(self, url: str) -> tuple[str, httpx.Client]:
        nxt = self.urls[(self.urls.index(url) + 1) % len(self.urls)]
        return nxt, self._clients[nxt]

    def close(self) -> None:
        for cl in self._clients.values():
            cl.close()


def body(text: str, tokens: int = TOKENS, delay_ms: float = 0) -> dict[str, Any]:
    return {
        "assistant_id": "lead_agent",
        "input": {"messages": [{"role": "user", "content": text}]},
        "stream_mode": ["messages-tuple", "values"],
        "config": {"configurable": {"tokens": tokens, "token_delay_ms": delay_ms}},
    }


def sql(dsn: str, query: str, params: Any = ()) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(query, params).fetchall()


def one_thread(rr: RoundRobin, n: int) -> list[dict[str, Any]]:
    """Create a thread and RUNS_PER_THREAD runs on it at once (enqueue), each through the next
    web process; then join each through the web process that did not create it."""
    _, cl = rr.pick()
    res = cl.post("/threads", json={"metadata": {"scale": n}}, timeout=30)
    assert res.status_code == 200, res.text
    tid = res.json()["thread_id"]
    made = []
    for k in range(RUNS_PER_THREAD):
        url, cl = rr.pick()
        res = cl.post(f"/threads/{tid}/runs", json=body(f"t{n} r{k}"), timeout=30)
        assert res.status_code == 200, res.text
        made.append({"thread_id": tid, "run_id": res.json()["run_id"], "created_via": url, "k": k})
    for run in made:
        url, cl = rr.other(run["created_via"])
        res = cl.get(f"/threads/{tid}/runs/{run['run_id']}/join", timeout=90)
        assert res.status_code == 200, res.text
        values = res.json()
        assert "__error__" not in values, values
        assert len(values["messages"]) >= 2 * (run["k"] + 1)
        run["joined_via"] = url
    return made


@pytest.mark.timeout(300)
def test_scale_out_200_runs_over_50_threads_complete_exactly_once(
    scaled: tuple[Cluster, str],
) -> None:
    """R1, R2, R4, L1, B2, B7, J4 at scale: 200 runs on 50 threads from 8 concurrent clients
    alternating between 2 web processes, executed by 3 workers: every run ends `success`
    exactly once (attempt 1, one claim, one terminal lifecycle event in the journal equal to
    the row's status, one `end` in its stream, the last event), each thread's runs ran one at
    a time in creation order, every join through the other web process returned the final
    values, and every worker executed runs."""
    c, dsn = scaled
    rr = RoundRobin(c.urls)
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            runs = [
                r for batch in pool.map(lambda n: one_thread(rr, n), range(THREADS)) for r in batch
            ]
        took = time.monotonic() - t0
        assert len(runs) == THREADS * RUNS_PER_THREAD
        assert all(r["created_via"] != r["joined_via"] for r in runs)
        assert {r["created_via"] for r in runs} == set(c.urls)

        # The durable record: row status, attempt and the journal's lifecycle events.
        rows = sql(
            dsn,
            "SELECT run_id::text, thread_id::text, status, attempt, owner, started_at, ended_at FROM runs",
        )
        assert len(rows) == len(runs)
        assert {r["run_id"] for r in rows} == {r["run_id"] for r in runs}
        assert {r["status"] for r in rows} == {"success"}, [
            r for r in rows if r["status"] != "success"
        ][:3]
        assert {r["attempt"] for r in rows} == {1}
        events = sql(
            dsn,
            "SELECT run_id::text, type FROM run_events WHERE category = 'lifecycle' ORDER BY run_id, seq",
        )
        kinds: dict[str, list[str]] = {}
        for e in events:
            kinds.setdefault(e["run_id"], []).append(e["type"])
        for r in rows:
            k = kinds[r["run_id"]]
            assert k.count("created") == 1 and k.count("claimed") == 1, k
            assert [x for x in k if x in TERMINAL_STATUSES] == ["success"], k
            assert "requeued" not in k, k
        # Runs of one thread never overlapped and ran in creation order (enqueue, R3).
        by_thread: dict[str, list[dict[str, Any]]] = {}
        for r in runs:
            by_thread.setdefault(r["thread_id"], []).append(r)
        row_of = {r["run_id"]: r for r in rows}
        for trs in by_thread.values():
            ordered = [row_of[r["run_id"]] for r in sorted(trs, key=lambda r: r["k"])]
            for a, b in itertools.pairwise(ordered):
                assert a["ended_at"] <= b["started_at"], (a, b)
        # The work was spread: every worker owned some runs.
        assert len({r["owner"] for r in rows}) >= WORKERS, {r["owner"] for r in rows}

        # The live record: each stream, read through the round robin, ends once, last, success.
        def check_stream(run: dict[str, Any]) -> None:
            _, cl = rr.pick()
            evs = read_stream(cl, run["thread_id"], run["run_id"], timeout=30)
            names = [e.event for e in evs]
            assert names[0] == "metadata" and evs[0].data["attempt"] == 1, names[:3]
            assert names.count("metadata") == 1 and names.count("end") == 1, names
            assert names[-1] == "end" and evs[-1].data["status"] == "success"
            assert "error" not in names
            ids = [tuple(map(int, e.id.split("-"))) for e in evs if e.id]
            assert ids == sorted(set(ids))

        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(check_stream, runs))
        print(
            f"\n{len(runs)} runs on {THREADS} threads via {WEBS} webs / {WORKERS} workers: {took:.1f} s"
        )
    finally:
        rr.close()


def test_cancel_and_join_cross_web_processes(scaled: tuple[Cluster, str]) -> None:
    """R5, B7, A1 across web processes: a long run created through web 0 is cancelled through
    web 1 (interrupt, wait=1) while a client joined through web 0 waits; the join returns,
    the row and the stream's single `end` say `interrupted`, and the thread takes a new run."""
    c, dsn = scaled
    with (
        httpx.Client(base_url=c.urls[0], headers={"x-api-key": ALICE}, timeout=60) as web0,
        httpx.Client(base_url=c.urls[1], headers={"x-api-key": ALICE}, timeout=60) as web1,
    ):
        tid = web0.post("/threads", json={}).json()["thread_id"]
        res = web0.post(f"/threads/{tid}/runs", json=body("long", tokens=2000, delay_ms=10))
        assert res.status_code == 200, res.text
        run_id = res.json()["run_id"]
        deadline = time.monotonic() + 30
        while web1.get(f"/threads/{tid}/runs/{run_id}").json()["status"] != "running":
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.1)
        with ThreadPoolExecutor(1) as pool:
            joined = pool.submit(web0.get, f"/threads/{tid}/runs/{run_id}/join")
            time.sleep(0.3)  # the join is waiting on web 0
            cancel = web1.post(
                f"/threads/{tid}/runs/{run_id}/cancel", params={"action": "interrupt", "wait": 1}
            )
            assert cancel.status_code == 200, cancel.text
            assert cancel.json()["status"] == "interrupted", cancel.json()
            join = joined.result(timeout=30)
        assert join.status_code == 200 and "__error__" not in join.json(), join.text
        (row,) = sql(dsn, "SELECT status FROM runs WHERE run_id = %s", (run_id,))
        assert row["status"] == "interrupted"
        evs = read_stream(web0, tid, run_id, timeout=30)
        names = [e.event for e in evs]
        assert names.count("end") == 1 and names[-1] == "end"
        assert evs[-1].data["status"] == "interrupted"
        assert sum(1 for n in names if n == "messages") < 2000  # stopped early
        again = web1.post(f"/threads/{tid}/runs/wait", json=body("again"))
        assert again.status_code == 200 and again.json()["messages"][-1]["type"] == "ai"
