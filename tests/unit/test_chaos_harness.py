"""The chaos harness's pure parts (tests/chaos): the verdict when the workload hangs, the
replay command, and which leftover namespaces belong to dead runs. No namespaces, no root:
the real runs are tests/chaos/test_chaos.py and tests/chaos/test_netns_cleanup.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from shared.tools.testing.cluster import Proc
from tests.chaos import harness
from tests.chaos.checker import Anomaly, Report, read_jsonl, stuck_clients, summary
from tests.chaos.harness import Config, Result, finish_workload, replay_command
from tests.chaos.net import dead_tags, owner_alive, start_time, tag_of
from tests.chaos.workload import HUNG_EXIT

ROOT = Path(__file__).resolve().parents[2]
RUN = "0193a2b4-0000-7000-8000-000000000001"


def _history() -> list[dict[str, Any]]:
    return [
        {"t": 1.0, "c": "s0", "k": "client_start", "transport": "sse"},
        {"t": 1.0, "c": "w0", "k": "client_start", "transport": "ws"},
        {"t": 2.0, "c": "s0", "k": "create", "run": RUN, "thread": "T1", "word": "qs0x1"},
        {"t": 2.5, "c": "s0", "k": "ev", "run": RUN, "id": "17-0", "ev": "metadata", "att": 1},
        {"t": 3.0, "c": "s0", "k": "ev", "run": RUN, "id": "18-0", "ev": "messages", "att": 1},
        {"t": 4.0, "c": "s0", "k": "drop", "run": RUN, "why": "ReadTimeout()", "last": "18-0"},
        {"t": 9.0, "c": "w0", "k": "client_done", "runs": 3},
        {
            "t": 60.0,
            "c": "s0",
            "k": "hung",
            "phase": "rejoin the stream (sse, 1)",
            "since": 5.0,
            "run": RUN,
            "thread": "T1",
            "last": "18-0",
        },  # fmt: skip
        {"t": 60.0, "c": "workload", "k": "done", "hung": ["s0"]},
    ]


def test_l4_stuck_client_names_its_run_phase_and_last_events() -> None:
    runs = {RUN: {"run_id": RUN, "status": "running", "created": 2.0, "ended": None}}
    out = stuck_clients(_history(), runs, "clients still busy 150 s after the deadline")
    assert len(out) == 1, out
    a = out[0]
    assert (a.invariant, a.run_id) == ("stuck", RUN)
    for part in (
        "client s0 never finished",
        "clients still busy 150 s",
        "'rejoin the stream (sse, 1)' for 55 s",
        "status running",
        "thread T1",
        "last event id 18-0",
        "ev messages 18-0 (attempt 1); drop (ReadTimeout())",
    ):
        assert part in a.detail, (part, a.detail)


def test_l4_finished_clients_and_old_histories_are_not_stuck() -> None:
    hist = [h for h in _history() if h["k"] != "hung"]
    hist.append({"t": 61.0, "c": "s0", "k": "client_done", "runs": 1})
    assert stuck_clients(hist, {}, None) == []
    # a history without client_start lines (an older workload) flags nobody
    assert stuck_clients([h for h in hist if h["k"] != "client_start"], {}, None) == []


def test_l4_a_client_hung_between_runs_and_a_workload_that_wrote_nothing() -> None:
    hist = [{"t": 1.0, "c": "w1", "k": "client_start", "transport": "ws"}]
    (a,) = stuck_clients(hist, {}, "killed")
    assert a.run_id == "client w1" and "run None" in a.detail and "last seen: nothing" in a.detail
    (b,) = stuck_clients([], {}, "the workload did not finish within 300 s; killed (SIGKILL)")
    assert (b.invariant, b.run_id) == ("stuck", "workload")


def test_l4_summary_of_a_hung_workload_has_the_table_and_the_verdict() -> None:
    runs = {RUN: {"run_id": RUN, "status": "running", "created": 2.0, "ended": None}}
    rep = Report(runs=runs, workload_end="clients still busy 150 s after the deadline")
    rep.runs["0193a2b4-0000-7000-8000-000000000002"] = {"status": "success", "created": 1.0}
    rep.faults = [{"kind": "worker_kill", "start": 2.0, "heal": 3.0}]
    rep.anomalies = stuck_clients(_history(), runs, rep.workload_end)
    text = summary(rep, 100.0)
    assert "| worker_kill" in text and "| (no fault)" in text
    assert "workload: clients still busy" in text
    assert "invariants: terminal ok, stuck 1 anomalies" in text
    assert f"ANOMALY stuck run {RUN}: client s0" in text
    assert text.splitlines()[-1] == "1 passed, 1 failed"


def test_l4_main_prints_the_verdict_and_fails_on_a_stuck_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rep = Report(runs={RUN: {"status": "running", "created": 2.0}})
    rep.anomalies = [Anomaly("stuck", RUN, "client s0 never finished its loop")]
    seen: list[Config] = []

    def fake_run(cfg: Config) -> Result:
        seen.append(cfg)
        return Result(rep, summary(rep, 10.0), tmp_path, [])

    monkeypatch.setattr(harness, "run_chaos", fake_run)
    monkeypatch.setattr("tests.chaos.net.netns_available", lambda: None)
    rc = harness.main(["--seed", "7", "--duration", "120", "--kinds", "worker_kill,pg_restart"])
    out = capsys.readouterr().out
    assert rc == 1
    assert seen[0].kinds == ["worker_kill", "pg_restart"]
    assert "| fault" in out and "0 passed, 1 failed" in out
    assert (
        "replay: python -m tests.chaos --seed 7 --duration 120 --kinds worker_kill,pg_restart"
        in out
    )


def test_replay_command_is_make_chaos_for_the_default_layout() -> None:
    assert replay_command(Config(42, 180.0)) == "make chaos SEED=42 DURATION=180"
    cfg = Config(42, 24.0, recovery_s=30.0, webs=1, workers=2, sentinels=0)
    assert replay_command(cfg) == (
        "python -m tests.chaos --seed 42 --duration 24 --recovery 30 --webs 1 --workers 2"
        " --sentinels 0"
    )


def _proc(code: str, log: Path) -> Proc:
    popen = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert popen.stdout is not None
    popen.stdout.readline()  # "ready": its signal handler is in place
    popen.stdout.close()
    return Proc("workload", popen, log)


def test_l4_finish_workload_stops_a_workload_past_its_time(tmp_path: Path) -> None:
    hangs = "import time; print('ready', flush=True); time.sleep(600)"
    proc = _proc(hangs, tmp_path / "a.log")
    how = finish_workload(proc, 0.2, 150)
    assert how is not None and "did not finish within 0 s; stopped (SIGTERM" in how
    assert proc.popen.poll() is not None
    # one that ignores SIGTERM is killed
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print('ready', flush=True); time.sleep(600)"
    )
    proc = _proc(stubborn, tmp_path / "b.log")
    how = finish_workload(proc, 0.2, 150, term_wait=0.5)
    assert how is not None and how.endswith("killed (SIGKILL)")
    assert proc.popen.returncode == -signal.SIGKILL
    ok = _proc("print('ready', flush=True)", tmp_path / "c.log")
    assert finish_workload(ok, 60, 150) is None
    hung = _proc(f"print('ready', flush=True); raise SystemExit({HUNG_EXIT})", tmp_path / "d.log")
    assert (
        finish_workload(hung, 60, 150) == "clients still busy 150 s after the workload's deadline"
    )


def test_l4_workload_records_hung_clients_and_exits(tmp_path: Path) -> None:
    """A web host that accepts connections and never answers: every client is still in its
    first request at the end; the workload records each as `hung` and exits HUNG_EXIT."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    out = tmp_path / "history.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'clients' / 'python'}"}
    try:
        res = subprocess.run(
            [sys.executable, "-m", "tests.chaos.workload", "--urls",
             f"http://127.0.0.1:{srv.getsockname()[1]}", "--out", str(out), "--duration", "0.5",
             "--grace-s", "1", "--sse-clients", "1", "--ws-clients", "1"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        stop.set()
        t.join()
        for s in held:
            s.close()
        srv.close()
    assert res.returncode == HUNG_EXIT, res.stderr
    hist = read_jsonl(out)
    hung = {h["c"]: h for h in hist if h["k"] == "hung"}
    assert set(hung) == {"s0", "w0"}, hist
    assert all(h["phase"] == "create a thread" for h in hung.values())
    assert hist[-1] == {**hist[-1], "c": "workload", "k": "done", "hung": ["s0", "w0"]}
    out_anoms = stuck_clients(hist, {}, "clients still busy 1 s after the workload's deadline")
    assert sorted(a.run_id for a in out_anoms) == ["client s0", "client w0"]


def test_dead_tags_are_those_whose_owner_is_gone() -> None:
    assert tag_of("trc1a2b3c-web1") == tag_of("trc1a2b3cv4") == tag_of("trc1a2b3cbr") == "trc1a2b3c"
    assert tag_of("trcprobe123") is None and tag_of("eth0") is None
    names = ["trc00000a-pg", "trc00000abr", "trc00000bv3", "trc00000c-web1", "eth0", "docker0"]
    owners: dict[str, dict[str, Any] | None] = {
        "trc00000a": {"pid": 1, "start": "dead"},
        "trc00000b": {"pid": 2, "start": "alive"},
        "trc00000c": None,  # no owner record: never touched
        "trc00000d": {"pid": 3, "start": "dead"},  # a record alone (its run deleted its links)
    }
    dead, kept = dead_tags(names, owners, lambda rec: rec["start"] == "alive")
    assert dead == ["trc00000a", "trc00000d"]
    assert kept == ["trc00000b", "trc00000c"]


def test_owner_alive_checks_the_pid_and_its_start_time() -> None:
    me = {"pid": os.getpid(), "start": start_time(os.getpid())}
    assert owner_alive(me)
    assert not owner_alive({**me, "start": (me["start"] or 0) + 1})  # the pid was reused
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert not owner_alive({"pid": int(done.stdout), "start": 0})
    assert not owner_alive({}) and not owner_alive(json.loads('{"pid": "x"}'))


class _LocalHost:
    """A chaos host without a namespace: its argv runs as is."""

    name = "local"

    def exec_argv(self, argv: list[str]) -> list[str]:
        return argv


def test_l4_a_process_the_nemesis_thread_starts_outlives_that_thread(tmp_path: Path) -> None:
    """The parent-death signal follows the forking *thread*: a replacement worker started
    from the nemesis thread must not die when that thread ends (it did: a single-worker run
    then never recovered from a worker_kill). The control shows the kernel's behaviour."""
    from shared.tools.devservices import parent_death_signal
    from tests.chaos.cluster import ChaosCluster

    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    got: list[Any] = []

    def plain() -> None:
        got.append(subprocess.Popen(sleeper, preexec_fn=parent_death_signal(signal.SIGKILL)))

    t = threading.Thread(target=plain)
    t.start()
    t.join()
    assert got[0].wait(timeout=60) == -signal.SIGKILL  # the control: killed with its thread

    c = ChaosCluster(None, tmp_path, webs=0, workers=0, sentinels=0)  # type: ignore[arg-type]
    procs: list[Proc] = []
    t = threading.Thread(
        target=lambda: procs.append(c.spawn(_LocalHost(), "w", sleeper, role="worker"))
    )  # type: ignore[arg-type]
    t.start()
    t.join()
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            procs[0].popen.wait(timeout=1)  # still running once its starting thread is gone
    finally:
        c.stop()
    assert procs[0].popen.returncode is not None
