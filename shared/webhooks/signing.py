"""Webhook signatures: HMAC-SHA256 over the timestamp, the delivery id and the body.

`X-Threadrun-Signature: t=<unix ts>,v1=<hex>,v2=<hex>`:
- `v2` is the HMAC of `<ts>.<delivery id>.<body bytes>`: the `X-Threadrun-Delivery` value
  receivers dedupe on is signed, so a delivery replayed within the tolerance under a new
  delivery id does not verify (the id is a run id, which never contains a dot).
- `v1` is the HMAC of `<ts>.<body bytes>` (Stripe's scheme), still sent so that receivers
  verifying with an older client keep working; it does not cover the delivery id, and
  `threadrun.webhooks.verify` no longer accepts it alone.

Signing the timestamp lets a receiver refuse an old delivery replayed by someone who
captured it (`tolerance_s`), and the exact body bytes are signed, so the receiver must
verify before parsing. The receiver's side is `threadrun.webhooks.verify` in the client
package (clients/python/threadrun/webhooks.py), which has no dependency on this module; a
test keeps the two in agreement.
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-Threadrun-Signature"
DELIVERY_HEADER = "X-Threadrun-Delivery"
ATTEMPT_HEADER = "X-Threadrun-Attempt"
EVENT_HEADER = "X-Threadrun-Event"
LEGACY_SCHEME = "v1"
SCHEME = "v2"


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    """The legacy `v1` hex HMAC-SHA256 of `<timestamp>.<body>` under `secret`."""
    return hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def delivery_signature(secret: bytes, timestamp: int, delivery_id: str, body: bytes) -> str:
    """The `v2` hex HMAC-SHA256 of `<timestamp>.<delivery_id>.<body>` under `secret`."""
    if "." in delivery_id:
        raise ValueError("a delivery id must not contain a dot")
    message = f"{timestamp}.{delivery_id}.".encode() + body
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def signature_header(
    secret: bytes, body: bytes, *, delivery_id: str, timestamp: int | None = None
) -> str:
    """The X-Threadrun-Signature value: `t=<unix ts>,v1=<hex>,v2=<hex>`."""
    ts = int(time.time()) if timestamp is None else timestamp
    v1 = signature(secret, ts, body)
    v2 = delivery_signature(secret, ts, delivery_id, body)
    return f"t={ts},{LEGACY_SCHEME}={v1},{SCHEME}={v2}"
