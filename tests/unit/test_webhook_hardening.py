"""Webhooks hardening: IPv6 forms that carry an IPv4 address are judged by the IPv4
policy (admission and delivery), and the delivery id receivers dedupe on is signed."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from ipaddress import IPv4Address as V4
from ipaddress import IPv6Address as V6
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.webhooks import signing
from shared.webhooks.policy import EgressPolicy, Refusal, admission_refusal, classify, parse_url
from shared.webhooks.retry import AttemptOutcome
from shared.webhooks.sender import Sender
from threadrun import webhooks as client_webhooks

DEFAULT = EgressPolicy()


REFUSED_V4 = {
    "127.0.0.0/8": Refusal.LOOPBACK,
    "10.0.0.0/8": Refusal.PRIVATE,
    "172.16.0.0/12": Refusal.PRIVATE,
    "192.168.0.0/16": Refusal.PRIVATE,
    "169.254.0.0/16": Refusal.LINK_LOCAL,
}


def _v4_in(net: str) -> st.SearchStrategy[V4]:
    network = ipaddress.IPv4Network(net)
    first = int(network.network_address)
    return st.integers(0, network.num_addresses - 1).map(lambda i: V4(first + i))


refused_v4 = st.one_of(*(_v4_in(n) for n in REFUSED_V4))


def _prefixed(prefix: str) -> Callable[[V4], V6]:
    return lambda v4: V6(int(V6(prefix)) + int(v4))


def _local_nat64_48(v4: V4) -> V6:
    """RFC 6052's /48 layout: IPv4 bits 48-63 and 72-87 (bits 64-71 are zero)."""
    raw = int(v4)
    return V6(int(V6("64:ff9b:1::")) | (raw >> 16) << 64 | (raw & 0xFFFF) << 40)


def _sixtofour(v4: V4) -> V6:
    return V6(0x2002 << 112 | int(v4) << 80 | 1)


def _teredo(v4: V4) -> V6:
    """A Teredo address whose (obfuscated) client is `v4`, behind a public server."""
    server = int(V4("65.54.227.120"))
    return V6(0x20010000 << 96 | server << 64 | (int(v4) ^ 0xFFFFFFFF))


FORMS: dict[str, Callable[[V4], V6]] = {
    "ipv4-mapped ::ffff:a.b.c.d": _prefixed("::ffff:0:0"),
    "ipv4-translated (SIIT) ::ffff:0:a.b.c.d": _prefixed("::ffff:0:0:0"),
    "well-known NAT64 64:ff9b::/96": _prefixed("64:ff9b::"),
    "local-use NAT64 64:ff9b:1::/96 layout": _prefixed("64:ff9b:1::"),
    "local-use NAT64 64:ff9b:1::/48 layout": _local_nat64_48,
    "6to4 2002::/16": _sixtofour,
    "Teredo 2001::/32": _teredo,
}


@pytest.mark.parametrize("form", sorted(FORMS))
@given(v4=refused_v4)
def test_embedded_private_ipv4_is_refused_in_every_ipv6_form(form: str, v4: V4) -> None:
    """Webhooks egress: a private, loopback or link-local IPv4 address carried in any IPv6
    translation form (mapped, SIIT, NAT64 well-known and local-use, 6to4, Teredo) is
    refused, at admission (a literal host) and at delivery (a resolved address)."""
    address = FORMS[form](v4)
    assert DEFAULT.refusal(address) is not None, (form, str(address))
    assert admission_refusal(parse_url(f"http://[{address}]/h"), DEFAULT) is not None
    sender = Sender(DEFAULT, timeout_s=1, max_response_bytes=10, resolver=lambda _h, _p: [address])
    result = sender.post("http://hooks.test/h", b"{}", {})
    assert result.outcome is AttemptOutcome.REFUSED, (form, str(address))


@pytest.mark.parametrize(
    ("form", "reason"),
    [
        ("ipv4-translated (SIIT) ::ffff:0:a.b.c.d", Refusal.LOOPBACK),
        ("well-known NAT64 64:ff9b::/96", Refusal.LOOPBACK),
        ("6to4 2002::/16", Refusal.LOOPBACK),
        ("Teredo 2001::/32", Refusal.LOOPBACK),
    ],
)
def test_the_reason_is_the_embedded_ipv4s(form: str, reason: Refusal) -> None:
    """Webhooks egress: the IPv4 policy decides, so the 422 / audit names its reason."""
    assert classify(FORMS[form](V4("127.0.0.1"))) is reason


@pytest.mark.parametrize("url", ["http://[::ffff:0:7f00:1]/", "http://[64:ff9b:1::a9fe:a9fe]/"])
def test_the_reported_translated_forms_are_refused_at_admission(url: str) -> None:
    """Webhooks egress: the two forms of the adversarial review (SIIT loopback, local-use
    NAT64 of the metadata address) are refused at admission."""
    assert admission_refusal(parse_url(url), DEFAULT) is not None


def test_public_ipv4_in_a_global_translation_form_still_passes() -> None:
    """Webhooks egress: SIIT, mapped, well-known NAT64 and 6to4 of a public IPv4 pass;
    local-use NAT64 (a deployment-local translator) and Teredo stay refused (reserved)."""
    public = V4("93.184.216.34")
    for form in ("ipv4-mapped ::ffff:a.b.c.d", "ipv4-translated (SIIT) ::ffff:0:a.b.c.d"):
        assert classify(FORMS[form](public)) is None, form
    for form in ("well-known NAT64 64:ff9b::/96", "6to4 2002::/16"):
        assert classify(FORMS[form](public)) is None, form
    assert classify(_local_nat64_48(public)) is Refusal.RESERVED
    assert classify(_teredo(public)) is Refusal.RESERVED
    allow = EgressPolicy.parse("64:ff9b:1::/48")
    assert allow.refusal(_local_nat64_48(public)) is None  # the operator may list it


# --- the signed delivery id -----------------------------------------------------------------
SECRET = b"s3cret"
BODY = b'{"run_id":"r1","values":{}}'
TS = 1_700_000_000


def _signed(delivery_id: str) -> dict[str, str]:
    header = signing.signature_header(SECRET, BODY, delivery_id=delivery_id, timestamp=TS)
    return {signing.SIGNATURE_HEADER: header, signing.DELIVERY_HEADER: delivery_id}


def test_a_replay_with_a_changed_delivery_header_fails_verification() -> None:
    """Webhooks signing: a captured delivery replayed within the tolerance under a new
    X-Threadrun-Delivery (to slip past the receiver's dedupe) does not verify."""
    headers = _signed("1ef0c3a2-run")
    assert client_webhooks.verify(SECRET, headers, BODY, now=TS + 10).delivery_id == (
        "1ef0c3a2-run"
    )
    replay = {**headers, signing.DELIVERY_HEADER: "another-id"}
    with pytest.raises(client_webhooks.WebhookVerificationError, match="does not match"):
        client_webhooks.verify(SECRET, replay, BODY, now=TS + 10)


def test_the_v1_signature_alone_is_not_accepted() -> None:
    """Webhooks signing: v1 (timestamp + body only) is still sent for older receivers, but
    verify needs v2, so stripping v2 from a replay does not bring the unsigned id back."""
    headers = _signed("d1")
    v1_only = headers[signing.SIGNATURE_HEADER].rsplit(",v2=", 1)[0]
    assert v1_only.startswith(f"t={TS},v1=")
    assert signing.signature(SECRET, TS, BODY) == v1_only.partition(",v1=")[2]  # old receivers
    with pytest.raises(client_webhooks.WebhookVerificationError, match="v2"):
        client_webhooks.verify(SECRET, {**headers, signing.SIGNATURE_HEADER: v1_only}, BODY, now=TS)


@pytest.mark.parametrize(
    "headers",
    [
        {signing.SIGNATURE_HEADER: "t=1,v2=ab"},
        {signing.SIGNATURE_HEADER: "t=1,v2=ab", signing.DELIVERY_HEADER: ""},
        {signing.SIGNATURE_HEADER: "t=1,v2=ab", signing.DELIVERY_HEADER: "a.b"},
    ],
)
def test_a_missing_or_malformed_delivery_header_is_refused(headers: dict[str, Any]) -> None:
    """Webhooks signing: no delivery id (or one with the separator) -> verification error."""
    with pytest.raises(client_webhooks.WebhookVerificationError, match="Delivery"):
        client_webhooks.verify(SECRET, headers, BODY, now=1)


@given(st.binary(max_size=256), st.uuids(), st.uuids())
def test_the_delivery_id_is_bound_to_the_signature(body: bytes, a: Any, b: Any) -> None:
    """Webhooks signing: for any body, a signature verifies under its own delivery id
    only, and the server's header equals the client helper's."""
    header = signing.signature_header(SECRET, body, delivery_id=str(a), timestamp=TS)
    assert client_webhooks.sign(SECRET, body, str(a), TS) == header
    good = {signing.SIGNATURE_HEADER: header, signing.DELIVERY_HEADER: str(a)}
    assert client_webhooks.verify(SECRET, good, body, now=TS).delivery_id == str(a)
    if a != b:
        with pytest.raises(client_webhooks.WebhookVerificationError):
            client_webhooks.verify(SECRET, {**good, signing.DELIVERY_HEADER: str(b)}, body, now=TS)
