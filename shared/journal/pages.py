"""Paging over audit events (SPEC J4): directions, page sizes and thread cursors; no IO.

A run's events are ordered by seq; a thread's by (runs.seq, seq), i.e. run admission
order then seq, with the cursor `"<run_seq>:<seq>"`. Both take an exclusive `after`
and/or `before` bound, read forward (ascending, the default) or backward (the `limit`
events just before `before`), and always return ascending pages.
"""

from __future__ import annotations

from typing import Literal

Direction = Literal["forward", "backward"]
ThreadCursor = tuple[int, int]

MAX_SEQ = (1 << 63) - 1
DEFAULT_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE_MAX = 500


def format_thread_cursor(cursor: ThreadCursor) -> str:
    """`"<run_seq>:<seq>"`."""
    return f"{cursor[0]}:{cursor[1]}"


def parse_thread_cursor(text: str) -> ThreadCursor:
    """The pair of a `"<run_seq>:<seq>"` cursor; ValueError when malformed."""
    run_seq, sep, seq = text.partition(":")
    if not sep or not run_seq.isdigit() or not seq.isdigit():
        raise ValueError(f"malformed thread event cursor {text[:64]!r}")
    return int(run_seq), int(seq)


def page_limit(limit: int | None, default: int, maximum: int) -> int:
    """The page size to use: `default` when None, at most `maximum`; ValueError below 1."""
    n = default if limit is None else limit
    if n < 1:
        raise ValueError(f"limit must be at least 1, got {n}")
    return min(n, maximum)


def page_direction(direction: Direction | None, after: object, before: object) -> Direction:
    """The direction to read: backward when only `before` is given, else forward."""
    if direction is None:
        return "backward" if before is not None and after is None else "forward"
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")
    return direction
