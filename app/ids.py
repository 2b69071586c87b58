"""Ids in a request's path or body: a UUID in its canonical form, or the 404 of a missing
resource (an id that is not a UUID cannot exist, so it answers exactly like a missing one).

Pure parsing; the translation of a client's thread id to its storage id (A4) is one floor
up, in `app/public_ids.py`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from shared.errors import RunNotFound, ThreadNotFound


def canonical_id(value: str, missing: Callable[[str], Exception]) -> str:
    """The canonical form of a UUID in a path; one that is not a UUID cannot exist, so it
    raises `missing(message)` exactly like a missing one (a 404)."""
    try:
        return str(uuid.UUID(value))
    except ValueError as exc:
        raise missing(f"{value[:64]} not found") from exc


def checked_run_id(run_id: str) -> str:
    """A run id that is not a UUID cannot exist: 404, exactly like a missing one."""
    return canonical_id(run_id, lambda m: RunNotFound(f"run {m}"))


def parsed_thread_id(thread_id: str) -> str:
    """The canonical form of a client's thread id; not a UUID: 404 like a missing thread."""
    return canonical_id(thread_id, lambda m: ThreadNotFound(f"thread {m}"))
