"""Verify a threadrun webhook delivery (the receiver's side).

    from threadrun import webhooks

    def handle(request):                       # any web framework
        body = request.get_data()              # the raw bytes, before any JSON parsing
        try:
            webhooks.verify(SECRET, request.headers, body, tolerance_s=300)
        except webhooks.WebhookVerificationError:
            return "", 400
        run = json.loads(body)                 # the run as runs.get returns it, + "values"
        if already_seen(request.headers["X-Threadrun-Delivery"]):
            return "", 200                     # a retry of a delivery you handled
        ...

The `X-Threadrun-Signature` header is `t=<unix ts>,v1=<hex>`, where the hex is the
HMAC-SHA256, keyed with the deployment's `THREADRUN_WEBHOOK_SECRET`, of the bytes
`<ts>.<body>`. Checking the timestamp against `tolerance_s` refuses a captured delivery
replayed later. This module needs nothing but the standard library.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

SIGNATURE_HEADER = "X-Threadrun-Signature"
DELIVERY_HEADER = "X-Threadrun-Delivery"
ATTEMPT_HEADER = "X-Threadrun-Attempt"
DEFAULT_TOLERANCE_S = 300.0

__all__ = [
    "ATTEMPT_HEADER",
    "DEFAULT_TOLERANCE_S",
    "DELIVERY_HEADER",
    "SIGNATURE_HEADER",
    "WebhookVerificationError",
    "sign",
    "verify",
]


class WebhookVerificationError(ValueError):
    """The delivery's signature is missing, malformed, wrong or too old."""


def sign(secret: str | bytes, body: bytes, timestamp: int | None = None) -> str:
    """An `X-Threadrun-Signature` value for `body` (for tests of your receiver)."""
    key = secret.encode() if isinstance(secret, str) else secret
    ts = int(time.time()) if timestamp is None else int(timestamp)
    digest = hmac.new(key, f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={digest}"


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
) -> int:
    """Check a delivery's signature; returns its signed timestamp.

    `headers`: the request's headers (any mapping; names are matched case-insensitively);
    `body`: the exact bytes received. Raises WebhookVerificationError when the header is
    missing or malformed, no `v1` signature matches (compared in constant time), or the
    timestamp is more than `tolerance_s` away from `now` (default: the current time).
    """
    header = _header(headers, SIGNATURE_HEADER)
    if not header:
        raise WebhookVerificationError(f"no {SIGNATURE_HEADER} header")
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
        elif key == "v1":
            candidates.append(value)
    if timestamp is None or not candidates:
        raise WebhookVerificationError(f"{SIGNATURE_HEADER} needs t= and v1=")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise WebhookVerificationError(
            f"signature timestamp outside the tolerance of {tolerance_s:g} s"
        )
    expected = sign(secret, body, timestamp).partition(",v1=")[2]
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise WebhookVerificationError("signature does not match the body")
    return timestamp
