"""What `values` and `interrupts` on thread objects cost a search page (`POST /threads/search`).

100 threads, each with a few runs of `lead_agent` checkpointed in PostgreSQL, read back as one
search page of 100 through the Flask app in process (no network), on a private database
(shared.tools.testing.Sandbox) dropped at the end. Prints the page's latency (p50 / p95 ms) served
from the stored head copies (`thread_heads`), the same page with every head
computed from its checkpoint (what a thread whose values exceed
THREADRUN_THREAD_VALUES_MAX_BYTES, or one with no current copy, costs), and beside them the
page without values (`select`) and the thread rows alone (`RunStore.search_threads`).

    python -m bench.thread_search [--threads 100] [--turns 3] [--repeat 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from pydantic import SecretStr

from shared.settings import Settings
from shared.tools.testing import Sandbox

KEY = "key-bench"


def _timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """p50 and p95 of `fn` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[max(0, int(len(times) * 0.95) - 1)]


def main(argv: list[str] | None = None) -> None:
    """Build the threads, then time the page."""
    parser = argparse.ArgumentParser(prog="python -m bench.thread_search")
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args(argv)

    from app import create_app
    from app.services import current_services
    from shared.state.savers import StatePostgresSaver

    base = Settings().model_copy(update={"api_keys": SecretStr(f"{KEY}:bench")})
    with Sandbox(base, "tsearch", uses_redis=False) as settings:
        app = create_app(settings)
        client = app.test_client()
        headers = {"x-api-key": KEY}
        with app.app_context():
            svc = current_services()
            saver = StatePostgresSaver(svc.store._pool, mode=settings.checkpoint_mode)
            graph = svc.registry.get("lead_agent").copy(update={"checkpointer": saver})
            for i in range(args.threads):
                res = client.post(
                    "/threads", json={"metadata": {"graph_id": "lead_agent"}}, headers=headers
                )
                tid = res.get_json()["thread_id"]
                for turn in range(args.turns):
                    graph.invoke(
                        {"messages": [{"role": "user", "content": f"thread {i} turn {turn}"}]},
                        {"configurable": {"thread_id": tid, "tokens": 8}},
                    )

            def page() -> None:
                res = client.post("/threads/search", json={"limit": args.threads}, headers=headers)
                assert res.status_code == 200  # (the body is not parsed: client-side cost)

            def slim() -> None:
                body = {"limit": args.threads, "select": ["thread_id", "metadata", "status"]}
                res = client.post("/threads/search", json=body, headers=headers)
                assert res.status_code == 200

            def rows() -> None:
                svc.store.search_threads(
                    "bench",
                    metadata={},
                    status=None,
                    ids=None,
                    limit=args.threads,
                    offset=0,
                    sort_by="created_at",
                    sort_order="desc",
                )

            sample = client.post("/threads/search", json={"limit": 1}, headers=headers).get_json()
            has_values = sample[0].get("values") is not None
            size = len(
                client.post("/threads/search", json={"limit": args.threads}, headers=headers).data
            )
            p50, p95 = _timed(page, args.repeat)  # (the warm-up stores the copies)
            s50, _ = _timed(slim, args.repeat)
            r50, _ = _timed(rows, args.repeat)
            # Every head over the cap: the copies hold no values, each read computes them.
            svc.state.values_max_bytes = 0
            with svc.store._pool.connection() as conn:
                conn.execute("DELETE FROM thread_heads")
            c50, c95 = _timed(page, args.repeat)
        print(
            "| threads | turns | values on threads | page KB | page p50 / p95 ms (head copies)"
            " | page p50 / p95 ms (heads from checkpoints) | page with `select` (no values)"
            " p50 ms | thread rows alone p50 ms |"
        )
        print("|---|---|---|---|---|---|---|---|")
        print(
            f"| {args.threads} | {args.turns} | {has_values} | {size / 1024:.0f}"
            f" | {p50:.1f} / {p95:.1f} | {c50:.1f} / {c95:.1f} | {s50:.1f} | {r50:.1f} |"
        )


if __name__ == "__main__":
    main()
