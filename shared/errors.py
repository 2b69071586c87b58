"""The error hierarchy: one root, grouped by kind. The API maps these to HTTP in one place.

Kinds: `ValidationFailed` (a request, 4xx), `NotFound` (404), `PermissionDenied` (403),
`Conflict` (409), `LimitExceeded` (a per-user limit, 429 or 422), `StoreError` (a store could
not finish), `UpstreamFailed` (a model a request depends on, 502) and `ConfigError` (the
process cannot run as configured). Errors of other layers subclass the root or a kind where
they are defined (`shared.agent.graphs.GraphNotFound`, …); `app.errors.REPLIES` gives each
its HTTP status and body. The HTTP client's errors (`threadrun.errors.ThreadrunClientError`, which the CLI's
`OpsError` joins) are a root of their own: they describe the server's answer as a client
program sees it (`code` is None when the answer had no JSON body), not our errors.
"""

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
    """No assistant (or graph) with this id for this user (another user's looks the same)."""


class CheckpointNotFound(NotFound):
    """No checkpoint with this id in the caller's thread."""


class PermissionDenied(ThreadrunError):
    """The caller may see this resource but not change it (403)."""

    code = "forbidden"


class AssistantReadOnly(PermissionDenied):
    """A system assistant: every user reads it, no user changes or deletes it."""


class Conflict(ThreadrunError):
    """The request conflicts with the current state (409)."""

    code = "conflict"


class LimitExceeded(ThreadrunError):
    """A request over one of the per-user limits (shared/runs/limits.py for run admission,
    app/limits.py for the rest): 429 with Retry-After (rates, counts) or 422 (sizes), naming
    the limit (its settings field) and the field."""

    code = "limit_exceeded"

    def __init__(
        self,
        limit: str,
        message: str,
        *,
        status: int = 429,
        retry_after: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.limit = limit
        self.status = status
        self.retry_after = retry_after
        self.field = field


class ThreadBusy(Conflict):
    """`multitask_strategy=reject` on a thread that has an inflight run (R3)."""

    code = "thread_busy"


class ThreadExists(Conflict):
    """`if_exists=raise` on an existing thread."""

    code = "thread_exists"


class AssistantExists(Conflict):
    """`if_exists=raise` on an existing assistant id (another user's conflicts alike)."""

    code = "assistant_exists"


class StoreError(ThreadrunError):
    """A store could not complete an operation."""

    code = "store_error"


class LeaseLost(StoreError):
    """This worker no longer owns the run (a higher epoch exists or the lease expired)."""

    code = "lease_lost"


class StreamTailLost(StoreError):
    """The run's stream lacks events its publisher was answered for (a Redis failover
    promoted a replica that had not received them); the publisher repairs the tail (B5)."""

    code = "stream_tail_lost"

    def __init__(self, run_id: str, done: int) -> None:
        super().__init__(f"run {run_id}: the stream lost the events after #{done}")
        self.done = done


class EventsUnpublished(StoreError):
    """A run attempt's events could not be published to its stream, so its checkpoint
    writes stop (B5: the next attempt re-runs the step rather than leaving a hole)."""

    code = "events_unpublished"


class UpstreamFailed(ThreadrunError):
    """A model (or other upstream service) a request depends on failed (502)."""

    code = "upstream_failed"


class ConfigError(ThreadrunError):
    """The process cannot run as configured (graphs, checkpoint mode, services).

    Raised at startup; if one escapes into a request it answers like any unexpected error
    (500, no detail), since the fault is the server's, not the client's.
    """


class StreamCursorInvalid(ValidationFailed):
    """A Last-Event-ID that is malformed or beyond the stream's last id (B4)."""

    code = "invalid_last_event_id"

    def __init__(self, message: str) -> None:
        super().__init__(message, field="Last-Event-ID", status=400)
