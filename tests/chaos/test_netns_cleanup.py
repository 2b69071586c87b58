"""The chaos harness leaves nothing behind (tests/chaos/net.py): a run stopped with SIGTERM
kills every process of its namespaces by pid and deletes its namespaces, links and owner
record; a run killed with SIGKILL cannot, and the next run's `reap_dead_runs` deletes its
leftovers (PostgreSQL survives its parent's death) while a live run's namespaces stay.

Each test starts a real harness (`python -m tests.chaos`) and stops it while its cluster
boots, once PostgreSQL runs in its namespace. Needs root: skipped, saying so, otherwise.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.tools.devservices import pid_alive
from tests.chaos.net import (
    OWNER_DIR,
    Network,
    link_names,
    netns_names,
    netns_pids,
    reap_dead_runs,
    start_time,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _need_netns() -> None:
    from tests.chaos.net import netns_available

    why = netns_available()
    if why is not None:
        pytest.skip(f"the cleanup test needs network namespaces: {why}")


def wait_for(what: str, fn: object, timeout: float = 120.0) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = fn()  # type: ignore[operator]
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def tagged(tag: str) -> list[str]:
    return [n for n in netns_names() + link_names() if n.startswith(tag)]


def gone(pid: int) -> bool:
    """No such process, or a zombie (it holds nothing; its parent reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :].split()[0] == "Z"


def postgres_pids(ns: str) -> list[int]:
    """The PostgreSQL processes inside namespace `ns` (setpriv has exec'd the server)."""
    return [pid for pid in netns_pids(ns) if pid_alive(pid, "postgres")]


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, list[int], Path]]:
    """A harness booting its cluster; its tag, the pids inside its namespaces once
    PostgreSQL runs, and its directory."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'clients' / 'python'}"}
    with (tmp_path / "harness.log").open("wb") as log:
        popen = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos", "--seed", "1", "--duration", "20", "--webs", "1",
             "--workers", "1", "--sentinels", "0", "--kinds", "worker_kill"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    workdir: Path | None = None
    try:

        def owner() -> str | None:
            for f in OWNER_DIR.glob("trc*.json"):
                rec = json.loads(f.read_text() or "{}")
                if rec.get("pid") == popen.pid:
                    return f.stem
            return None

        tag = str(wait_for("the harness's owner record", owner))
        workdir = Path(json.loads((OWNER_DIR / f"{tag}.json").read_text())["workdir"])
        # `ip -n <ns> ...` (the harness configuring the host) is in the namespace too, for a
        # moment: wait for the postmaster itself
        wait_for("PostgreSQL in its namespace", lambda: postgres_pids(f"{tag}-pg"))
        pids = [pid for ns in netns_names() if ns.startswith(tag) for pid in netns_pids(ns)]
        yield popen, tag, pids, workdir
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait()
        reap_dead_runs(lambda msg: None)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.timeout(300)
def test_sigterm_stops_every_process_by_pid_and_deletes_namespaces(
    harness: tuple[subprocess.Popen[bytes], str, list[int], Path],
) -> None:
    popen, tag, pids, _ = harness
    assert pids and tagged(tag)
    popen.send_signal(signal.SIGTERM)
    assert popen.wait(timeout=120) == 130
    assert tagged(tag) == []
    assert not (OWNER_DIR / f"{tag}.json").exists()
    assert [p for p in pids if not gone(p)] == []


@pytest.mark.timeout(300)
def test_sigkill_leftovers_are_reaped_and_a_live_run_is_left_alone(
    harness: tuple[subprocess.Popen[bytes], str, list[int], Path],
) -> None:
    popen, tag, pids, workdir = harness
    live = Network(random.Random(), workdir)  # this process's own run: alive
    try:
        live.create()
        live.add_host("h1")
        popen.kill()
        popen.wait(timeout=30)
        # PostgreSQL (under setpriv: no parent-death signal) and the namespaces outlive it
        left = tagged(tag)
        assert f"{tag}-pg" in left and f"{tag}br" in left
        survivors = [p for p in pids if not gone(p)]
        assert survivors, "nothing outlived the SIGKILL: the reaper has nothing to prove"
        msgs: list[str] = []
        reaped = reap_dead_runs(msgs.append)
        assert tag in reaped and live.tag not in reaped, msgs
        assert tagged(tag) == []
        assert not (OWNER_DIR / f"{tag}.json").exists()
        assert [p for p in survivors if not gone(p)] == []
        assert f"{live.tag}-h1" in netns_names() and f"{live.tag}br" in link_names()
        rec = json.loads((OWNER_DIR / f"{live.tag}.json").read_text())
        assert rec == {**rec, "pid": os.getpid(), "start": start_time(os.getpid())}
    finally:
        live.destroy()
    assert tagged(live.tag) == [] and not (OWNER_DIR / f"{live.tag}.json").exists()
