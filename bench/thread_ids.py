"""What per-owner thread ids cost a request (A4, shared/runs/thread_ids.py).

Through the Flask app in process (no network), on a private database (shared.tools.testing.Sandbox)
dropped at the end: the lookup of a client's id (`RunStore.resolve_thread_id`, one indexed
query on (owner, public_id)), then the same reads on a thread the server named (one id for
both: nothing to rewrite) and on one whose id the client chose (its storage id rewritten into
the client's id in the answer). Prints p50 / p95 in milliseconds.

    python -m bench.thread_ids [--runs 20] [--repeat 200]
"""

from __future__ import annotations

import argparse
import uuid

from pydantic import SecretStr

from bench.chaos import table
from bench.thread_search import _timed
from shared.settings import Settings
from shared.tools.testing import Sandbox

KEY = "key-bench"


def main(argv: list[str] | None = None) -> None:
    """Make the two threads, then time the lookups and reads."""
    parser = argparse.ArgumentParser(prog="python -m bench.thread_ids")
    parser.add_argument("--runs", type=int, default=20, help="run rows on each thread")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args(argv)

    from app import create_app
    from app.services import current_services
    from shared.runs.model import MultitaskStrategy, RunRequest

    base = Settings().model_copy(update={"api_keys": SecretStr(f"{KEY}:bench")})
    with Sandbox(base, "tids", uses_redis=False) as settings:
        app = create_app(settings)
        client = app.test_client()
        headers = {"x-api-key": KEY}
        with app.app_context():
            store = current_services().store
            made = client.post("/threads", json={}, headers=headers).get_json()["thread_id"]
            chosen = str(uuid.uuid4())
            client.post("/threads", json={"thread_id": chosen}, headers=headers)
            for public in (made, chosen):
                storage = store.resolve_thread_id("bench", public)
                for _ in range(args.runs):
                    admission = store.admit(
                        RunRequest(thread_id=storage, assistant_id="lead_agent"),
                        run_id=str(uuid.uuid4()),
                        owner="bench",
                        graph_id="lead_agent",
                        strategy=MultitaskStrategy.ENQUEUE,
                    )
                    assert admission.run is not None

            def get(path: str) -> None:
                res = client.get(path, headers=headers)
                assert res.status_code == 200, res.get_data(as_text=True)

            rows = []
            for what, public in (("server-made id", made), ("client-chosen id", chosen)):
                p50, p95 = _timed(lambda p=public: store.resolve_thread_id("bench", p), args.repeat)
                rows.append([f"resolve_thread_id, {what}", f"{p50:.3f}", f"{p95:.3f}"])
                for name, path in (
                    ("GET /threads/{id}", f"/threads/{public}"),
                    (f"GET /threads/{{id}}/runs ({args.runs})", f"/threads/{public}/runs"),
                ):
                    p50, p95 = _timed(lambda path=path: get(path), args.repeat)
                    rows.append([f"{name}, {what}", f"{p50:.3f}", f"{p95:.3f}"])
    print(
        f"thread ids: {args.repeat} calls per row\n"
        + table(["operation", "p50 ms", "p95 ms"], rows)
    )


if __name__ == "__main__":
    main()
