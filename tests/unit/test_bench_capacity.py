"""The capacity model of bench/capacity.py (pure: no services): cores, workers by Little's
law, Redis memory, and the first bottleneck among the parts that do not scale out."""

from __future__ import annotations

import math

from bench.capacity import Costs, ceilings, plan, report


def costs(**kw: float) -> Costs:
    base = dict(
        runs=100,
        concurrency=10,
        runs_per_s=10.0,
        events_per_run=200.0,
        failed=0,
        client_run_s=1.0,
        exec_s=0.5,
        web_ms=10.0,
        worker_ms=20.0,
        postgres_ms=5.0,
        redis_ms=2.0,
        redis_commands=50.0,
        stream_bytes=10_240.0,
        pg_xacts=10.0,
        pg_bytes=25_000.0,
        xadd_us=2.0,
        insert_us=50.0,
        worker_slots=8,
        db_pool_max=20,
        checkpoint_savers=8,
        stream_ttl_s=300,
    )
    base.update(kw)
    return Costs(**base)  # type: ignore[arg-type]


def test_plan_sizes_each_part_from_its_cost_per_run() -> None:
    p = plan(costs(), rate=100, utilisation=0.5)
    assert math.isclose(p.web_cores, 100 * 0.010 / 0.5)  # 2 cores
    assert p.web_processes == 2
    assert math.isclose(p.worker_cores, 4.0)
    assert math.isclose(p.inflight_runs, 50.0)  # Little: 100/s x 0.5 s
    assert p.workers == max(math.ceil(50 / 8), 4)  # slots need 7, cores need 4
    assert math.isclose(p.open_streams, 100.0)
    assert p.postgres_connections == 2 * 20 + 7 * (20 + 8)
    assert math.isclose(p.redis_memory_mib, 100 * 300.5 * 10_240 / 1024**2)
    assert math.isclose(p.postgres_xacts_per_s, 1000.0)


def test_the_first_bottleneck_is_the_lowest_ceiling() -> None:
    limits = ceilings(costs(redis_ms=2.0, postgres_ms=5.0), utilisation=0.7, pg_cores=8)
    assert [name.split(" (")[0] for name, _ in limits] == [
        "one Redis primary",
        "one PostgreSQL primary",
    ]
    assert math.isclose(limits[0][1], 350.0) and math.isclose(limits[1][1], 1120.0)
    text = report(costs(), [10, 100, 1000], 0.7, 8)
    assert "first bottleneck: one Redis primary" in text
    assert "1000 runs/s need more than one Redis primary" in text


def test_an_unmeasured_redis_leaves_postgres_as_the_only_ceiling() -> None:
    limits = ceilings(costs(redis_ms=None), utilisation=0.7, pg_cores=4)  # type: ignore[arg-type]
    assert [name for name, _ in limits] == ["one PostgreSQL primary (4 cores)"]
    assert "Redis cores" in report(costs(redis_ms=None), [10], 0.7, 4)  # type: ignore[arg-type]
