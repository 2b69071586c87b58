"""One delivery attempt: resolve, check every address, POST to a checked one.

No DNS rebinding: the host is resolved once, every address is checked by the egress
policy, and the connection goes to the checked address itself (the URL's host replaced
by the IP), with the original `Host` header and, for https, the original name as SNI and
as the name the certificate must match (httpx's `sni_hostname` extension). Redirects are
never followed, proxies from the environment never used (`trust_env=False`: a proxy would
resolve the name again), and at most `max_response_bytes` of the answer are read.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import httpx

from shared.webhooks.policy import (
    EgressPolicy,
    IPAddress,
    WebhookUrl,
    addresses_of,
    parse_url,
)
from shared.webhooks.retry import AttemptOutcome, outcome_of_status, parse_retry_after

Resolver = Callable[[str, int], Sequence[IPAddress]]


def resolve(host: str, port: int) -> list[IPAddress]:
    """The host's addresses (A and AAAA) from the system resolver."""
    return addresses_of(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """What one attempt did (the audit event's payload is built from it)."""

    outcome: AttemptOutcome
    duration_s: float
    status: int | None = None
    error: str | None = None
    address: str | None = None
    retry_after_s: float | None = None


class Sender:
    """POSTs bodies under the egress policy with one pooled httpx client."""

    def __init__(
        self,
        policy: EgressPolicy,
        *,
        timeout_s: float,
        max_response_bytes: int,
        connect_timeout_s: float | None = None,
        resolver: Resolver = resolve,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """`timeout_s` bounds each wait of an attempt (for the answer's first byte, for
        each read, for the pool); `connect_timeout_s` the connect alone (shorter: a
        receiver that does not even accept must not hold a delivery thread for long)."""
        self.policy = policy
        self._max_response = max_response_bytes
        self._resolve = resolver
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s or timeout_s),
            follow_redirects=False,
            trust_env=False,
            transport=transport,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> AttemptResult:
        """One attempt; never raises for what the network or the receiver does."""
        started = time.monotonic()

        def done(outcome: AttemptOutcome, error: str, address: str | None = None) -> AttemptResult:
            return AttemptResult(outcome, time.monotonic() - started, error=error, address=address)

        target = parse_url(url)
        try:
            addresses = (
                [target.address]
                if target.address is not None
                else self._resolve(target.host, target.port)
            )
        except OSError as exc:
            return done(AttemptOutcome.CONNECTION_ERROR, f"resolve {target.host}: {exc}")
        if not addresses:
            return done(AttemptOutcome.CONNECTION_ERROR, f"{target.host} has no address")
        refused = self.policy.first_refusal(target.host, addresses)
        if refused is not None:
            address, reason = refused
            return done(
                AttemptOutcome.REFUSED,
                f"egress policy: {target.host} resolves to {address} ({reason})",
                str(address),
            )
        last: AttemptResult | None = None
        for address in addresses:  # the next checked address only if this one cannot connect
            last = self._post_to(target, address, body, headers, started)
            if last.outcome is not AttemptOutcome.CONNECTION_ERROR:
                return last
        assert last is not None
        return last

    def _post_to(
        self,
        target: WebhookUrl,
        address: IPAddress,
        body: bytes,
        headers: Mapping[str, str],
        started: float,
    ) -> AttemptResult:
        host = f"[{address}]" if address.version == 6 else str(address)
        url = httpx.URL(target.url).copy_with(host=host.strip("[]"), port=target.port)
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        request = self._client.build_request(
            "POST",
            url,
            content=body,
            headers={**headers, "Host": target.host_header},
            extensions=extensions,
        )
        try:
            response = self._client.send(request, stream=True)
            try:
                read = 0
                for chunk in response.iter_raw():
                    read += len(chunk)
                    if read >= self._max_response:
                        break
            finally:
                response.close()
        except httpx.HTTPError as exc:
            timed_out = isinstance(exc, httpx.TimeoutException)
            return AttemptResult(
                AttemptOutcome.TIMEOUT if timed_out else AttemptOutcome.CONNECTION_ERROR,
                time.monotonic() - started,
                error=_why(exc),
                address=str(address),
            )
        outcome = outcome_of_status(response.status_code)
        error = None
        if outcome is AttemptOutcome.REDIRECT:
            error = f"redirect to {response.headers.get('location', '?')!r} not followed"
        elif outcome is not AttemptOutcome.DELIVERED:
            error = f"HTTP {response.status_code}"
        return AttemptResult(
            outcome,
            time.monotonic() - started,
            status=response.status_code,
            error=error,
            address=str(address),
            retry_after_s=parse_retry_after(response.headers.get("retry-after"), time.time()),
        )


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]
