"""The egress policy of webhooks (SSRF): which addresses a delivery may connect to.

A webhook URL comes from a client, and the worker that POSTs to it sits inside the
deployment's network, next to Redis, PostgreSQL and the cloud's metadata service. So
every address the URL's host resolves to is checked, and *any* refused address refuses
the delivery (a host answering one public and one private address is how DNS rebinding
starts); the connection then goes to an address that was checked, never to a second
resolution (see shared/webhooks/sender.py). Refused unless `THREADRUN_WEBHOOK_ALLOW`
lists them: loopback, private (RFC 1918, ULA), link-local, CGNAT, multicast, unspecified,
reserved and documentation ranges, and the metadata endpoints of the clouds.

Everything here is pure (no DNS): the admission check of a literal IP host and the
delivery check of resolved addresses share `EgressPolicy.refusal`.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from shared.errors import ValidationFailed

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class Refusal(enum.StrEnum):
    """Why an address is refused (the audit event and the 422 say which)."""

    LOOPBACK = "loopback"
    PRIVATE = "private"
    LINK_LOCAL = "link_local"
    CGNAT = "cgnat"
    MULTICAST = "multicast"
    UNSPECIFIED = "unspecified"
    RESERVED = "reserved"
    METADATA = "metadata"


METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.123",  # AWS time sync
        "100.100.100.200",  # Alibaba Cloud
        "fd00:ec2::254",  # AWS IPv6 metadata
        "fd00:ec2::23",  # AWS IPv6 DNS
    )
)


def _nets(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


RANGES: tuple[tuple[Refusal, tuple[IPNetwork, ...]], ...] = (
    (Refusal.UNSPECIFIED, _nets("0.0.0.0/8", "::/128")),
    (Refusal.LOOPBACK, _nets("127.0.0.0/8", "::1/128")),
    (Refusal.PRIVATE, _nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")),
    (Refusal.LINK_LOCAL, _nets("169.254.0.0/16", "fe80::/10")),
    (Refusal.CGNAT, _nets("100.64.0.0/10")),
    (Refusal.MULTICAST, _nets("224.0.0.0/4", "ff00::/8")),
    (
        Refusal.RESERVED,
        _nets(
            "192.0.0.0/24",  # IETF protocol assignments
            "192.0.2.0/24",  # TEST-NET-1
            "192.88.99.0/24",  # 6to4 relay anycast
            "198.18.0.0/15",  # benchmarking
            "198.51.100.0/24",  # TEST-NET-2
            "203.0.113.0/24",  # TEST-NET-3
            "240.0.0.0/4",  # reserved, and 255.255.255.255 broadcast
            "100::/64",  # discard-only
            "2001::/23",  # IETF protocol assignments (Teredo, ORCHID, …)
            "2001:db8::/32",  # documentation
            "fec0::/10",  # deprecated site-local
            "3fff::/20",  # documentation (RFC 9637)
        ),
    ),
)


_SIIT = ipaddress.ip_network("::ffff:0:0:0/96")  # IPv4-translated (RFC 2765): ::ffff:0:a.b.c.d
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # the well-known NAT64 prefix (RFC 6052)
_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")  # local-use NAT64 (RFC 8215)


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (IPv4-mapped, IPv4-translated (SIIT),
    IPv4-compatible, NAT64, 6to4), which is where a packet to it really goes; None for none.
    (Teredo carries two, see `teredo_ipv4s`; a local-use NAT64 address carries one where
    its operator's prefix length puts it, so it is refused whole, see `classify`.)"""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    packed = address.packed
    if packed[:12] == bytes(12) and int(address) > 1:  # ::a.b.c.d (deprecated compatible)
        return ipaddress.IPv4Address(packed[12:])
    if address in _SIIT or address in _NAT64:
        return ipaddress.IPv4Address(packed[12:])
    return None


def teredo_ipv4s(address: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """The server and (de-obfuscated) client IPv4 addresses of a Teredo address
    (2001::/32), empty for any other."""
    if not isinstance(address, ipaddress.IPv6Address) or address.teredo is None:
        return ()
    return address.teredo


def classify(address: IPAddress) -> Refusal | None:
    """Why the address is refused by default, or None for a public unicast address.

    An IPv6 address that carries an IPv4 one is judged by the IPv4 policy; a Teredo
    address by its embedded IPv4s first and then by its own (reserved) range; a local-use
    NAT64 address (64:ff9b:1::/48, which reaches whatever the local translator maps, at
    an offset its operator chose) is refused whole, as reserved, or with the reason of
    the IPv4 address its last 32 bits name in the /96 layout."""
    inner = embedded_ipv4(address)
    if inner is not None:
        return classify(inner)
    for carried in teredo_ipv4s(address):
        reason = classify(carried)
        if reason is not None:
            return reason
    if address in _LOCAL_NAT64:
        packed = address.packed
        if packed[6:12] == bytes(6):  # the /96 layout: the IPv4 address is the last 32 bits
            return classify(ipaddress.IPv4Address(packed[12:])) or Refusal.RESERVED
        return Refusal.RESERVED
    if address in METADATA_ADDRESSES:
        return Refusal.METADATA
    for refusal, networks in RANGES:
        if any(address in net for net in networks):
            return refusal
    if not address.is_global:  # whatever else IANA marks not globally reachable
        return Refusal.RESERVED
    return None


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """The default refusals, less what `THREADRUN_WEBHOOK_ALLOW` lists."""

    allow_networks: tuple[IPNetwork, ...] = ()
    allow_hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, allow: str) -> EgressPolicy:
        """From the comma-separated CIDRs, addresses and host names of the setting."""
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        for entry in filter(None, (e.strip() for e in allow.split(","))):
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                hosts.add(entry.lower().rstrip("."))
        return cls(tuple(networks), frozenset(hosts))

    def host_allowed(self, host: str) -> bool:
        """Whether the host name itself is listed (every address it resolves to is allowed)."""
        return host.lower().rstrip(".") in self.allow_hosts

    def refusal(self, address: IPAddress, host: str = "") -> Refusal | None:
        """Why a delivery to `address` (resolved from `host`) is refused; None if allowed."""
        reason = classify(address)
        if reason is None or self.host_allowed(host):
            return None
        targets = [address]
        inner = embedded_ipv4(address)
        if inner is not None:
            targets.append(inner)
        for target in targets:
            if any(target.version == n.version and target in n for n in self.allow_networks):
                return None
        return reason

    def first_refusal(
        self, host: str, addresses: Iterable[IPAddress]
    ) -> tuple[IPAddress, Refusal] | None:
        """The first refused address of a host's resolution with its reason (one is enough
        to refuse the delivery), or None when every address is allowed."""
        for address in addresses:
            reason = self.refusal(address, host)
            if reason is not None:
                return address, reason
        return None


class BadWebhookUrl(ValidationFailed):
    """A webhook URL that is not an absolute http(s) URL we may send to (422 naming it)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="webhook")


@dataclass(frozen=True, slots=True)
class WebhookUrl:
    """A checked webhook URL: scheme, host (no brackets), port and the literal IP if any."""

    url: str
    scheme: str
    host: str
    port: int
    address: IPAddress | None

    @property
    def host_header(self) -> str:
        """The Host header (the port only when not the scheme's default)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def parse_url(url: str, *, max_length: int | None = None) -> WebhookUrl:
    """Check the shape of a webhook URL (no DNS): absolute http(s), a host, no credentials,
    no fragment, a valid port, at most `max_length` characters; BadWebhookUrl otherwise."""
    if max_length is not None and len(url) > max_length:
        raise BadWebhookUrl(f"at most {max_length} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise BadWebhookUrl("must not contain whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadWebhookUrl(f"not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise BadWebhookUrl("must be an absolute http:// or https:// URL")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise BadWebhookUrl("must not carry credentials (user:password@)")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise BadWebhookUrl("must name a host")
    if parts.fragment:
        raise BadWebhookUrl("must not have a fragment")
    try:
        address: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
        if not all(c.isalnum() or c in "-._" for c in host):
            raise BadWebhookUrl("host is not a valid host name") from None
    if port == 0:
        raise BadWebhookUrl("port must be 1-65535")
    return WebhookUrl(url, scheme, host, port or (443 if scheme == "https" else 80), address)


def admission_refusal(url: WebhookUrl, policy: EgressPolicy) -> Refusal | None:
    """The admission check: a literal IP host refused by the policy (a host name is checked
    after resolution, at every delivery attempt)."""
    if url.address is None:
        return None
    return policy.refusal(url.address, url.host)


def addresses_of(infos: Sequence[tuple[object, ...]]) -> list[IPAddress]:
    """The distinct addresses of a `getaddrinfo` answer, in its order (scope ids dropped)."""
    out: list[IPAddress] = []
    for info in infos:
        sockaddr = info[4]
        if not isinstance(sockaddr, tuple) or not sockaddr:
            continue
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in out:
            out.append(address)
    return out
