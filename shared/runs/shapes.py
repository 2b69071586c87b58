"""The SDK's JSON shape of a run, shared by the API (`runs.get`) and the webhook body that
workers send when a run ends (workers cannot import `app`)."""

from __future__ import annotations

from typing import Any

from shared.runs.model import Run


def run_json(run: Run) -> dict[str, Any]:
    """The SDK's Run shape, plus our lifecycle fields."""
    return {
        "run_id": run.run_id,
        "thread_id": run.thread_public_id or run.thread_id,
        "assistant_id": run.assistant_id,
        "graph_id": run.graph_id,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "status": run.status,
        "metadata": run.metadata,
        "kwargs": {
            "input": run.input,
            "command": run.command,
            "config": run.config,
            "context": run.context,
            "webhook": run.webhook,  # where the official server shows it
            **run.kwargs,
        },
        "multitask_strategy": run.multitask_strategy,
        "on_disconnect": run.on_disconnect,
        "on_completion": run.on_completion,  # a run without a thread: its thread's fate
        "attempt": run.attempt,
        "owner_epoch": run.owner_epoch,
        "due_at": run.due_at,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "error": run.error,
        "usage": run.usage,
    }
