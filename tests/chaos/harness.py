"""One chaos run: hosts, services, workload, nemesis, heal, recovery, checker.

`python -m tests.chaos [--seed S] [--duration 180] ...` (`make chaos SEED=... DURATION=...`).
Needs root (network namespaces). Every process started is stopped by its pid and every
namespace and link deleted at the end, also on a failure, Ctrl-C or SIGTERM (what still runs
inside the run's namespaces then is killed by pid); the run's directory (logs, history) is
deleted unless --keep (or the run failed: then it is kept and named). A run killed with
SIGKILL cannot clean up: the next run deletes its leftovers (tests/chaos/net.py,
`reap_dead_runs`: only runs whose owner process is gone). A workload that does not finish in
time is stopped and its busy clients reported as `stuck`; the verdict is printed either way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from shared.tools.testing.cluster import Proc
from tests.chaos.checker import Report, check, read_jsonl, summary
from tests.chaos.cluster import ChaosCluster
from tests.chaos.nemesis import FAILOVER, KINDS, Fault, Nemesis, schedule
from tests.chaos.net import Network, reap_dead_runs
from tests.chaos.workload import HUNG_EXIT

STREAM_MAXLEN = "48"
"""Short run streams: a client that stays away a few seconds gets a `gap` (B5) and must
reload the state (B9), so the checker sees that path too."""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Config:
    seed: int
    duration_s: float = 180.0
    recovery_s: float = 60.0
    webs: int = 2
    workers: int = 3
    sentinels: int = 3
    sse_clients: int = 3
    ws_clients: int = 3
    kinds: list[str] | None = None
    """The fault kinds drawn; None: KINDS, plus redis_failover when the app uses Sentinel.
    A list given is used as is (no redis_failover unless it is listed)."""
    keep: bool = False
    grace_s: float = 150.0
    """Seconds after the workload's deadline before a client still busy counts as hung."""


@dataclass
class Result:
    report: Report
    text: str
    workdir: Path
    faults: list[Fault]

    @property
    def ok(self) -> bool:
        return not self.report.anomalies


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


class Snapshots(threading.Thread):
    """Every few seconds, the checkpoints committed so far (thread id, checkpoint id)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(name="snapshots", daemon=True)
        self.dsn = dsn
        self.seen: set[tuple[str, str]] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(3.0):
            self.take()

    def take(self) -> None:
        with contextlib.suppress(psycopg.Error):
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as conn:
                rows = conn.execute(
                    "SELECT thread_id::text, checkpoint_id FROM checkpoints WHERE checkpoint_ns = ''"
                ).fetchall()
            self.seen |= {(r[0], r[1]) for r in rows}


def finish_workload(
    proc: Proc, timeout: float, grace_s: float, term_wait: float = 15.0
) -> str | None:
    """Wait up to `timeout` s for the workload; None when it finished by itself, else how
    it ended, for the checker (`stuck`). A workload still running then gets SIGTERM (it
    records its busy clients as `hung` and exits) and, `term_wait` s later, SIGKILL: the
    harness always goes on to its verdict."""
    try:
        rc = proc.popen.wait(timeout=max(0.1, timeout))
    except subprocess.TimeoutExpired:
        log(f"chaos: the workload did not finish within {timeout:.0f} s: SIGTERM")
        with contextlib.suppress(ProcessLookupError):
            proc.popen.send_signal(signal.SIGTERM)
        try:
            rc = proc.popen.wait(timeout=term_wait)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            rc = proc.popen.wait(timeout=15)
            return f"the workload did not finish within {timeout:.0f} s; killed (SIGKILL)"
        return f"the workload did not finish within {timeout:.0f} s; stopped (SIGTERM, exit {rc})"
    if rc == 0:
        return None
    if rc == HUNG_EXIT:
        return f"clients still busy {grace_s:g} s after the workload's deadline"
    return f"the workload exited with {rc}"


def settle(c: ChaosCluster, timeout: float) -> float:
    """Wait until no run is pending or running (or `timeout`); the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with contextlib.suppress(psycopg.Error):
            with psycopg.connect(c.pg_dsn(), autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM runs WHERE status IN ('pending', 'running')"
                ).fetchone()
            if row is not None and row[0] == 0:
                break
        time.sleep(1.0)
    return time.monotonic() - t0


def run_chaos(cfg: Config) -> Result:
    """The whole run; raises on a harness failure (not on anomalies: see Result.ok)."""
    kinds = list(KINDS) if cfg.kinds is None else list(cfg.kinds)
    reap_dead_runs(log)
    workdir = Path(tempfile.mkdtemp(prefix="threadrun-chaos-"))
    net = Network(random.Random(), workdir)  # names and subnet: unique per run, not per seed
    c = ChaosCluster(
        net,
        workdir,
        webs=cfg.webs,
        workers=cfg.workers,
        sentinels=cfg.sentinels,
        env={"THREADRUN_STREAM_MAXLEN": STREAM_MAXLEN},
    )
    if cfg.kinds is None and c.sentinel and cfg.sentinels:
        kinds.append(FAILOVER)
    faults = schedule(cfg.seed, cfg.duration_s, kinds, [f"worker{i + 1}" for i in range(cfg.workers)],
                      [f"web{i + 1}" for i in range(cfg.webs)])  # fmt: skip
    nemesis: Nemesis | None = None
    snaps: Snapshots | None = None
    ok = False
    try:
        log(
            f"chaos: seed {cfg.seed}, {cfg.duration_s:g} s, subnet {net.subnet}, namespaces {net.tag}-*, dir {workdir}"
        )
        log(
            f"chaos: sentinel support in Settings: {'yes' if c.sentinel else 'no (the app uses the primary directly; no failover fault)'}"
        )
        t0 = time.monotonic()
        c.start()
        log(
            f"chaos: {len(net.hosts)} hosts up in {time.monotonic() - t0:.0f} s; {len(faults)} faults scheduled"
        )
        assert c.settings is not None
        snaps = Snapshots(c.pg_dsn())
        snaps.start()
        history = workdir / "history.jsonl"
        argv = [sys.executable, "-m", "tests.chaos.workload", "--urls", ",".join(c.urls()),
                "--out", str(history), "--duration", str(cfg.duration_s), "--seed", str(cfg.seed),
                "--sse-clients", str(cfg.sse_clients), "--ws-clients", str(cfg.ws_clients),
                "--grace-s", str(cfg.grace_s)]  # fmt: skip
        workload = c.spawn(c.host("client"), "workload", argv, c.env, role="client")
        start = time.time()
        # the workload ends by itself by then (hung clients recorded); 30 s more for its exit
        workload_deadline = time.monotonic() + cfg.duration_s + cfg.grace_s + 30
        netem = c.net.netem_available(c.host("client"))
        if not netem and any(f.kind == "worker_delay" for f in faults):
            log("chaos: no netem qdisc in this kernel: worker_delay throttles with htb instead")
        nemesis = Nemesis(c, faults, log=log, netem=netem)
        nemesis.start(start)
        nemesis.join()
        if nemesis.error is not None:
            raise RuntimeError(f"the nemesis failed: {nemesis.error!r}")
        nemesis.heal_all()
        healed = time.time()
        log("chaos: all healed; the workload finishes its last runs")
        workload_end = finish_workload(workload, workload_deadline - time.monotonic(), cfg.grace_s)
        if workload_end is not None:
            log(f"chaos: {workload_end}")
        took = settle(c, cfg.recovery_s)
        log(
            f"chaos: workload ended; runs settled {took:.0f} s after it (recovery limit {cfg.recovery_s:g} s), {time.time() - healed:.0f} s after the heal"
        )
        snaps.stop.set()
        snaps.join()
        snaps.take()
        hist = read_jsonl(history)
        rep = check(hist, [f.as_dict() for f in nemesis.done], snaps.seen, c.pg_dsn(), c.settings.redis_url,
                    c.settings.redis_prefix, c.live_worker_pids(), workload_end)  # fmt: skip
        text = summary(rep, time.time())
        (workdir / "faults.json").write_text(
            json.dumps([f.as_dict() for f in nemesis.done], indent=1)
        )
        ok = not rep.anomalies
        return Result(rep, text, workdir, nemesis.done)
    finally:
        with signals_ignored():
            if snaps is not None:
                snaps.stop.set()
            if nemesis is not None:
                with contextlib.suppress(Exception):
                    nemesis.stop()
            c.stop()
            net.destroy()
            left = net.leftovers()
            if left:
                log(f"chaos: CLEANUP LEFT {left}")
            if cfg.keep or not ok:
                log(f"chaos: logs and history kept in {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)


def replay_command(cfg: Config) -> str:
    """The command that replays `cfg`'s schedule: `make chaos` for the default layout, else
    `python -m tests.chaos` with every option that differs from its default."""
    default = Config(cfg.seed, cfg.duration_s)
    opts = [
        (f"--{name.replace('_', '-')}", getattr(cfg, attr))
        for name, attr in (
            ("recovery", "recovery_s"),
            ("webs", "webs"),
            ("workers", "workers"),
            ("sentinels", "sentinels"),
            ("sse_clients", "sse_clients"),
            ("ws_clients", "ws_clients"),
            ("grace", "grace_s"),
        )  # fmt: skip
        if getattr(cfg, attr) != getattr(default, attr)
    ]
    if not opts and cfg.kinds is None:
        return f"make chaos SEED={cfg.seed} DURATION={cfg.duration_s:g}"
    argv = ["python -m tests.chaos", f"--seed {cfg.seed}", f"--duration {cfg.duration_s:g}"]
    if cfg.kinds is not None:
        argv.append(f"--kinds {','.join(cfg.kinds)}")
    argv += [f"{flag} {value:g}" for flag, value in opts]
    return " ".join(argv)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: random)")
    p.add_argument("--duration", type=float, default=180.0, help="workload seconds (default 180)")
    p.add_argument("--recovery", type=float, default=60.0, help="seconds allowed to settle after")
    p.add_argument("--webs", type=int, default=2)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--sentinels", type=int, default=3)
    p.add_argument("--sse-clients", type=int, default=3)
    p.add_argument("--ws-clients", type=int, default=3)
    p.add_argument(
        "--kinds",
        default=None,
        help=f"comma-separated fault kinds (default: {','.join(KINDS)}, and {FAILOVER} when the"
        " app uses Sentinel; a list given is used as is)",
    )
    p.add_argument("--keep", action="store_true", help="keep logs and history")
    p.add_argument("--grace", type=float, default=150.0,
                   help="seconds after the workload's deadline before busy clients count as hung")  # fmt: skip
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from tests.chaos.net import netns_available

    why = netns_available()
    if why:
        print(f"chaos: cannot run: {why}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1, 1_000_000)
    cfg = Config(seed, args.duration, args.recovery, args.webs, args.workers, args.sentinels,
                 args.sse_clients, args.ws_clients, None if args.kinds is None else [k for k in args.kinds.split(",") if k], args.keep,
                 args.grace)  # fmt: skip
    # SIGINT too: a shell that starts us in the background has it ignored, which Python keeps
    old = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        res = run_chaos(cfg)
    except KeyboardInterrupt:
        log("chaos: interrupted")
        return 130
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    print(f"threadrun chaos: seed {seed}, duration {cfg.duration_s:g} s, {len(res.faults)} faults")
    print(res.text)
    print(f"replay: {replay_command(cfg)}")
    return 0 if res.ok else 1
