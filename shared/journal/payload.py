"""What an event store keeps of a payload (SPEC J4): JSON text, size-capped, NUL-free; no IO."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from shared import serde

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024

_NUL_ESCAPE = re.compile(r"(\\+)u0000")


def drop_nul(text: str) -> str:
    """Replace JSON `\\u0000` escapes (Postgres jsonb refuses them) with U+FFFD."""
    if "u0000" not in text:
        return text

    def repl(m: re.Match[str]) -> str:
        slashes = m.group(1)
        if len(slashes) % 2 == 0:  # an escaped backslash followed by the text "u0000"
            return m.group(0)
        return slashes[:-1] + "\\ufffd"

    return _NUL_ESCAPE.sub(repl, text)


def payload_json(payload: Mapping[str, Any]) -> str:
    """The payload as JSON text jsonb accepts, whole (receipts, lifecycle events)."""
    return drop_nul(serde.dumps_str(payload))


def encode_payload(payload: Mapping[str, Any], max_bytes: int) -> str:
    """The payload as JSON text; past `max_bytes` it becomes a truncation marker.

    The marker is `{"_truncated": true, "original_bytes": N, "preview": …}`, where the
    preview is the start of the original JSON text (half the budget, cut on a character
    boundary), so the marker itself stays within `max_bytes` for any budget over ~100.
    """
    raw = serde.dumps(payload)
    if len(raw) > max_bytes:
        preview = raw[: max(0, max_bytes // 2)].decode("utf-8", errors="ignore")
        raw = serde.dumps({"_truncated": True, "original_bytes": len(raw), "preview": preview})
    return drop_nul(raw.decode())


def truncate_payload(payload: Mapping[str, Any], max_bytes: int) -> dict[str, Any]:
    """What the store keeps of `payload` (the marker when it is too large)."""
    value = serde.loads(encode_payload(payload, max_bytes))
    assert isinstance(value, dict)
    return value
