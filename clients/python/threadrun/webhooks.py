"""Verify a threadrun webhook delivery (the receiver's side).

    from threadrun import webhooks

    def handle(request):                       # any web framework
        body = request.get_data()              # the raw bytes, before any JSON parsing
        try:
            delivery = webhooks.verify(SECRET, request.headers, body, tolerance_s=300)
        except webhooks.WebhookVerificationError:
            return "", 400
        if already_seen(delivery.delivery_id):  # signed: a replay cannot change it
            return "", 200                     # a retry of a delivery you handled
        run = json.loads(body)                 # the run as runs.get returns it, + "values"
        ...

The `X-Threadrun-Signature` header is `t=<unix ts>,v1=<hex>,v2=<hex>`. The `v2` hex is the
HMAC-SHA256, keyed with the deployment's `THREADRUN_WEBHOOK_SECRET`, of the bytes
`<ts>.<delivery id>.<body>`, where the delivery id is the `X-Threadrun-Delivery` header (the
run id): dedupe on `VerifiedDelivery.delivery_id`, which is signed, never on an unchecked
header. `v1` (the HMAC of `<ts>.<body>`, which leaves the delivery id unsigned) is still sent
for older receivers and is not accepted here. Checking the timestamp against `tolerance_s`
refuses a captured delivery replayed later. This module needs nothing but the standard
library.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass

SIGNATURE_HEADER = "X-Threadrun-Signature"
DELIVERY_HEADER = "X-Threadrun-Delivery"
ATTEMPT_HEADER = "X-Threadrun-Attempt"
DEFAULT_TOLERANCE_S = 300.0

__all__ = [
    "ATTEMPT_HEADER",
    "DEFAULT_TOLERANCE_S",
    "DELIVERY_HEADER",
    "SIGNATURE_HEADER",
    "VerifiedDelivery",
    "WebhookVerificationError",
    "sign",
    "verify",
]


class WebhookVerificationError(ValueError):
    """The delivery's signature is missing, malformed, wrong or too old."""


@dataclass(frozen=True, slots=True)
class VerifiedDelivery:
    """What the signature proves: when the delivery was signed and its delivery id (the
    run id, the same for every attempt: the key to dedupe on)."""

    timestamp: int
    delivery_id: str


def _digest(key: bytes, ts: int, delivery_id: str, body: bytes) -> str:
    return hmac.new(key, f"{ts}.{delivery_id}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: str | bytes, body: bytes, delivery_id: str, timestamp: int | None = None) -> str:
    """An `X-Threadrun-Signature` value (`t=`, `v1=`, `v2=`) for `body` sent as delivery
    `delivery_id` (for tests of your receiver)."""
    if "." in delivery_id:
        raise ValueError("a delivery id must not contain a dot")
    key = secret.encode() if isinstance(secret, str) else secret
    ts = int(time.time()) if timestamp is None else int(timestamp)
    legacy = hmac.new(key, f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={legacy},v2={_digest(key, ts, delivery_id, body)}"


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    wanted = name.lower()
    for key, val in headers.items():
        if key.lower() == wanted:
            return val
    return None


def verify(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    *,
    now: float | None = None,
) -> VerifiedDelivery:
    """Check a delivery's signature; returns its signed timestamp and delivery id.

    `headers`: the request's headers (any mapping; names are matched case-insensitively);
    `body`: the exact bytes received. Raises WebhookVerificationError when a header is
    missing or malformed, no `v2` signature of `<t>.<X-Threadrun-Delivery>.<body>` matches
    (compared in constant time), or the timestamp is more than `tolerance_s` away from
    `now` (default: the current time).
    """
    header = _header(headers, SIGNATURE_HEADER)
    if not header:
        raise WebhookVerificationError(f"no {SIGNATURE_HEADER} header")
    delivery_id = _header(headers, DELIVERY_HEADER)
    if not delivery_id:
        raise WebhookVerificationError(f"no {DELIVERY_HEADER} header")
    if "." in delivery_id:
        raise WebhookVerificationError(f"malformed {DELIVERY_HEADER} header")
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            raise WebhookVerificationError(f"malformed {SIGNATURE_HEADER} header")
        if key == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise WebhookVerificationError("malformed signature timestamp") from None
        elif key == "v2":
            candidates.append(value)
    if timestamp is None or not candidates:
        raise WebhookVerificationError(f"{SIGNATURE_HEADER} needs t= and v2=")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise WebhookVerificationError(
            f"signature timestamp outside the tolerance of {tolerance_s:g} s"
        )
    secret_key = secret.encode() if isinstance(secret, str) else secret
    expected = _digest(secret_key, timestamp, delivery_id, body)
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise WebhookVerificationError("signature does not match the delivery id and body")
    return VerifiedDelivery(timestamp, delivery_id)
