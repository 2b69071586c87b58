"""Assistants benchmark: what our assistant layers cost over a raw SELECT of the
same row(s) on the same pool, measured interleaved in one run.

Run with `.venv/bin/python -m bench.assistants [--n 1000]` (also part of `make bench`). It
uses a private database and Redis prefix (shared.tools.testing.Sandbox), removed at the end.

Rows (p50/p99 µs per call, and the ratio to the baseline beside it), for get (one of the
caller's assistants by id) and search (metadata filter over 50 of the caller's assistants
plus the system ones, limit 10):
- API: the HTTP view through the Flask app in process (authentication, validation, the
  manager, JSON), without a socket or gunicorn;
- manager: `AssistantManager` (id resolution, the served graphs, the store);
- store: `AssistantStore` alone (the visibility filter's SQL, the model);
- baseline: a raw `SELECT` of the same row(s) on the web's own pool, the rows left as dicts.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from pydantic import SecretStr

from app import create_app
from app.services import current_services
from bench.store import Row, rows_main, timed
from shared.assistants.manager import AssistantSpec
from shared.assistants.store import AssistantFilter
from shared.settings import Settings

KEY = "bench-key"
USER = "bench"
HEADERS = {"x-api-key": KEY}
RAW_GET_SQL = "SELECT * FROM assistants WHERE assistant_id = %s"
RAW_SEARCH_SQL = """
SELECT * FROM assistants WHERE owner = %s AND metadata @> %s::jsonb
ORDER BY created_at DESC, assistant_id LIMIT 10
"""


def run(settings: Settings, n: int) -> list[Row]:
    """Time every row, ours and the baseline interleaved (machine noise hits each alike)."""
    app = create_app(settings.model_copy(update={"api_keys": SecretStr(f"{KEY}:{USER}")}))
    http = app.test_client()
    with app.app_context():
        manager = current_services().assistants
        store, pool = manager.store, manager.store._pool
        graphs = list(current_services().registry.ids())
        ids = [
            manager.create(
                USER,
                AssistantSpec(
                    graph_id=graphs[0],
                    name=f"bench {i}",
                    metadata={"kind": "even" if i % 2 == 0 else "odd", "i": i},
                    config={"configurable": {"tokens": 8}},
                ),
            ).assistant_id
            for i in range(50)
        ]

    def raw(sql: str, *params: Any) -> list[dict[str, Any]]:
        with pool.connection() as conn:
            return conn.execute(sql, params).fetchall()

    target = ids[7]
    where = AssistantFilter(metadata={"kind": "even"})
    body = {"metadata": {"kind": "even"}, "limit": 10}
    series: dict[str, list[float]] = {}

    def add(name: str, fn: Any) -> None:
        series.setdefault(name, []).append(timed(fn))

    gets = [
        ("get api", partial(http.get, f"/assistants/{target}", headers=HEADERS)),
        ("get manager", partial(manager.get, USER, target)),
        ("get store", partial(store.get, target, USER, graphs)),
        ("get raw", partial(raw, RAW_GET_SQL, target)),
    ]
    search = partial(
        manager.search, USER, where, limit=10, offset=0, sort_by="created_at", sort_order="desc"
    )
    searches = [
        ("search api", partial(http.post, "/assistants/search", json=body, headers=HEADERS)),
        ("search manager", search),
        ("search store", partial(store.search, USER, graphs, where, limit=10, offset=0)),
        ("search raw", partial(raw, RAW_SEARCH_SQL, USER, '{"kind": "even"}')),
    ]
    for calls in (gets, searches):
        for i in range(n):
            # Interleaved, and rotated: the call right after an HTTP request pays for its
            # garbage (measured: +1.5 ms p50 for whichever layer always came second).
            for name, fn in calls[i % 4 :] + calls[: i % 4]:
                add(name, fn)
    return [
        Row("get: API (GET /assistants/{id})", series["get api"], series["get raw"]),
        Row("get: AssistantManager.get", series["get manager"], series["get raw"]),
        Row("get: AssistantStore.get", series["get store"], series["get raw"]),
        Row("search: API (POST /assistants/search)", series["search api"], series["search raw"]),
        Row("search: AssistantManager.search", series["search manager"], series["search raw"]),
        Row("search: AssistantStore.search", series["search store"], series["search raw"]),
    ]


def main() -> None:
    """CLI entry point."""
    rows_main(__doc__, "assistants", run, "raw SELECT")


if __name__ == "__main__":
    main()
