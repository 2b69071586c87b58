"""Hosts as network namespaces on one bridge, and the network faults between them.

Each harness run makes a bridge in the root namespace and one namespace per host, joined by a
veth pair (the host's end is `eth0`), on a private /24 of 10.77.0.0/16 that no interface of
the machine uses yet; namespace and link names carry a per-run prefix (`trc<hex>`), so
parallel runs never collide. The root namespace holds `.1` (the harness reaches every host);
hosts get `.2` on. Faults are applied inside one host's namespace: blackhole routes (a
partition from that host to some addresses) and `tc netem` delay on its `eth0`.
`destroy()` deletes exactly what this run created, also when creating it failed half way.

Ownership: before it creates anything, a run writes `/run/threadrun-chaos/<tag>.json` (its
pid and that process's start time, its directory) and removes it once everything is gone.
A harness killed with SIGKILL leaves its namespaces, links and some processes (PostgreSQL
runs under setpriv, which drops the parent-death signal) behind; the next run's
`reap_dead_runs()` deletes what belongs to a tag whose owner process is gone, killing the
processes inside its namespaces by pid first. A tag whose owner lives, or with no owner
record (an older harness, or not ours), is never touched.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NETNS_DIR = "/run/netns"
OWNER_DIR = Path("/run/threadrun-chaos")
"""One `<tag>.json` per live run: who owns the namespaces and links named `<tag>…`."""
TAG = re.compile(r"^(trc[0-9a-f]{6})")
PROBE = re.compile(r"^trcprobe([0-9]+)$")


class NetError(RuntimeError):
    """An `ip`/`tc` command failed."""


def sh(*argv: str, check: bool = True) -> str:
    """Run one `ip`/`tc` command; its stdout (NetError naming the command on failure)."""
    res = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and res.returncode != 0:
        raise NetError(f"{' '.join(argv)}: {res.stderr.strip() or res.returncode}")
    return res.stdout


def netns_available() -> str | None:
    """None when this process can make namespaces, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool in ("ip", "tc"):
        if subprocess.run(["which", tool], capture_output=True, check=False).returncode:
            return f"`{tool}` (iproute2) is not installed"
    probe = f"trcprobe{os.getpid()}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode != 0:
        return f"ip netns add failed: {res.stderr.strip()}"
    sh("ip", "netns", "del", probe, check=False)
    return None


def start_time(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks after boot: /proc/<pid>/stat field 22),
    None if there is no such process. With the pid it names one process even after the
    pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ")"
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def owner_alive(record: dict[str, Any]) -> bool:
    """Whether the process an owner record names still runs (same pid, same start time)."""
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    started = start_time(pid)
    return started is not None and started == record.get("start")


def tag_of(name: str) -> str | None:
    """The run tag a namespace or link name carries (`trc1a2b3c-web1`, `trc1a2b3cv4p`,
    `trc1a2b3cbr` -> `trc1a2b3c`), or None (not a harness name)."""
    m = TAG.match(name)
    return m.group(1) if m else None


def netns_names() -> list[str]:
    return [n.split()[0] for n in sh("ip", "netns", "list", check=False).splitlines() if n.strip()]


def link_names() -> list[str]:
    """Every link of the root namespace (`veth@peer` names cut at the `@`)."""
    out = []
    for line in sh("ip", "-o", "link", "show", check=False).splitlines():
        parts = line.split(": ")
        if len(parts) > 1:
            out.append(parts[1].split("@")[0])
    return out


def netns_pids(ns: str) -> list[int]:
    """The processes inside namespace `ns`."""
    return [int(p) for p in sh("ip", "netns", "pids", ns, check=False).split() if p.isdigit()]


def kill_pids(pids: list[int], timeout: float = 10.0) -> list[int]:
    """SIGKILL each pid (SIGCONT is not needed for it), then wait until they are gone; the
    pids still there after `timeout`."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < end:
        # a zombie of ours is reaped; one of another parent counts as gone (it holds nothing)
        for pid in left:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        left = [pid for pid in left if _state(pid) not in (None, "Z")]
        if left:
            time.sleep(0.05)
    return left


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[0]


def delete_tagged(tag: str, namespaces: list[str], links: list[str]) -> list[str]:
    """Kill every process inside the namespaces named `tag…` (by pid), delete those
    namespaces and every link named `tag…`; what could not be deleted."""
    mine_ns = [n for n in namespaces if n.startswith(tag)]
    kill_pids([pid for ns in mine_ns for pid in netns_pids(ns)])
    failed = []
    for ns in mine_ns:
        with contextlib.suppress(NetError):
            sh("ip", "netns", "del", ns)
    for link in links:
        if link.startswith(tag):
            with contextlib.suppress(NetError):
                sh("ip", "link", "del", link)
    left_ns = set(netns_names())
    left_links = set(link_names())
    failed += [n for n in mine_ns if n in left_ns]
    failed += [n for n in links if n.startswith(tag) and n in left_links]
    return failed


def read_owner(tag: str) -> dict[str, Any] | None:
    """The owner record of `tag` (None: none, or unreadable)."""
    try:
        data = json.loads((OWNER_DIR / f"{tag}.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def dead_tags(
    names: list[str],
    owners: dict[str, dict[str, Any] | None],
    alive: Callable[[dict[str, Any]], bool],
) -> tuple[list[str], list[str]]:
    """Sorted tags of `names` (namespaces and links) whose owner record names a process
    that is gone, and those left alone (owner alive, or no owner record)."""
    tags = sorted({t for n in names if (t := tag_of(n))} | set(owners))
    dead, kept = [], []
    for t in tags:
        rec = owners.get(t)
        (dead if rec is not None and not alive(rec) else kept).append(t)
    return dead, kept


def reap_dead_runs(log: Callable[[str], None]) -> list[str]:
    """Delete what harness runs that died without cleaning up (SIGKILL) left: for each tag
    whose owner record names a process that no longer runs, the processes in its
    namespaces (by pid), the namespaces, the links and the record. Leftover probe
    namespaces (`trcprobe<pid>`) of dead pids too. The tags reaped."""
    namespaces, links = netns_names(), link_names()
    owners: dict[str, dict[str, Any] | None] = {}
    if OWNER_DIR.is_dir():
        for f in OWNER_DIR.glob("trc*.json"):
            owners[f.stem] = read_owner(f.stem)  # unreadable: left alone
    for t in {tag_of(n) for n in namespaces + links} - {None} - set(owners):
        owners[str(t)] = None
    dead, kept = dead_tags(namespaces + links, owners, owner_alive)
    for t in dead:
        rec = owners[t] or {}
        failed = delete_tagged(t, namespaces, links)
        if failed:
            log(f"chaos: a dead run's leftovers ({t}, pid {rec.get('pid')}) not deleted: {failed}")
            continue
        (OWNER_DIR / f"{t}.json").unlink(missing_ok=True)
        log(
            f"chaos: deleted the leftovers of dead run {t} (pid {rec.get('pid')});"
            f" its directory {rec.get('workdir')} is kept if it exists"
        )
    orphans = [t for t in kept if owners.get(t) is None]
    if orphans:
        log(f"chaos: namespaces/links of {orphans} have no readable owner record: left alone")
    for ns in namespaces:
        m = PROBE.match(ns)
        if m and start_time(int(m.group(1))) is None:
            kill_pids(netns_pids(ns))
            sh("ip", "netns", "del", ns, check=False)
    return dead


def free_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    """A 10.77.X.0/24 that no interface of the root namespace has an address in."""
    used = sh("ip", "-4", "-o", "addr", "show")
    taken = {f"10.77.{x}." for x in range(256) if f" 10.77.{x}." in used}
    for _ in range(512):
        x = rng.randrange(1, 255)
        if f"10.77.{x}." not in taken:
            return ipaddress.IPv4Network(f"10.77.{x}.0/24")
    raise NetError("no free 10.77.X.0/24 subnet")


@dataclass
class Host:
    """One namespace with its address."""

    name: str
    ns: str
    ip: str
    veth: str  # the root namespace's end
    blackholes: set[str] = field(default_factory=set)
    delayed: bool = False

    def exec_argv(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host's namespace (`ip netns exec` execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns, *argv]


class Network:
    """The bridge, the hosts and the faults of one harness run."""

    def __init__(self, rng: random.Random, workdir: Path | None = None) -> None:
        self.rng = rng
        self.workdir = workdir
        self.tag = f"trc{os.getpid() % 0xFFFF:04x}{rng.randrange(0x100):02x}"
        self.subnet = free_subnet(rng)
        self.bridge = f"{self.tag}br"
        self.gateway = str(self.subnet.network_address + 1)
        self.hosts: dict[str, Host] = {}
        self._made_bridge = False
        self.owner_file: Path | None = None

    def claim(self) -> None:
        """Write this run's owner record (exclusively: a tag in use by another run, live or
        dead, is never reused; a new one is drawn)."""
        OWNER_DIR.mkdir(parents=True, exist_ok=True)
        record = {"pid": os.getpid(), "start": start_time(os.getpid()),
                  "workdir": str(self.workdir) if self.workdir else None}  # fmt: skip
        taken = {t for n in netns_names() + link_names() if (t := tag_of(n))}
        for _ in range(256):
            path = OWNER_DIR / f"{self.tag}.json"
            if self.tag not in taken:
                # written whole, then linked in place: a reader never sees half a record,
                # and the link fails if another run holds the tag
                tmp = OWNER_DIR / f".{self.tag}.{os.getpid()}.tmp"
                tmp.write_text(json.dumps(record))
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    pass
                else:
                    self.owner_file = path
                    return
                finally:
                    tmp.unlink(missing_ok=True)
            self.tag = f"trc{os.getpid() % 0xFFFF:04x}{self.rng.randrange(0x100):02x}"
            self.bridge = f"{self.tag}br"
        raise NetError("no free run tag")

    def create(self) -> None:
        """The owner record, then the bridge with the root namespace's address."""
        if self.owner_file is None:
            self.claim()
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self._made_bridge = True
        sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")

    def add_host(self, name: str) -> Host:
        """A namespace joined to the bridge, with loopback up and the next address."""
        index = len(self.hosts) + 2
        ip = str(self.subnet.network_address + index)
        ns = f"{self.tag}-{name}"
        veth = f"{self.tag}v{index}"
        host = Host(name, ns, ip, veth)
        self.hosts[name] = host
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        sh("ip", "link", "set", f"{veth}p", "netns", ns)
        sh("ip", "-n", ns, "link", "set", f"{veth}p", "name", "eth0")
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "set", veth, "master", self.bridge)
        sh("ip", "link", "set", veth, "up")
        return host

    # --- faults ---------------------------------------------------------------------------
    def partition(self, host: Host, targets: list[str]) -> None:
        """`host` can no longer reach `targets` (blackhole routes in its namespace: its
        packets to them are dropped, their replies to it have nowhere to go)."""
        for ip in targets:
            if ip not in host.blackholes:
                sh("ip", "-n", host.ns, "route", "add", "blackhole", f"{ip}/32")
                host.blackholes.add(ip)

    def netem_available(self, host: Host) -> bool:
        """Whether this kernel has the netem qdisc (tried on `host`'s link, then removed)."""
        try:
            sh("tc", "-n", host.ns, "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "1ms")
        except NetError:
            return False
        sh("tc", "-n", host.ns, "qdisc", "del", "dev", "eth0", "root", check=False)
        return True

    def delay(self, host: Host, ms: int, *, netem: bool = True) -> str:
        """Slow `host`'s outgoing packets: `ms` of netem delay; without netem in the kernel,
        an htb rate limit of 64 kbit/s (small packets pass, streams queue). Says which."""
        if host.delayed:
            return ""
        if netem:
            sh(
                "tc",
                "-n",
                host.ns,
                "qdisc",
                "add",
                "dev",
                "eth0",
                "root",
                "netem",
                "delay",
                f"{ms}ms",
            )
            what = f"netem delay {ms} ms"
        else:
            sh(
                "tc",
                "-n",
                host.ns,
                "qdisc",
                "add",
                "dev",
                "eth0",
                "root",
                "handle",
                "1:",
                "htb",
                "default",
                "10",
            )
            sh("tc", "-n", host.ns, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10",
               "htb", "rate", "64kbit", "ceil", "64kbit")  # fmt: skip
            what = "htb 64 kbit/s (no netem in this kernel)"
        host.delayed = True
        return what

    def heal(self, host: Host) -> None:
        """Remove every partition and delay of `host`."""
        for ip in sorted(host.blackholes):
            sh("ip", "-n", host.ns, "route", "del", "blackhole", f"{ip}/32", check=False)
        host.blackholes.clear()
        if host.delayed:
            sh("tc", "-n", host.ns, "qdisc", "del", "dev", "eth0", "root", check=False)
            host.delayed = False

    def heal_all(self) -> None:
        """Every host healed."""
        for host in self.hosts.values():
            self.heal(host)

    # --- teardown -------------------------------------------------------------------------
    def leftovers(self) -> list[str]:
        """Namespaces and links of this run that still exist."""
        names = [n.split()[0] for n in sh("ip", "netns", "list", check=False).splitlines() if n]
        links = sh("ip", "-o", "link", "show", check=False)
        out = [n for n in names if n.startswith(self.tag)]
        out += [
            part.split("@")[0]
            for line in links.splitlines()
            for part in [line.split(": ")[1]]
            if part.startswith(self.tag)
        ]
        return out

    def kill_inside(self) -> list[int]:
        """SIGKILL every process still inside this run's namespaces (a server's children the
        server left behind, anything started in them), by pid; the pids killed."""
        pids = [pid for host in self.hosts.values() for pid in netns_pids(host.ns)]
        kill_pids(pids)
        return pids

    def destroy(self) -> None:
        """Kill what still runs inside the namespaces, delete every namespace (which deletes
        its veth pair) and the bridge of this run; the owner record once nothing is left."""
        self.kill_inside()
        for host in self.hosts.values():
            sh("ip", "netns", "del", host.ns, check=False)
            sh("ip", "link", "del", host.veth, check=False)
        if self._made_bridge:
            sh("ip", "link", "del", self.bridge, check=False)
        for name in self.leftovers():  # created, then the harness died before recording it
            with contextlib.suppress(NetError):
                if os.path.exists(os.path.join(NETNS_DIR, name)):
                    kill_pids(netns_pids(name))
                    sh("ip", "netns", "del", name)
                else:
                    sh("ip", "link", "del", name)
        if self.owner_file is not None and not self.leftovers():
            self.owner_file.unlink(missing_ok=True)
            self.owner_file = None
