"""Config keys a client may not set: LangGraph's own.

LangGraph passes its runtime through `config["configurable"]`: `__pregel_checkpointer`,
`__pregel_send`, `__pregel_read`, ... (every `CONFIG_KEY_*` of `langgraph._internal._constants`
whose value starts with `__`), and the checkpoint coordinates `checkpoint_id`,
`checkpoint_ns`, `checkpoint_map`. A client's value there switched checkpointing off or
crashed the run, and a `checkpoint_id` there bypassed the run's own (checked) one. So any
key starting with `__` and those three are refused (422). `thread_id` stays accepted: it is
what clients conventionally repeat, and the server's value replaces it (workers/executor.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RESERVED_PREFIX = "__"
RESERVED_KEYS = frozenset({"checkpoint_id", "checkpoint_ns", "checkpoint_map"})


def is_reserved(key: str) -> bool:
    """Whether `key` belongs to LangGraph's runtime, not to the client."""
    return key.startswith(RESERVED_PREFIX) or key in RESERVED_KEYS


def reserved_keys(configurable: Mapping[str, Any] | None) -> list[str]:
    """The reserved keys of a client's `configurable` (or context), in order."""
    return [k for k in (configurable or {}) if isinstance(k, str) and is_reserved(k)]


def check_no_reserved(configurable: Mapping[str, Any] | None) -> None:
    """Raise ValueError naming the first reserved key (a pydantic validator's 422)."""
    found = reserved_keys(configurable)
    if found:
        raise ValueError(
            f"{found[0]!r} is reserved for LangGraph's runtime and cannot be set by a client"
            " (keys starting with '__', checkpoint_id, checkpoint_ns, checkpoint_map;"
            " give a run's checkpoint as checkpoint_id or checkpoint)"
        )


def without_reserved(configurable: Mapping[str, Any] | None) -> dict[str, Any]:
    """`configurable` without the reserved keys (what was stored before they were refused)."""
    return {k: v for k, v in (configurable or {}).items() if not is_reserved(k)}
