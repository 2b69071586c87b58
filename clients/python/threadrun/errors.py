"""The exceptions of the client, and `ConnectionDropped`, the internal "resume me" signal.

`ThreadrunClientError` and its subclasses are what callers catch; `ConnectionDropped` never
reaches them: the transports raise it, `RunStream` turns it into a reconnect, and
`ThreadrunClient` turns it into a `ThreadrunClientError` on plain requests.
"""

from __future__ import annotations

from collections.abc import Sequence

from threadrun.results import GapInfo

__all__ = [
    "ConnectionDropped",
    "ServerUnreachableError",
    "StreamDisconnectedError",
    "StreamReplayGapError",
    "ThreadrunAPIError",
    "ThreadrunClientError",
]


class ThreadrunClientError(Exception):
    """Root of the errors this client raises."""


class ThreadrunAPIError(ThreadrunClientError):
    """The server refused a request (4xx, or a WebSocket `error` frame)."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ServerUnreachableError(ThreadrunClientError):
    """No answer from the server at all (refused, unknown host, timed out)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"cannot reach the threadrun server at {url} ({reason}). Is it running? `make run`"
            " starts one and prints its URL; --url or THREADRUN_URL point elsewhere."
        )
        self.url = url


class StreamDisconnectedError(ThreadrunClientError):
    """The stream could not be resumed within the retry budget. The run keeps going."""

    def __init__(self, message: str, *, run_id: str | None, last_event_id: str | None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.last_event_id = last_event_id


class StreamReplayGapError(ThreadrunClientError):
    """Too many consecutive replay gaps: the live view is lost, but the run keeps going (B9)."""

    def __init__(self, run_id: str | None, gaps: Sequence[GapInfo]) -> None:
        self.run_id = run_id
        self.gaps = tuple(gaps)
        last = self.gaps[-1] if self.gaps else None
        super().__init__(
            f"run {run_id}: the live stream had {len(self.gaps)} replay gaps in a row "
            f"(events after {last.requested_event_id if last else None} were trimmed before "
            "they could be read); the live view is incomplete but the run itself keeps going: "
            "reload the thread state (GET /threads/{id}/state) or join the run again later"
        )


class ConnectionDropped(Exception):
    """A transport lost its connection (or never got one); the stream can be resumed."""
