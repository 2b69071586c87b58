"""Hosts as network namespaces on one bridge, and the network faults between them.

Each harness run makes a bridge in the root namespace and one namespace per host, joined by a
veth pair (the host's end is `eth0`), on a private /24 of 10.77.0.0/16 that no interface of
the machine uses yet; namespace and link names carry a per-run prefix (`trc<hex>`), so
parallel runs never collide. The root namespace holds `.1` (the harness reaches every host);
hosts get `.2` on. Faults are applied inside one host's namespace: blackhole routes (a
partition from that host to some addresses) and `tc netem` delay on its `eth0`.
`destroy()` deletes exactly what this run created, also when creating it failed half way.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import subprocess
from dataclasses import dataclass, field

NETNS_DIR = "/run/netns"


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

    def __init__(self, rng: random.Random) -> None:
        self.tag = f"trc{os.getpid() % 0xFFFF:04x}{rng.randrange(0x100):02x}"
        self.subnet = free_subnet(rng)
        self.bridge = f"{self.tag}br"
        self.gateway = str(self.subnet.network_address + 1)
        self.hosts: dict[str, Host] = {}
        self._made_bridge = False

    def create(self) -> None:
        """The bridge with the root namespace's address."""
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

    def destroy(self) -> None:
        """Delete every namespace (which deletes its veth pair) and the bridge of this run."""
        for host in self.hosts.values():
            sh("ip", "netns", "del", host.ns, check=False)
            sh("ip", "link", "del", host.veth, check=False)
        if self._made_bridge:
            sh("ip", "link", "del", self.bridge, check=False)
        for name in self.leftovers():  # created, then the harness died before recording it
            with contextlib.suppress(NetError):
                if os.path.exists(os.path.join(NETNS_DIR, name)):
                    sh("ip", "netns", "del", name)
                else:
                    sh("ip", "link", "del", name)
