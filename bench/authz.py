"""The project's auth (`auth.path`): what `@auth.authenticate` plus a filtering handler add
to a request, measured interleaved in the same run on the same database.

Run with `.venv/bin/python -m bench.authz [--n 1000]` (also part of `make bench`: the in-process
mode), or `--mode http [--requests 600] [--concurrency 4] [--rounds 10] [--seed 30]` / `--mode
both`. It uses a private database and Redis prefix (Sandbox), removed at the end.

Rows (p50/p99 µs per call, and the ratio to the baseline beside it):
- GET /threads/{id} and POST /threads/search through the Flask app in process, under an
  `auth.py` of the documentation's kind (a token table in `@auth.authenticate`, a global
  owner filter), against the same request with threadrun's own API key (no project auth);
- the decision alone (authenticate + authorize, each on its own event loop as the web
  runs them) against one PostgreSQL round trip (`SELECT 1` on the same pool).

`--mode http` (or `both`; not part of `make bench`, about a minute) measures the same through
real gunicorn gevent web processes, so each handler call also crosses to gevent's native
thread pool (`shared/authz/decide.py` `run_sync`). It starts one web process per auth setup on
one private database and Redis prefix (shared.tools.testing; no workers: nothing here runs):

- threadrun's own API keys (`THREADRUN_API_KEYS`, the built-in auth): the baseline;
- tests/fixtures/auth_project/langgraph.json (`auth.path`: a token table, `auth.cache` of 30 s
  on `authorization`, an owner filter whose `search` handler awaits 50 ms of "I/O");
- the `auth.py` above (a token table, no cache, an owner filter, no awaits);
- local single-user mode (no auth at all), for scale;

and through each, with the official langgraph-sdk from `--concurrency` client threads (each
its own keep-alive connection), `threads.get` of one of the caller's threads,
`threads.search(limit=10)` over the caller's threads (`--seed` each) and `threads.create`.
The setups take turns in short bursts (`--rounds`, rotated), so that noise from the machine
hits all of them alike. Per setup and operation: requests/s (requests over the bursts' wall
time), p50/p95 ms of a request as the client sees it, and the web process's CPU µs per
request (/proc, the gunicorn master and its worker); each beside its ratio to the API-key
baseline.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient
from pydantic import SecretStr

from app import create_app
from bench.chaos import bench_cluster, log, table
from bench.internals import percentile
from bench.scale import sandboxed, tree_cpu_s
from bench.store import Row, timed
from bench.system_cpu import BENCH_ERRORS, run_bench
from shared.authz.decide import RequestParts, run_sync
from shared.authz.loader import load_authorizer
from shared.db import make_pool
from shared.project import load_project
from shared.settings import PROJECT_ROOT, Settings
from shared.tools.testing import Sandbox

KEY = "bench-key"
AUTH_PY = """
from langgraph_sdk import Auth

auth = Auth()
TOKENS = {"tok-bench": {"identity": "bench", "permissions": ["write"]}}


@auth.authenticate
async def authenticate(authorization: str | None):
    user = TOKENS.get((authorization or "").removeprefix("Bearer "))
    if user is None:
        raise Auth.exceptions.HTTPException(status_code=401, detail="Invalid token")
    return user


@auth.on
async def owner_only(ctx, value):
    filters = {"owner": ctx.user.identity}
    metadata = value.setdefault("metadata", {})
    if metadata is not None:
        metadata.update(filters)
    return filters
"""


def project(folder: Path) -> Path:
    """A langgraph.json serving the lead agent under the auth.py above."""
    (folder / "auth.py").write_text(textwrap.dedent(AUTH_PY))
    lead = PROJECT_ROOT / "shared" / "agent" / "lead_agent.py"
    config = {"graphs": {"lead_agent": f"{lead}:graph"}, "auth": {"path": "./auth.py:auth"}}
    path = folder / "langgraph.json"
    path.write_text(json.dumps(config))
    return path


def run(settings: Settings, n: int) -> list[Row]:
    """Time every row, ours and baseline interleaved."""
    with tempfile.TemporaryDirectory(prefix="bench-authz-") as tmp:
        config = project(Path(tmp))
        plain = create_app(settings.model_copy(update={"api_keys": SecretStr(f"{KEY}:bench")}))
        authed = create_app(settings.model_copy(update={"config": config}))
        plain_http, authed_http = plain.test_client(), authed.test_client()
        plain_h = {"x-api-key": KEY}
        authed_h = {"Authorization": "Bearer tok-bench"}
        plain_tid = plain_http.post("/threads", json={}, headers=plain_h).json["thread_id"]
        authed_tid = authed_http.post("/threads", json={}, headers=authed_h).json["thread_id"]
        authorizer = load_authorizer(load_project(config))
        assert authorizer is not None
        parts = RequestParts("GET", "/threads", [("authorization", "Bearer tok-bench")])
        pool = make_pool(settings, name="bench-authz", max_size=2)
        rows: dict[str, tuple[list[float], list[float]]] = {
            "GET /threads/{id}: project auth vs API key": ([], []),
            "POST /threads/search: project auth vs API key": ([], []),
            "decision (authenticate + authorize) vs SELECT 1": ([], []),
        }
        get_rows, search_rows, decision_rows = rows.values()

        def decide() -> None:
            user = run_sync(authorizer.authenticate(parts))
            run_sync(authorizer.authorize(user, "threads", "read", {"thread_id": authed_tid}))

        def select_one() -> None:
            with pool.connection() as conn:
                conn.execute("SELECT 1").fetchone()

        for _ in range(n):  # interleaved, so machine noise hits every side alike
            get_rows[0].append(
                timed(partial(authed_http.get, f"/threads/{authed_tid}", headers=authed_h))
            )
            get_rows[1].append(
                timed(partial(plain_http.get, f"/threads/{plain_tid}", headers=plain_h))
            )
            search_rows[0].append(
                timed(partial(authed_http.post, "/threads/search", json={}, headers=authed_h))
            )
            search_rows[1].append(
                timed(partial(plain_http.post, "/threads/search", json={}, headers=plain_h))
            )
            decision_rows[0].append(timed(decide))
            decision_rows[1].append(timed(select_one))
        pool.close()
    return [Row(name, ours, base) for name, (ours, base) in rows.items()]


# --- through HTTP: real gevent web processes ----------------------------------------------------
FIXTURE = PROJECT_ROOT / "tests" / "fixtures" / "auth_project" / "langgraph.json"
HTTP_USER = "bench-http"
OPS = ("threads.get", "threads.search", "threads.create")


@dataclass
class Setup:
    """One web process's auth setup and the SDK clients that call it."""

    name: str
    env: dict[str, str]
    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    url: str = ""
    pid: int = 0
    clients: list[SyncLangGraphClient] = field(default_factory=list)
    thread_id: str = ""

    def client(self) -> SyncLangGraphClient:
        return get_sync_client(url=self.url, api_key=self.api_key, headers=self.headers)


@dataclass
class Tally:
    """One (setup, operation): every request's latency, the bursts' wall time, web CPU."""

    latencies_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    failed: int = 0

    @property
    def per_s(self) -> float:
        return len(self.latencies_s) / self.wall_s if self.wall_s > 0 else 0.0

    def ms(self, p: float) -> float:
        """The p-th percentile (0..100) of the latencies, in ms."""
        return percentile(self.latencies_s, p) * 1000

    @property
    def cpu_us(self) -> float:
        """Web CPU µs per request."""
        return 1e6 * self.cpu_s / len(self.latencies_s) if self.latencies_s else float("nan")


def http_table(setups: Sequence[str], tallies: dict[tuple[str, str], Tally]) -> str:
    """One row per (operation, setup): req/s, p50/p95 ms, web CPU µs/request, each with its
    ratio to the first setup (the baseline) on the same operation."""

    def x(ours: float, base: float) -> str:
        return f"{ours / base:.2f}x" if base > 0 else "-"

    rows: list[list[str]] = []
    for op in OPS:
        base = tallies[(setups[0], op)]
        for name in setups:
            t = tallies[(name, op)]
            rows.append(
                [
                    op,
                    name,
                    f"{len(t.latencies_s)}",
                    f"{t.per_s:,.0f} ({x(t.per_s, base.per_s)})",
                    f"{t.ms(50):.2f} ({x(t.ms(50), base.ms(50))})",
                    f"{t.ms(95):.2f} ({x(t.ms(95), base.ms(95))})",
                    f"{t.cpu_us:,.0f} ({x(t.cpu_us, base.cpu_us)})",
                    str(t.failed),
                ]
            )
    head = (
        "operation",
        "auth setup",
        "n",
        "req/s (vs API key)",
        "p50 ms (vs)",
        "p95 ms (vs)",
        "web CPU µs/req (vs)",
        "failed",
    )
    return table(head, rows)


def call(setup: Setup, op: str, c: SyncLangGraphClient) -> None:
    if op == "threads.get":
        c.threads.get(setup.thread_id)
    elif op == "threads.search":
        c.threads.search(limit=10)
    else:
        c.threads.create()


def burst(setup: Setup, op: str, n: int, pool: ThreadPoolExecutor, tally: Tally) -> None:
    """n calls of `op` on `setup`, split over its clients (one client thread each)."""
    per = [
        n // len(setup.clients) + (k < n % len(setup.clients)) for k in range(len(setup.clients))
    ]

    def worker(k: int) -> tuple[list[float], int]:
        c, out, failed = setup.clients[k], [], 0
        for _ in range(per[k]):
            t0 = time.perf_counter()
            try:
                call(setup, op, c)
            except httpx.HTTPError:  # counted, not fatal: the table says how many
                failed += 1
                continue
            out.append(time.perf_counter() - t0)
        return out, failed

    cpu0 = tree_cpu_s([setup.pid])
    t0 = time.perf_counter()
    results = list(pool.map(worker, range(len(setup.clients))))
    tally.wall_s += time.perf_counter() - t0
    tally.cpu_s += tree_cpu_s([setup.pid]) - cpu0
    for lat, failed in results:
        tally.latencies_s.extend(lat)
        tally.failed += failed


def http_setups(folder: Path) -> list[Setup]:
    own = project(folder)
    return [
        Setup("API key (baseline)", {"THREADRUN_API_KEYS": f"{KEY}:{HTTP_USER}"}, api_key=KEY),
        Setup(
            "project auth: tests/fixtures/auth_project",
            {"THREADRUN_CONFIG": str(FIXTURE)},
            headers={"Authorization": "Bearer tok-alice"},
        ),
        Setup(
            "project auth: bench auth.py",
            {"THREADRUN_CONFIG": str(own)},
            headers={"Authorization": "Bearer tok-bench"},
        ),
        Setup("none (local single-user mode)", {}),
    ]


def run_http(args: argparse.Namespace) -> str:
    """Start the web processes, seed, take turns in bursts; the table."""
    workdir = Path(tempfile.mkdtemp(prefix="threadrun-authz-"))
    with sandboxed(Settings()) as (sandbox, settings):
        log(f"authz: database {sandbox.db_name}, prefix {sandbox.prefix}, logs {workdir}")
        cluster = bench_cluster(settings, workdir)
        setups = http_setups(workdir)
        try:
            for st in setups:
                st.url = cluster.start_web(st.env)
                st.pid = next(p.pid for p in cluster.procs if p.url == st.url)
                st.clients = [st.client() for _ in range(args.concurrency)]
                for _ in range(args.seed):
                    st.thread_id = st.clients[0].threads.create()["thread_id"]
                page = st.clients[0].threads.search(limit=10)
                if len(page) != min(10, args.seed):  # every caller searches a page alike
                    raise RuntimeError(f"{st.name}: a search page of {len(page)} threads")
            tallies = {(st.name, op): Tally() for st in setups for op in OPS}
            per_burst = max(1, args.requests // args.rounds)
            with ThreadPoolExecutor(args.concurrency) as pool:
                for st in setups:  # warm-up: imports, pools, prepared statements, auth cache
                    for op in OPS:
                        burst(st, op, 2 * args.concurrency, pool, Tally())
                for r in range(args.rounds):
                    turn = setups[r % len(setups) :] + setups[: r % len(setups)]
                    for op in OPS:
                        for st in turn:
                            burst(st, op, per_burst, pool, tallies[(st.name, op)])
            for st in setups:
                for c in st.clients:
                    c.close()
        except BENCH_ERRORS:
            log(cluster.tails())
            raise
        finally:
            cluster.stop()
    return http_table([st.name for st in setups], tallies)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.authz", description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=("inprocess", "http", "both"), default="inprocess")
    p.add_argument("--n", type=int, default=1000, help="in process: calls per row")
    p.add_argument("--requests", type=int, default=600, help="http: requests per setup and op")
    p.add_argument("--concurrency", type=int, default=4, help="http: client threads")
    p.add_argument("--rounds", type=int, default=10, help="http: bursts per setup and op")
    p.add_argument("--seed", type=int, default=30, help="http: threads each caller starts with")
    return p.parse_args(argv)


def run_inprocess(n: int) -> str:
    sandbox = Sandbox(Settings())
    try:
        rows = run(sandbox.create(), n)
    finally:
        sandbox.destroy()
    head = ["operation", "p50 µs", "p99 µs", "baseline p50 µs", "ours/baseline"]
    return f"authz: {n} calls per row\n" + table(head, [r.cells() for r in rows])


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point."""
    args = parse_args(argv)
    if args.mode in ("inprocess", "both"):
        print(run_inprocess(args.n))
    if args.mode == "inprocess":
        return 0

    def body() -> None:
        text = run_http(args)
        print(
            f"authz over HTTP: one gevent web process per setup, {args.requests} requests per"
            f" setup and operation in {args.rounds} bursts, {args.concurrency} client thread(s)"
            " (official langgraph-sdk)\n" + text
        )

    return run_bench("authz", body)


if __name__ == "__main__":
    sys.exit(main())
