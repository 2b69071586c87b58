"""The project's auth (`auth.path`): what `@auth.authenticate` plus a filtering handler add
to a request, measured interleaved in the same run on the same database.

Run with `.venv/bin/python -m bench.authz [--n 1000]` (also part of `make bench`). It uses a
private database and Redis prefix (Sandbox), removed at the end.

Rows (p50/p99 µs per call, and the ratio to the baseline beside it):
- GET /threads/{id} and POST /threads/search through the Flask app in process, under an
  `auth.py` of the documentation's kind (a token table in `@auth.authenticate`, a global
  owner filter), against the same request with threadrun's own API key (no project auth);
- the decision alone (authenticate + authorize, each on its own event loop as the web
  runs them) against one PostgreSQL round trip (`SELECT 1` on the same pool).
"""

from __future__ import annotations

import json
import tempfile
import textwrap
from functools import partial
from pathlib import Path

from pydantic import SecretStr

from app import create_app
from bench.store import Row, rows_main, timed
from shared.authz.decide import RequestParts, run_sync
from shared.authz.loader import load_authorizer
from shared.db import make_pool
from shared.project import load_project
from shared.settings import PROJECT_ROOT, Settings

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


def main() -> None:
    """CLI entry point."""
    rows_main(__doc__, "authz", run, "baseline")


if __name__ == "__main__":
    main()
