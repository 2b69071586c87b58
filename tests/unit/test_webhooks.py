"""Webhooks: the egress policy, the URL check, signatures and the retry schedule
(pure parts, no network but a local socket in the sender test)."""

from __future__ import annotations

import ipaddress
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from app.schemas import RunCreate, StatelessRunCreate
from shared.webhooks import signing
from shared.webhooks.policy import (
    BadWebhookUrl,
    EgressPolicy,
    Refusal,
    admission_refusal,
    classify,
    parse_url,
)
from shared.webhooks.retry import AttemptOutcome, Backoff, outcome_of_status, parse_retry_after
from shared.webhooks.sender import Sender
from threadrun import webhooks as client_webhooks

DEFAULT = EgressPolicy()

REFUSED_NETS = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::1/128",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
]


def _address_in(net: str) -> st.SearchStrategy[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    network = ipaddress.ip_network(net)
    first, size = int(network.network_address), network.num_addresses
    cls = ipaddress.IPv4Address if network.version == 4 else ipaddress.IPv6Address
    return st.integers(0, size - 1).map(lambda i: cls(first + i))


refused_addresses = st.one_of(*(_address_in(n) for n in REFUSED_NETS))


@given(refused_addresses)
def test_every_private_loopback_link_local_address_is_refused(address: Any) -> None:
    """Webhooks: loopback, private, link-local, CGNAT, multicast, reserved: all refused."""
    assert DEFAULT.refusal(address) is not None


@given(refused_addresses)
def test_ipv4_mapped_and_nat64_forms_are_refused_too(address: Any) -> None:
    """Webhooks: ::ffff:10.0.0.1 or 64:ff9b::a00:1 reach the same host as 10.0.0.1."""
    if address.version != 4:
        return
    mapped = ipaddress.IPv6Address(f"::ffff:{address}")
    nat64 = ipaddress.IPv6Address(int(ipaddress.IPv6Address("64:ff9b::")) + int(address))
    assert DEFAULT.refusal(mapped) is not None
    assert DEFAULT.refusal(nat64) is not None


@given(refused_addresses)
def test_an_allowed_network_lets_its_addresses_through(address: Any) -> None:
    """Webhooks: THREADRUN_WEBHOOK_ALLOW lists CIDRs that are let through."""
    net = ipaddress.ip_network(f"{address}/{address.max_prefixlen}")
    assert EgressPolicy.parse(f" {net} , example.org").refusal(address) is None


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("169.254.169.254", Refusal.METADATA),
        ("fd00:ec2::254", Refusal.METADATA),
        ("100.100.100.200", Refusal.METADATA),
        ("127.0.0.1", Refusal.LOOPBACK),
        ("::", Refusal.UNSPECIFIED),
        ("100.64.1.1", Refusal.CGNAT),
        ("192.0.2.1", Refusal.RESERVED),
        ("2001:db8::1", Refusal.RESERVED),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_classify(address: str, reason: Refusal | None) -> None:
    """Webhooks: metadata endpoints are named as such; public addresses pass."""
    assert classify(ipaddress.ip_address(address)) == reason


def test_one_refused_address_of_a_host_refuses_it() -> None:
    """Webhooks: ANY resolved address refused -> the delivery is refused."""
    addrs = [ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("10.1.2.3")]
    assert DEFAULT.first_refusal("mixed.example", addrs) == (addrs[1], Refusal.PRIVATE)
    assert EgressPolicy.parse("mixed.example").first_refusal("mixed.example", addrs) is None
    assert EgressPolicy.parse("10.0.0.0/8").first_refusal("mixed.example", addrs) is None


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/x",
        "example.com/hook",
        "/relative",
        "http://user:pw@example.com/",
        "http://user@example.com/",
        "https:///nohost",
        "http://example.com:0/",
        "http://example.com:99999/",
        "http://exa mple.com/",
        "http://example.com/#frag",
        "http://example.com/\n",
        "javascript:alert(1)",
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    """Webhooks: an absolute http(s) URL without credentials, or 422 naming `webhook`."""
    with pytest.raises(BadWebhookUrl):
        parse_url(url)
    with pytest.raises(ValidationError) as err:
        RunCreate.model_validate({"assistant_id": "a", "webhook": url})
    assert err.value.errors()[0]["loc"] == ("webhook",)


def test_good_urls_and_the_length_limit() -> None:
    """Webhooks: http(s) with host, port, path and query pass; the length is bounded."""
    u = parse_url("https://Hooks.Example.com:8443/a/b?x=1")
    assert (u.scheme, u.host, u.port, u.host_header) == (
        "https",
        "hooks.example.com",
        8443,
        "hooks.example.com:8443",
    )
    assert parse_url("http://[::1]/").host_header == "[::1]"
    with pytest.raises(BadWebhookUrl, match="at most 30"):
        parse_url("https://example.com/" + "a" * 30, max_length=30)
    run = StatelessRunCreate.model_validate({"assistant_id": "a", "webhook": "https://e.com/h"})
    assert run.to_request().webhook == "https://e.com/h"


def test_admission_refuses_only_literal_ips() -> None:
    """Webhooks: a literal private IP is refused at admission; a name waits for delivery."""
    assert admission_refusal(parse_url("http://10.0.0.1/h"), DEFAULT) is Refusal.PRIVATE
    assert admission_refusal(parse_url("http://[::1]:80/h"), DEFAULT) is Refusal.LOOPBACK
    assert admission_refusal(parse_url("http://internal.example/h"), DEFAULT) is None
    allow = EgressPolicy.parse("127.0.0.1")
    assert admission_refusal(parse_url("http://127.0.0.1:9/h"), allow) is None


# --- signatures ------------------------------------------------------------------------------
def test_signature_verifies_with_the_client_helper() -> None:
    """Webhooks: the server's signature verifies with threadrun.webhooks.verify."""
    body = b'{"run_id":"r","values":{"x":1}}'
    header = signing.signature_header(b"s3cret", body, delivery_id="r", timestamp=1_700_000_000)
    headers = {"x-threadrun-signature": header, "x-threadrun-delivery": "r"}  # any case
    verified = client_webhooks.verify("s3cret", headers, body, now=1_700_000_100)
    assert verified == client_webhooks.VerifiedDelivery(1_700_000_000, "r")
    assert client_webhooks.sign("s3cret", body, "r", 1_700_000_000) == header


@pytest.mark.parametrize(
    ("secret", "body", "now", "match"),
    [
        ("other", b"{}", 1_700_000_000, "does not match"),
        ("s3cret", b"{} ", 1_700_000_000, "does not match"),
        ("s3cret", b"{}", 1_700_000_301, "tolerance"),
        ("s3cret", b"{}", 1_699_999_699, "tolerance"),
    ],
)
def test_signature_refusals(secret: str, body: bytes, now: int, match: str) -> None:
    """Webhooks: another secret, another body, or a stale timestamp (replay) is refused."""
    header = signing.signature_header(b"s3cret", b"{}", delivery_id="d", timestamp=1_700_000_000)
    headers = {signing.SIGNATURE_HEADER: header, signing.DELIVERY_HEADER: "d"}
    with pytest.raises(client_webhooks.WebhookVerificationError, match=match):
        client_webhooks.verify(secret, headers, body, 300, now=now)


@pytest.mark.parametrize("header", [None, "", "garbage", "t=1", "v1=ab", "t=x,v1=ab"])
def test_malformed_signature_headers(header: str | None) -> None:
    """Webhooks: a missing or malformed header is a verification error, never a crash."""
    headers = {signing.DELIVERY_HEADER: "d"}
    if header is not None:
        headers[signing.SIGNATURE_HEADER] = header
    with pytest.raises(client_webhooks.WebhookVerificationError):
        client_webhooks.verify("s", headers, b"{}", now=1)


@given(st.binary(max_size=512), st.integers(0, 2**40))
def test_sign_then_verify_roundtrip(body: bytes, ts: int) -> None:
    """Webhooks: for any body and timestamp, what is signed verifies within tolerance."""
    header = signing.signature_header(b"k", body, delivery_id="d", timestamp=ts)
    headers = {signing.SIGNATURE_HEADER: header, signing.DELIVERY_HEADER: "d"}
    assert client_webhooks.verify(b"k", headers, body, now=ts).timestamp == ts


# --- retries ---------------------------------------------------------------------------------
BACKOFF = Backoff(base_s=2.0, cap_s=60.0, retry_after_cap_s=120.0, max_attempts=5)


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, AttemptOutcome.DELIVERED),
        (204, AttemptOutcome.DELIVERED),
        (301, AttemptOutcome.REDIRECT),
        (400, AttemptOutcome.REJECTED),
        (404, AttemptOutcome.REJECTED),
        (429, AttemptOutcome.RETRYABLE_STATUS),
        (500, AttemptOutcome.RETRYABLE_STATUS),
        (503, AttemptOutcome.RETRYABLE_STATUS),
    ],
)
def test_outcome_of_status(status: int, outcome: AttemptOutcome) -> None:
    """Webhooks: retry on 429 and 5xx, not on other 4xx or a redirect."""
    assert outcome_of_status(status) is outcome


@given(st.integers(1, 40), st.integers(0, 2**32))
def test_backoff_grows_within_jitter_bounds(attempt: int, seed: int) -> None:
    """Webhooks: exponential backoff with jitter in [step/2, step], step capped."""
    step = min(60.0, 2.0 * 2 ** (attempt - 1))
    delay = BACKOFF.delay(attempt, random.Random(seed))
    assert step / 2 <= delay <= step


def test_next_delay_rules() -> None:
    """Webhooks: no retry when delivered, not retryable or out of attempts; Retry-After
    honoured up to its cap."""
    rng = random.Random(1)
    assert BACKOFF.next_delay(AttemptOutcome.DELIVERED, 1) is None
    assert BACKOFF.next_delay(AttemptOutcome.REJECTED, 1) is None
    assert BACKOFF.next_delay(AttemptOutcome.REFUSED, 1) is None
    assert BACKOFF.next_delay(AttemptOutcome.TIMEOUT, 5) is None
    delay = BACKOFF.next_delay(AttemptOutcome.TIMEOUT, 1, rng=rng)
    assert delay is not None and 1.0 <= delay <= 2.0
    assert BACKOFF.next_delay(AttemptOutcome.RETRYABLE_STATUS, 1, 90.0, rng) == 90.0
    assert BACKOFF.next_delay(AttemptOutcome.RETRYABLE_STATUS, 1, 9999.0, rng) == 120.0


def test_parse_retry_after() -> None:
    """Webhooks: Retry-After as seconds or as an HTTP date."""
    assert parse_retry_after("30", 0) == 30.0
    assert parse_retry_after("Thu, 01 Jan 1970 00:01:40 GMT", 40.0) == 60.0
    assert parse_retry_after("soon", 0) is None
    assert parse_retry_after(None, 0) is None


# --- the sender against a local socket ----------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict[str, str], bytes]] = []
    answer = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.seen.append((self.path, dict(self.headers), body))
        self.send_response(self.answer)
        if self.answer == 302:
            self.send_header("Location", "http://169.254.169.254/")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    _Handler.seen, _Handler.answer = [], 200
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_sender_connects_to_the_checked_address_with_the_host_header(
    receiver: ThreadingHTTPServer,
) -> None:
    """Webhooks: no DNS rebinding — the name is resolved once (here by a fake resolver),
    checked, and the connection goes to that address with the original Host header."""
    port = receiver.server_address[1]
    calls: list[str] = []

    def resolver(host: str, _port: int) -> list[Any]:
        calls.append(host)
        return [ipaddress.ip_address("127.0.0.1")]

    refused = Sender(EgressPolicy(), timeout_s=2, max_response_bytes=10, resolver=resolver)
    result = refused.post(f"http://hooks.test:{port}/in", b"{}", {})
    assert result.outcome is AttemptOutcome.REFUSED and "loopback" in (result.error or "")
    assert not _Handler.seen  # nothing was sent
    allowed = Sender(
        EgressPolicy.parse("hooks.test"), timeout_s=2, max_response_bytes=10, resolver=resolver
    )
    result = allowed.post(f"http://hooks.test:{port}/in?q=1", b'{"a":1}', {"X-Test": "1"})
    assert (result.outcome, result.status, result.address) == (
        AttemptOutcome.DELIVERED,
        200,
        "127.0.0.1",
    )
    path, headers, body = _Handler.seen[-1]
    assert (path, headers["Host"], headers["X-Test"], body) == (
        "/in?q=1",
        f"hooks.test:{port}",
        "1",
        b'{"a":1}',
    )
    assert calls == ["hooks.test", "hooks.test"]


def test_sender_never_follows_a_redirect(receiver: ThreadingHTTPServer) -> None:
    """Webhooks: a redirect is a failed attempt that says so (and is not retried)."""
    _Handler.answer = 302
    sender = Sender(EgressPolicy.parse("127.0.0.1"), timeout_s=2, max_response_bytes=10)
    result = sender.post(f"http://127.0.0.1:{receiver.server_address[1]}/", b"{}", {})
    assert result.outcome is AttemptOutcome.REDIRECT and "not followed" in (result.error or "")
    assert len(_Handler.seen) == 1


def test_sender_connection_error_is_retryable() -> None:
    """Webhooks: nothing listening -> a connection error (retried)."""
    sender = Sender(EgressPolicy.parse("127.0.0.1"), timeout_s=1, max_response_bytes=10)
    result = sender.post("http://127.0.0.1:9/", b"{}", {})
    assert result.outcome is AttemptOutcome.CONNECTION_ERROR
    assert result.outcome.retryable
