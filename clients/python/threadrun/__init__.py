"""threadrun: the Python client and command line of the threadrun runtime.

    from threadrun import ThreadrunClient

    with ThreadrunClient("http://127.0.0.1:8000", api_key="…") as client:
        tid = client.create_thread()["thread_id"]
        for item in client.stream_run(tid, "lead_agent", input={"messages": [...]}):
            ...

`threadrun.client` has the client and the stream driver (and re-exports the names of
`threadrun.results`, `threadrun.errors`, `threadrun.recovery` and `threadrun.transports`,
where the recovery machinery of SPEC B4/B5/B9 lives); the `threadrun` command is
`threadrun.cli`; `threadrun.webhooks.verify` checks a webhook delivery's signature. This
package imports nothing of the server.
"""

from threadrun import webhooks
from threadrun.client import (
    GapInfo,
    Reconnecting,
    RecoveryPolicy,
    RunEnded,
    RunStream,
    StateReloaded,
    StreamDisconnectedError,
    StreamEvent,
    StreamReplayGapError,
    ThreadrunAPIError,
    ThreadrunClient,
    ThreadrunClientError,
)

__all__ = [
    "GapInfo",
    "Reconnecting",
    "RecoveryPolicy",
    "RunEnded",
    "RunStream",
    "StateReloaded",
    "StreamDisconnectedError",
    "StreamEvent",
    "StreamReplayGapError",
    "ThreadrunAPIError",
    "ThreadrunClient",
    "ThreadrunClientError",
    "webhooks",
]
