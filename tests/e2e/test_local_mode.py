"""A4: local single-user mode does not throttle its one user unless asked to.

Before the fix a benchmark or a test loop against `make run` got 429s from the multi-user
limits (60 runs a minute, 16 active runs). Sizes still apply; with
`THREADRUN_LIMIT_LOCAL_USER=true` the limits apply as to any user.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from shared.tools.testing import Cluster
from tests.e2e.conftest import ClusterFactory, human

pytestmark = pytest.mark.e2e

TINY = {
    "THREADRUN_API_KEYS": "",
    "THREADRUN_RUNS_PER_MINUTE": "2",
    "THREADRUN_MAX_ACTIVE_RUNS": "1",
    "THREADRUN_MAX_CONNECTIONS_PER_USER": "1",
    "THREADRUN_MAX_INPUT_BYTES": "1024",
}


@pytest.fixture(scope="module", params=["default", "limited"])
def local(request: pytest.FixtureRequest, private_cluster: ClusterFactory) -> Iterator[Cluster]:
    """A keyless web process on 127.0.0.1 (no worker: admitted runs stay pending)."""
    extra = {"THREADRUN_LIMIT_LOCAL_USER": "true"} if request.param == "limited" else {}
    with private_cluster(f"local-{request.param}", {**TINY, **extra}) as c:
        c.start_web()
        yield c


def test_a4_local_mode_is_not_throttled_unless_asked(local: Cluster) -> None:
    limited = local.env.get("THREADRUN_LIMIT_LOCAL_USER") == "true"
    with httpx.Client(base_url=local.url, timeout=30) as c:
        tid = c.post("/threads", json={}).json()["thread_id"]
        body = {"assistant_id": "lead_agent", "input": human("hi"), "multitask_strategy": "enqueue"}
        codes = [c.post(f"/threads/{tid}/runs", json=body).status_code for _ in range(5)]
        assert codes == ([200, 429, 429, 429, 429] if limited else [200] * 5), codes
        big = {**body, "input": human("x" * 2048)}
        r = c.post(f"/threads/{tid}/runs", json=big)
        assert r.status_code == 422 and r.json()["limit"] == "max_input_bytes", r.text
