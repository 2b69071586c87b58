"""A short fixed-seed chaos run (tests/chaos/harness.py) for `make test`.

One web host, two worker hosts, Redis primary + replica, PostgreSQL and a client host, each
its own network namespace; 24 s of SSE and WebSocket chat clients under a seeded schedule of
worker kills and pauses, PostgreSQL restarts and partitions (worker to PostgreSQL or Redis,
web to Redis); every invariant of tests/chaos/checker.py must hold (L2 fencing, L4/L5
recovery, B5/B9 gaps).
The full run with every fault kind is `make chaos` (~3 min). Needs root for the namespaces:
skipped, saying so, otherwise.
"""

from __future__ import annotations

import pytest

from tests.chaos.harness import Config, run_chaos
from tests.chaos.net import netns_available

pytestmark = pytest.mark.e2e

SEED = 42
KINDS = [
    "worker_kill",
    "pg_restart",
    "worker_pg_partition",
    "web_redis_partition",
    "worker_redis_partition",
    "worker_pause",
]
"""The fault kinds of the short run (`make chaos` adds worker_delay and, with Sentinel,
redis_failover). SEED draws a worker pause, a PostgreSQL restart and a worker cut from Redis
past the lease's TTL (the lost tail at a resumed attempt, B5: docs/chaos.md)."""


@pytest.mark.timeout(240)
def test_l2_l4_b5_short_chaos_run_holds_every_invariant() -> None:
    why = netns_available()
    if why is not None:
        pytest.skip(f"the chaos test needs network namespaces: {why}")
    cfg = Config(
        seed=SEED,
        duration_s=24,
        recovery_s=30,
        webs=1,
        workers=2,
        sentinels=0,
        sse_clients=2,
        ws_clients=2,
        kinds=KINDS,
    )
    res = run_chaos(cfg)
    print(res.text)
    assert len(res.faults) >= 2, f"the nemesis applied {len(res.faults)} faults"
    assert res.report.runs, "the workload admitted no run"
    assert res.ok, f"seed {SEED}: {res.text}"
