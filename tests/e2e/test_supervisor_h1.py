"""`make run`'s supervisor heals a single host (SPEC H1): real web, workers and scheduler under
``python -m shared.tools.supervisor``, on a database and Redis prefix of their own.

Each test `kill -9`s children and polls ``/ok`` every 100 ms from a thread: a worker's death
must not cost a single failed poll.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from shared.settings import Settings
from shared.tools.devservices import free_port
from shared.tools.testing import cluster_env
from tests.conftest import private_settings
from tests.e2e.conftest import FAST_LEASES
from tests.unit.test_supervisor_policy import GRAPH

ROOT = Path(__file__).resolve().parents[2]
FAST = {
    "THREADRUN_SUPERVISOR_BACKOFF_S": "0.2",
    "THREADRUN_SUPERVISOR_BACKOFF_MAX_S": "0.5",
    "THREADRUN_STOP_GRACE_S": "5",
    "THREADRUN_INSTALL_DEPENDENCIES": "false",
}


class Stack:
    """A running supervisor, its output lines collected by a thread."""

    def __init__(self, proc: subprocess.Popen[str], base: str) -> None:
        self.proc = proc
        self.base = base
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pred: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert self.proc.poll() is None, f"supervisor exited:\n{self.text()}"
            assert time.monotonic() < deadline, f"no {what} in {timeout} s:\n{self.text()}"
            time.sleep(0.05)

    def restarted(self, name: str, pid: int) -> bool:
        """True once child ``name`` runs under a pid other than ``pid``."""
        return self.pid_of(name) != pid

    def pid_of(self, name: str) -> int:
        """The newest pid the supervisor logged for child ``name``."""
        pat = re.compile(rf"^supervisor\s*\| (?:re)?started {name} \(pid (\d+)\)$")
        pids = [int(m.group(1)) for ln in list(self.lines) if (m := pat.match(ln))]
        assert pids, self.text()
        return pids[-1]


def ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


class Poller:
    """GET /ok every 100 ms until stopped; counts the failed polls."""

    def __init__(self, url: str) -> None:
        self.url, self.polls, self.failures = url, 0, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.1):
            self.polls += 1
            if not ok(self.url):
                self.failures += 1

    def stop(self) -> tuple[int, int]:
        self.done.set()
        self.thread.join(timeout=5)
        return self.polls, self.failures


@contextmanager
def stack(
    settings: Settings, redis_url: str, template_database: str, extra: dict[str, str]
) -> Iterator[Stack]:
    with private_settings(settings, redis_url, template_database) as s:
        port = free_port()
        env = cluster_env(s, {**FAST, **extra})
        env.update(THREADRUN_HOST="127.0.0.1", THREADRUN_PORT=str(port), THREADRUN_WEB_WORKERS="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "shared.tools.supervisor"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        st = Stack(proc, f"http://127.0.0.1:{port}")
        try:
            st.wait_for(lambda: any(ln.startswith("threadrun is up") for ln in st.lines), "start")
            yield st
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            st.reader.join(timeout=5)


def test_h1_kill_9_of_each_child_restarts_it_and_the_web_answers_throughout(
    settings: Settings, redis_url: str, template_database: str
) -> None:
    with stack(settings, redis_url, template_database, {}) as st:
        poller = Poller(f"{st.base}/ok")
        for name in ("worker", "memory", "scheduler"):
            pid = st.pid_of(name)
            os.kill(pid, signal.SIGKILL)
            st.wait_for(functools.partial(st.restarted, name, pid), f"restart of {name}")
            assert f"{name} exited unexpectedly (signal SIGKILL (code -9)); restarting it in" in (
                st.text()
            )
        st.wait_for(lambda: poller.polls >= 10, "ten polls")
        polls, failures = poller.stop()
        assert failures == 0, f"{failures} of {polls} polls of /ok failed:\n{st.text()}"

        web = st.pid_of("web")
        os.kill(web, signal.SIGKILL)
        st.wait_for(lambda: st.pid_of("web") != web, "restart of web")
        st.wait_for(lambda: ok(f"{st.base}/ok"), "/ok after the web's restart")
    assert st.proc.returncode == 0, st.text()
    assert "Traceback" not in st.text().split("stopping web")[-1], st.text()


def test_h1_crash_loop_stops_only_that_child_with_one_message(
    settings: Settings, redis_url: str, template_database: str
) -> None:
    extra = {
        "THREADRUN_SUPERVISOR_MAX_RESTARTS": "1",
        "THREADRUN_SUPERVISOR_RESTART_WINDOW_S": "120",
    }
    with stack(settings, redis_url, template_database, extra) as st:
        poller = Poller(f"{st.base}/ok")
        first = st.pid_of("worker")
        os.kill(first, signal.SIGKILL)
        st.wait_for(lambda: st.pid_of("worker") != first, "restart of worker")
        os.kill(st.pid_of("worker"), signal.SIGKILL)
        st.wait_for(lambda: "worker is in a crash loop" in st.text(), "crash-loop message")
        st.wait_for(lambda: poller.polls >= 10, "ten polls")
        polls, failures = poller.stop()
        assert failures == 0, f"{failures} of {polls} polls of /ok failed:\n{st.text()}"
        assert st.text().count("crash loop") == 1
        assert "(2 exits in 120 s, last signal SIGKILL (code -9))" in st.text()
        memory = st.pid_of("memory")
        os.kill(memory, 0)  # the rest keep running
        assert st.proc.poll() is None
        # H2: the ops view says so (it said "all clear" before): the supervisors' record
        # names the child and its last exit, and the health strip is bad.
        with httpx.Client(base_url=st.base, timeout=10) as client:
            children = client.get("/ops/api/supervisors").json()["supervisors"][0]["children"]
            worker = next(c for c in children if c["name"] == "worker")
            assert worker["state"] == "crash_loop", children
            assert worker["last_exit"] == "signal SIGKILL (code -9)" and worker["restarts"] == 1
            assert {c["state"] for c in children if c["name"] != "worker"} == {"running"}
            health = client.get("/ops/api/health").json()
            tile = next(t for t in health["tiles"] if t["key"] == "supervised")
            assert tile["state"] == "bad" and "worker" in tile["reason"], tile
            assert not health["ok"]


def test_h1_in_flight_run_resumes_after_its_worker_is_killed_and_restarted(
    settings: Settings, redis_url: str, template_database: str
) -> None:
    """The only runs worker dies mid-run; the supervisor restarts it and the run ends `success`
    on its second attempt (the lease expires, the reaper re-dispatches: L5)."""
    with stack(settings, redis_url, template_database, dict(FAST_LEASES)) as st:
        poller = Poller(f"{st.base}/ok")
        with httpx.Client(base_url=st.base, timeout=30) as client:
            tid = client.post("/threads", json={}).json()["thread_id"]
            body = {
                "assistant_id": "lead_agent",
                "input": {"messages": [{"role": "user", "content": "survive a kill"}]},
                "config": {"configurable": {"tokens": 80, "token_delay_ms": 25}},
            }
            run_id = client.post(f"/threads/{tid}/runs", json=body).json()["run_id"]

            def status() -> str:
                return str(client.get(f"/threads/{tid}/runs/{run_id}").json()["status"])

            st.wait_for(lambda: status() == "running", "the run to start", timeout=30)
            worker = st.pid_of("worker")
            os.kill(worker, signal.SIGKILL)
            st.wait_for(lambda: st.pid_of("worker") != worker, "restart of worker")
            st.wait_for(lambda: status() not in ("pending", "running"), "the run to end", 60)
            row = client.get(f"/threads/{tid}/runs/{run_id}").json()
            assert row["status"] == "success" and row["attempt"] == 2, row
        polls, failures = poller.stop()
        assert failures == 0, f"{failures} of {polls} polls of /ok failed:\n{st.text()}"


def test_h1_dev_loop_restarts_web_and_workers_when_a_graph_file_changes(
    settings: Settings, redis_url: str, template_database: str, tmp_path: Path
) -> None:
    """THREADRUN_RELOAD=true (`make dev`): editing a graph module named in langgraph.json
    stops the children gracefully (a warm shutdown) and starts them again."""
    pkg = tmp_path / "graphs"
    pkg.mkdir()
    graph = pkg / "g.py"
    graph.write_text(GRAPH)
    config = tmp_path / "langgraph.json"
    config.write_text('{"graphs": {"echo": "./graphs/g.py:graph"}}')
    extra = {"THREADRUN_RELOAD": "true", "THREADRUN_CONFIG": str(config)}
    with stack(settings, redis_url, template_database, extra) as st:
        worker = st.pid_of("worker")
        graph.write_text(GRAPH + "\n# edited\n")
        st.wait_for(
            lambda: "graphs' files changed; restarting web and workers" in st.text(), "reload"
        )
        st.wait_for(functools.partial(st.restarted, "worker", worker), "the new worker")
        assert "worker: Warm shutdown" in st.text()
        st.wait_for(lambda: ok(f"{st.base}/ok"), "/ok after the reload")
    assert st.proc.returncode == 0, st.text()
