"""The error hierarchy: one root, grouped by layer. The API maps these to HTTP in one place."""

from __future__ import annotations


class ThreadrunError(Exception):
    """Root of every error this project raises on purpose."""

    code = "internal_error"


class ValidationFailed(ThreadrunError):
    """A request or frame failed validation (4xx, names the field)."""

    code = "invalid_request"

    def __init__(self, message: str, *, field: str | None = None, status: int = 422) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


class NotFound(ThreadrunError):
    """A thread, run or assistant that does not exist for this user."""

    code = "not_found"


class ThreadNotFound(NotFound):
    """The thread is missing or belongs to another user (the two look the same)."""


class RunNotFound(NotFound):
    """The run is missing or belongs to another user's thread."""


class ArtifactNotFound(NotFound):
    """No such artifact in the thread's outputs (or the thread is not the caller's)."""


class AssistantNotFound(NotFound):
    """No graph is registered under this assistant id."""


class Conflict(ThreadrunError):
    """The request conflicts with the current state (409)."""

    code = "conflict"


class ThreadBusy(Conflict):
    """`multitask_strategy=reject` on a thread that has an inflight run (R3)."""

    code = "thread_busy"


class ThreadExists(Conflict):
    """`if_exists=raise` on an existing thread."""

    code = "thread_exists"


class StoreError(ThreadrunError):
    """A store could not complete an operation."""

    code = "store_error"


class LeaseLost(StoreError):
    """This worker no longer owns the run (a higher epoch exists or the lease expired)."""

    code = "lease_lost"


class StreamCursorInvalid(ValidationFailed):
    """A Last-Event-ID that is malformed or beyond the stream's last id (B4)."""

    code = "invalid_last_event_id"

    def __init__(self, message: str) -> None:
        super().__init__(message, field="Last-Event-ID", status=400)
