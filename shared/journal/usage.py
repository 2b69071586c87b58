"""Token usage (SPEC J2): counts per tag summed from `model.end` events; no IO."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from shared.journal.base import Category, RunEvent

Usage = dict[str, int]
UsageSummary = dict[str, Any]

DEFAULT_TAG = "lead_agent"
USAGE_KEYS = ("input_tokens", "output_tokens", "total_tokens")
MODEL_END = "model.end"
"""The event type whose payload carries a model call's `usage` and `tag`."""


def empty_usage() -> Usage:
    """Zero token counts."""
    return dict.fromkeys(USAGE_KEYS, 0)


def add_usage(into: Usage, other: Mapping[str, Any]) -> Usage:
    """Add the token counts of `other` to `into` (missing or bad counts count as 0)."""
    for key in USAGE_KEYS:
        value = other.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            into[key] += value
    return into


def usage_summary(by_tag: Mapping[str, Mapping[str, Any]]) -> UsageSummary:
    """`{"total": usage, "by_tag": {tag: usage}}` from per-tag counts."""
    total = empty_usage()
    tags: dict[str, Usage] = {}
    for tag in sorted(by_tag):
        tags[tag] = add_usage(empty_usage(), by_tag[tag])
        add_usage(total, tags[tag])
    return {"total": total, "by_tag": tags}


def summarize_usage(events: Iterable[RunEvent]) -> UsageSummary:
    """Sum the `model.end` usage of events by tag (J2)."""
    by_tag: dict[str, Usage] = defaultdict(empty_usage)
    for ev in events:
        if ev.category == Category.MODEL and ev.type == MODEL_END:
            usage = ev.payload.get("usage")
            if isinstance(usage, Mapping):
                add_usage(by_tag[str(ev.payload.get("tag") or DEFAULT_TAG)], usage)
    return usage_summary(by_tag)
