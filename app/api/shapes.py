"""The SDK's JSON shapes of our records (`Run`, `Thread`, `Assistant`), shared by HTTP views
and WebSocket."""

from __future__ import annotations

from typing import Any

from shared.assistants.model import Assistant, AssistantVersion
from shared.runs.model import Thread
from shared.runs.shapes import run_json
from shared.state.accessor import ThreadHead

__all__ = ["assistant_json", "assistant_version_json", "run_json", "thread_json"]


def thread_json(thread: Thread, head: ThreadHead | None = None) -> dict[str, Any]:
    """The SDK's Thread shape: `values` and `interrupts` of the head checkpoint (`values`
    is null for a thread that has none, as on the official server)."""
    return {
        "thread_id": thread.client_id,
        "created_at": thread.created_at,
        "updated_at": thread.updated_at,
        "metadata": thread.metadata,
        "status": thread.status,
        "values": head.values_fragment if head is not None else None,
        "interrupts": head.interrupts if head is not None else {},
    }


def ttl_json(thread: Thread) -> dict[str, Any] | None:
    """A thread's `ttl` as the official server shows it with `include=ttl`: strategy,
    minutes and when it expires (None: the thread never expires)."""
    if thread.ttl is None:
        return None
    return {
        "strategy": thread.ttl.strategy.value,
        "ttl_minutes": thread.ttl.minutes,
        "expires_at": thread.expires_at,
    }


def assistant_json(assistant: Assistant) -> dict[str, Any]:
    """The SDK's Assistant shape (the owner is never shown)."""
    return {
        "assistant_id": assistant.assistant_id,
        "graph_id": assistant.graph_id,
        "config": assistant.config,
        "context": assistant.context,
        "created_at": assistant.created_at,
        "updated_at": assistant.updated_at,
        "metadata": assistant.metadata,
        "version": assistant.version,
        "name": assistant.name,
        "description": assistant.description,
    }


def assistant_version_json(version: AssistantVersion) -> dict[str, Any]:
    """The SDK's AssistantVersion shape."""
    return {
        "assistant_id": version.assistant_id,
        "graph_id": version.graph_id,
        "config": version.config,
        "context": version.context,
        "created_at": version.created_at,
        "metadata": version.metadata,
        "version": version.version,
        "name": version.name,
        "description": version.description,
    }
