"""Store benchmark: what our store layers cost over LangGraph's `PostgresStore` called directly,
measured interleaved in the same run on the same pool.

Run with `.venv/bin/python -m bench.store [--n 1000]` (also part of `make bench`). It uses a
private database `threadrun_bench_<hex>` and Redis prefix `trbench:<hex>:` (Sandbox), removed
at the end.

Rows (p50/p99 µs per call, and the ratio to the baseline beside it), for put, get and search
(a prefix over 50 items, a filter, limit 10):
- API: the HTTP view through the Flask app in process (authentication, validation, the
  caller's scoped store, JSON), without a socket or gunicorn;
- scoped: `UserScopedStore` alone (namespace rewriting, a `PostgresStore` per call);
- baseline: `PostgresStore` on the same pool, the same op on an unscoped namespace.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from langgraph.store.postgres import PostgresStore
from pydantic import SecretStr

from app import create_app
from bench.chaos import table
from shared.db import make_pool
from shared.settings import Settings
from shared.store import StoreConfig, web_stores
from shared.tools.testing import Sandbox

KEY = "bench-key"
HEADERS = {"x-api-key": KEY}


@dataclass
class Row:
    """One operation of one layer beside its baseline."""

    name: str
    ours: list[float]
    baseline: list[float]

    def cells(self) -> list[str]:
        """The table cells: p50, p99, baseline p50, ratio."""

        def q(xs: list[float], p: int) -> float:
            return statistics.quantiles(xs, n=100)[p - 1] if len(xs) > 1 else xs[0]

        ours50, base50 = statistics.median(self.ours), statistics.median(self.baseline)
        return [
            self.name,
            f"{ours50 * 1e6:.0f}",
            f"{q(self.ours, 99) * 1e6:.0f}",
            f"{base50 * 1e6:.0f}",
            f"{ours50 / base50:.1f}x",
        ]


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(settings: Settings, n: int) -> list[Row]:
    """Time every row, ours and baseline interleaved."""
    app = create_app(settings.model_copy(update={"api_keys": SecretStr(f"{KEY}:bench")}))
    http = app.test_client()
    pool = make_pool(settings, name="bench-store", max_size=2)
    scoped = web_stores(pool, StoreConfig.from_file(settings.config)).for_user("bench")
    direct = PostgresStore(pool)
    for i in range(50):  # what the searches look through, on each side
        value = {"i": i, "kind": "even" if i % 2 == 0 else "odd", "text": "x" * 200}
        direct.put(("raw", "docs"), f"k{i}", value)
        scoped.put(("docs",), f"k{i}", value)
    value = {"text": "a note of about a hundred bytes " * 3, "n": 1}
    api_put: list[float] = []
    scoped_put: list[float] = []
    raw_put: list[float] = []
    api_get: list[float] = []
    scoped_get: list[float] = []
    raw_get: list[float] = []
    for i in range(n):  # interleaved, so machine noise hits every side alike
        body = {"namespace": ["notes"], "key": f"a{i}", "value": value}
        api_put.append(timed(partial(http.put, "/store/items", json=body, headers=HEADERS)))
        scoped_put.append(timed(partial(scoped.put, ("notes",), f"s{i}", value)))
        raw_put.append(timed(partial(direct.put, ("raw", "notes"), f"r{i}", value)))
        query = {"namespace": "notes", "key": f"a{i}"}
        api_get.append(
            timed(partial(http.get, "/store/items", query_string=query, headers=HEADERS))
        )
        scoped_get.append(timed(partial(scoped.get, ("notes",), f"s{i}")))
        raw_get.append(timed(partial(direct.get, ("raw", "notes"), f"r{i}")))
    search = {"namespace_prefix": ["docs"], "filter": {"kind": "even"}, "limit": 10}
    api_search: list[float] = []
    scoped_search: list[float] = []
    raw_search: list[float] = []
    for _ in range(n):
        api_search.append(
            timed(lambda: http.post("/store/items/search", json=search, headers=HEADERS))
        )
        scoped_search.append(timed(lambda: scoped.search(("docs",), filter={"kind": "even"})))
        raw_search.append(timed(lambda: direct.search(("raw", "docs"), filter={"kind": "even"})))
    pool.close()
    return [
        Row("put: API (PUT /store/items)", api_put, raw_put),
        Row("put: UserScopedStore", scoped_put, raw_put),
        Row("get: API (GET /store/items)", api_get, raw_get),
        Row("get: UserScopedStore", scoped_get, raw_get),
        Row("search: API (POST /store/items/search)", api_search, raw_search),
        Row("search: UserScopedStore", scoped_search, raw_search),
    ]


def rows_main(
    doc: str | None,
    name: str,
    run_rows: Callable[[Settings, int], list[Row]],
    baseline: str,
) -> None:
    """The CLI of a benchmark of rows against a baseline: `--n` calls per row, on a private
    database and Redis prefix (Sandbox) removed at the end; prints the table."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="calls per row")
    args = parser.parse_args()
    sandbox = Sandbox(Settings())
    try:
        rows = run_rows(sandbox.create(), args.n)
        head = ["operation", "p50 µs", "p99 µs", f"{baseline} p50 µs", "ours/baseline"]
        print(f"{name}: {args.n} calls per row\n" + table(head, [r.cells() for r in rows]))
    finally:
        sandbox.destroy()


def main() -> None:
    """CLI entry point."""
    rows_main(__doc__, "store", run, "PostgresStore")


if __name__ == "__main__":
    main()
