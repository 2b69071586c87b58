"""What `/wait` and `/join` answer for an ended run (A1), as one pure function."""

from __future__ import annotations

from typing import Any

from shared.runs.model import JSONObject, RunStatus

RUN_FAILED: JSONObject = {"error": "RunError", "message": "run failed"}
"""The `__error__` of a failed run that recorded no error of its own."""


def final_result(
    status: RunStatus, error: JSONObject | None, values: Any, interrupts: list[Any]
) -> Any:
    """The final values; `{"__error__": …}` for a failed run; the values with
    `__interrupt__` when the thread waits on an interrupt (as the official server)."""
    if status is RunStatus.ERROR:
        return {"__error__": error or RUN_FAILED}
    if interrupts and isinstance(values, dict):
        return {**values, "__interrupt__": interrupts}
    return values
