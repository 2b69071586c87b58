"""The WebSocket protocol's frames (docs/websocket.md): what a client sends (validated
here), and what a run's frames become on the wire (`encode`). The session that reads and
writes them is app/streaming/ws.py."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr

from app.streaming.frames import EndFrame, EventFrame, Frame, GapFrame, HeartbeatFrame
from shared import serde
from shared.errors import ThreadrunError, ValidationFailed
from shared.runs.model import CancelAction
from shared.vocab import STREAM_MODES

MAX_REQUEST_ID = 256

# --- client frames -----------------------------------------------------------------------------------

RequestId = StrictStr | StrictInt | None


class ClientFrame(BaseModel):
    """Fields every client frame may carry besides its own."""

    model_config = ConfigDict(extra="forbid")

    type: str
    request_id: RequestId = None
    thread_id: str | None = None


class JoinFrame(ClientFrame):
    """`run.join`: follow a run from after `last_event_id` (B4)."""

    run_id: str
    last_event_id: StrictStr | StrictInt | None = None
    stream_mode: list[str] | str | None = None
    cancel_on_disconnect: bool = False


class CancelFrame(ClientFrame):
    """`run.cancel` (R5): interrupt keeps the run's progress, rollback undoes it."""

    run_id: str
    action: CancelAction = CancelAction.INTERRUPT


class FrameError(ThreadrunError):
    """A protocol-level refusal that has no place in shared.errors."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.field = field


def request_id_of(data: dict[str, Any]) -> Any:
    rid = data.get("request_id")
    ok = rid is None or (isinstance(rid, int) and not isinstance(rid, bool))
    ok = ok or (isinstance(rid, str) and len(rid) <= MAX_REQUEST_ID)
    if not ok:
        raise ValidationFailed(
            f"request_id must be a string of at most {MAX_REQUEST_ID} characters or an integer",
            field="request_id",
        )
    return rid


def checked_modes(value: list[str] | str | None) -> list[str] | None:
    if value is None:
        return None
    modes = [value] if isinstance(value, str) else value
    for mode in modes:
        if mode not in STREAM_MODES:
            raise ValidationFailed(
                f"stream_mode: unsupported stream mode {mode!r}; supported: "
                + ", ".join(sorted(STREAM_MODES)),
                field="stream_mode",
            )
    return modes or None


def dump(obj: Any) -> str:
    return serde.dumps_str(obj)


def encode(frame: Frame, run_id: str) -> str:
    """One WebSocket text frame of the run `run_id`."""
    if isinstance(frame, EventFrame):
        item = frame.event
        # `item.data` is JSON the publisher encoded: splice it in instead of parse + re-encode.
        return (
            f'{{"type":"event","run_id":{dump(run_id)},"id":{dump(item.id)},'
            f'"event":{dump(item.event)},"data":{item.data or "null"}}}'
        )
    if isinstance(frame, EndFrame):
        return dump({"type": "end", "run_id": run_id, "id": frame.event.id, "status": frame.status})
    if isinstance(frame, GapFrame):
        return dump({"type": "gap", **frame.gap.payload()})
    if isinstance(frame, HeartbeatFrame):
        return dump({"type": "heartbeat", "run_id": run_id})
    raise TypeError(f"not a frame: {frame!r}")
