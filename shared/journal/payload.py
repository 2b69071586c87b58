"""What an event store keeps of a payload (SPEC J4): JSON text, size-capped, NUL-free; no IO."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared import serde

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024

_NUL = "u0000"
_FFFD = "ufffd"


def drop_nul(text: str) -> str:
    """Replace JSON `\\u0000` escapes (Postgres jsonb refuses them) with U+FFFD.

    An escape is `u0000` after an odd run of backslashes (an even run is escaped
    backslashes followed by the text "u0000"). A linear scan, not `(\\+)u0000`: that
    regex rescans a run of backslashes from each of its positions, and the text holds
    user messages (120 KB of backslashes took seconds).
    """
    if _NUL not in text:
        return text
    out: list[str] = []
    copied = scanned = 0
    while (at := text.find(_NUL, scanned)) >= 0:
        before = text[scanned:at]  # a run of backslashes never reaches back past `scanned`
        if (len(before) - len(before.rstrip("\\"))) % 2 == 1:
            out.append(text[copied:at])
            out.append(_FFFD)
            copied = at + len(_NUL)
        scanned = at + len(_NUL)
    out.append(text[copied:])
    return "".join(out)


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
