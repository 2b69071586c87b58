"""shared/metrics.py: multi-process counters, dead-pid folding, scrape-time gauges."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import values
from prometheus_client.parser import text_string_to_metric_families

from shared import metrics
from shared.settings import Settings

CHILD = """
import sys
from pathlib import Path
from shared import metrics
from shared.settings import Settings
metrics.configure(Settings(metrics_dir=Path(sys.argv[1])))
metrics.run_started()
metrics.fenced_write("stream")
metrics.run_finished("success", 1.5, {"total": {"input_tokens": 10, "output_tokens": 7}})
"""

FIGURES: dict[str, Any] = {
    "runs_by_status": {"success": 3, "running": 1},
    "runs_stuck": 0,
    "queue_depth": {"runs": 2, "memory": 0},
    "queue_oldest_age_s": {"runs": 1.5, "memory": None},
    "workers_online": {"runs": 1, "memory": 1},
    "connections_open": {"sse": 4, "ws": 1},
    "memory_backlog": 5,
    "memory_skipped": 2,
}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _child(path: Path) -> None:
    subprocess.run([sys.executable, "-c", CHILD, str(path)], check=True, timeout=60)


@pytest.fixture
def multiproc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test process in multi-process mode on a private directory, undone afterwards
    (the environment variable, prometheus-client's value class and our state)."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)
    monkeypatch.setattr(metrics, "_state", None)
    return metrics.configure(Settings(metrics_dir=tmp_path / "prom"))


def test_counters_of_processes_are_summed_and_dead_ones_folded(multiproc: Path) -> None:
    """Two processes that counted and exited: their files fold into one archive per type
    and the sums stay (counters never go backwards after a reap)."""
    _child(multiproc)
    _child(multiproc)
    assert len(list(multiproc.glob("counter_[0-9]*.db"))) == 2
    metrics.run_started()  # this live process counts too
    text = metrics.render(None).decode()
    assert not list(multiproc.glob("counter_[0-9]*.db"))[1:]  # only ours is left
    assert (multiproc / "counter_archive.db").exists()
    assert (multiproc / "histogram_archive.db").exists()
    s = _samples(text)
    assert s[("threadrun_runs_started_total", ())] == 3
    assert s[("threadrun_fenced_writes_total", (("sink", "stream"),))] == 2
    assert s[("threadrun_fenced_writes_total", (("sink", "receipt"),))] == 0
    assert s[("threadrun_tokens_total", (("kind", "input"),))] == 20
    assert s[("threadrun_tokens_total", (("kind", "output"),))] == 14
    assert s[("threadrun_runs_finished_total", (("status", "success"),))] == 2
    assert s[("threadrun_run_duration_seconds_count", ())] == 2
    assert s[("threadrun_run_duration_seconds_bucket", (("le", "2.5"),))] == 2
    assert s[("threadrun_run_duration_seconds_bucket", (("le", "1.0"),))] == 0
    # A second reap finds nothing new and changes nothing.
    assert metrics.reap_dead(multiproc) == 0
    again = _samples(metrics.render(None).decode())
    assert again[("threadrun_runs_started_total", ())] == 3


def test_gauges_come_from_the_figures_at_scrape_time(multiproc: Path) -> None:
    """OpsGauges exports every gauge of the contract from one figures() call per scrape."""
    calls = []

    def figures() -> dict[str, Any]:
        calls.append(1)
        return FIGURES

    text = metrics.render(metrics.OpsGauges(figures)).decode()
    assert len(calls) == 1
    kinds = {f.name: f.type for f in text_string_to_metric_families(text)}
    for name in ("runs", "runs_stuck", "queue_depth", "queue_oldest_age_seconds"):
        assert kinds[f"threadrun_{name}"] == "gauge"
    assert kinds["threadrun_memory_updates_skipped"] == "counter"
    s = _samples(text)
    assert s[("threadrun_runs", (("status", "success"),))] == 3
    assert s[("threadrun_runs", (("status", "timeout"),))] == 0
    assert s[("threadrun_queue_depth", (("queue", "runs"),))] == 2
    assert s[("threadrun_queue_oldest_age_seconds", (("queue", "memory"),))] == 0
    assert s[("threadrun_connections_open", (("transport", "sse"),))] == 4
    assert s[("threadrun_workers_online", (("queue", "memory"),))] == 1
    assert s[("threadrun_memory_backlog", ())] == 5
    assert s[("threadrun_memory_updates_skipped_total", ())] == 2


def test_a_reaped_run_counts_as_finished_without_a_duration(multiproc: Path) -> None:
    """L5: the reaper ends a run `error` with no attempt to time; the histogram is untouched."""
    metrics.run_finished("error", None)
    s = _samples(metrics.render(None).decode())
    assert s[("threadrun_runs_finished_total", (("status", "error"),))] == 1
    assert s[("threadrun_run_duration_seconds_count", ())] == 0


def test_a_failing_figures_source_drops_only_the_gauges(multiproc: Path) -> None:
    """With Redis or Postgres down the scrape still answers with the counters."""

    def broken() -> dict[str, Any]:
        raise ConnectionError("redis is down")

    metrics.run_started()
    s = _samples(metrics.render(metrics.OpsGauges(broken)).decode())
    assert s[("threadrun_runs_started_total", ())] == 1
    assert not [k for k in s if k[0] == "threadrun_queue_depth"]


def test_counter_values_and_a_failing_hook_never_raise(
    multiproc: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """counter_values() reads this host's counters; a hook that fails is logged, not raised."""
    metrics.gap_sent(2)
    metrics.run_finished("success", -1.0, {"total": {"input_tokens": "n/a"}})
    counted = metrics.counter_values()
    assert counted["threadrun_stream_gaps_total"] == 2
    assert counted["threadrun_runs_finished_total{status=success}"] == 1
    assert counted["threadrun_tokens_total{kind=input}"] == 0

    class Broken:
        def inc(self, n: float = 1) -> None:
            raise OSError("disk full")

    state = metrics._get()
    monkeypatch.setattr(state.instruments, "stream_gaps", Broken())
    metrics.gap_sent()  # must not raise into the streaming code
    assert "metric update failed" in caplog.text


def test_default_dir_is_per_host(tmp_path: Path) -> None:
    """Without metrics_dir the directory is data_dir/prometheus/<hostname>."""
    import socket

    d = metrics.default_dir(Settings(data_dir=tmp_path))
    assert d == tmp_path / "prometheus" / socket.gethostname()
