"""The pure helpers of bench/sweep_cpu.py and of bench/authz.py's HTTP mode: merging rounds,
ratios and the tables (no services)."""

from __future__ import annotations

import math

from bench.authz import OPS, Tally, http_table
from bench.sweep_cpu import Phase, merge, ratio, report


def phase(label: str, runs: int, cpu: dict[str, float], **kw: object) -> Phase:
    return Phase(label, runs, 0, 10.0, [float(i) for i in range(1, runs + 1)], cpu, **kw)  # type: ignore[arg-type]


def test_ratio_and_its_zero_base() -> None:
    assert ratio(3.0, 2.0) == "1.50x"
    assert ratio(1.0, 0.0) == "-"
    assert ratio(11.8, 0.02) == "-"  # two clock ticks over a phase: not a base


def test_merge_weights_cpu_per_run_by_runs() -> None:
    """Merged CPU per run is total CPU over total runs, not the mean of the rounds."""
    a = phase("with sweep", 10, {"web": 2.0, "postgres": 1.0}, swept=100, backlog_left=5)
    b = phase("with sweep", 30, {"web": 6.0, "postgres": 1.0}, swept=300, backlog_left=0)
    m = merge([a, b])
    assert m.runs == 40 and m.wall_s == 20.0
    assert math.isclose(m.cpu_ms["web"], (2.0 * 10 + 6.0 * 30) / 40)
    assert math.isclose(m.cpu_ms["postgres"], 1.0)
    assert m.swept == 400 and m.backlog_left == 5
    assert len(m.latencies_ms) == 40


def test_phase_sums_threadrun_and_all_measured() -> None:
    p = phase("x", 1, {"web": 1.0, "worker": 2.0, "scheduler": 3.0, "postgres": 4.0})
    assert p.ours_ms == 6.0 and p.total_ms == 10.0


def test_report_ratios_throughput_and_extra_cpu_per_swept_thread() -> None:
    cpu = {"web": 10.0, "worker": 20.0, "scheduler": 0.0, "postgres": 10.0}
    without = phase("without sweep", 100, cpu)
    busy = {"web": 10.0, "worker": 20.0, "scheduler": 10.0, "postgres": 20.0}
    with_sweep = phase("with sweep", 100, busy, swept=500, backlog_left=10)
    text = report(without, with_sweep, 510)
    assert "| CPU ms/run: all measured" in text and "1.50x" in text  # 60 / 40
    row = next(ln for ln in text.splitlines() if ln.startswith("| 510 per round"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # 500 threads in 10 s; (60 - 40) ms/run x 100 runs over 500 threads = 4 ms a thread
    assert cells == ["510 per round", "500", "50", "10", "4.0"]


def test_report_says_when_the_backlog_ran_out() -> None:
    cpu = {"web": 1.0, "worker": 1.0, "scheduler": 0.0, "postgres": 1.0}
    text = report(phase("a", 10, cpu), phase("b", 10, cpu, swept=20, backlog_left=0), 20)
    assert "lower bound: the backlog ran out" in text


def tally(n: int, wall: float, cpu: float, ms: float) -> Tally:
    return Tally(latencies_s=[ms / 1000] * n, wall_s=wall, cpu_s=cpu)


def test_tally_rates_and_percentiles() -> None:
    t = Tally(latencies_s=[0.001, 0.002, 0.003, 0.004, 0.005], wall_s=0.5, cpu_s=0.005)
    assert t.per_s == 10.0
    assert math.isclose(t.ms(50), 3.0)
    assert math.isclose(t.cpu_us, 1000.0)
    assert Tally().per_s == 0.0 and math.isnan(Tally().cpu_us)


def test_http_table_ratios_are_to_the_first_setup() -> None:
    setups = ["API key", "project"]
    tallies = {}
    for op in OPS:
        tallies[("API key", op)] = tally(100, 1.0, 0.1, 2.0)
        tallies[("project", op)] = tally(100, 2.0, 0.2, 4.0)
    text = http_table(setups, tallies)
    lines = [ln for ln in text.splitlines() if "| project" in ln]
    assert len(lines) == len(OPS)
    for ln in lines:  # half the rate, twice the latency and the CPU
        assert "50 (0.50x)" in ln and "4.00 (2.00x)" in ln and "2,000 (2.00x)" in ln
    base = [ln for ln in text.splitlines() if "| API key" in ln]
    assert all("(1.00x)" in ln for ln in base)
