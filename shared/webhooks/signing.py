"""Webhook signatures: HMAC-SHA256 over `<unix ts>.<body bytes>` (Stripe's scheme).

Signing the timestamp with the body lets a receiver refuse an old delivery replayed by
someone who captured it (`tolerance_s`), and the exact body bytes are signed, so the
receiver must verify before parsing. The receiver's side is
`threadrun.webhooks.verify` in the client package (clients/python/threadrun/webhooks.py),
which has no dependency on this module; a test keeps the two in agreement.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-Threadrun-Signature"
DELIVERY_HEADER = "X-Threadrun-Delivery"
ATTEMPT_HEADER = "X-Threadrun-Attempt"
EVENT_HEADER = "X-Threadrun-Event"
SCHEME = "v1"


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of `<timestamp>.<body>` under `secret`."""
    return hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature_header(secret: bytes, body: bytes, timestamp: int | None = None) -> str:
    """The X-Threadrun-Signature value: `t=<unix ts>,v1=<hex>`."""
    ts = int(time.time()) if timestamp is None else timestamp
    return f"t={ts},{SCHEME}={signature(secret, ts, body)}"
