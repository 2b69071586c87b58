"""The public id a run's stream events are written with (A4, shared/runs/thread_ids.py).

A client-chosen thread's events name its storage id wherever LangGraph puts the run's
configurable (the metadata of every token chunk, checkpoint configs); the web used to
parse each such event to write the public id back (~4 us an event, docs/performance.md).
The worker writes the public id there itself (`StreamTranslator.ids`, 0.7 us an event), so
the web relays those events byte for byte.

The public id comes with the run when its row was joined with its thread
(`Run.thread_public_id`); else it is looked up beside the attempt's start (one indexed
query, ~0.08 ms), only for a thread whose storage id can be a client-chosen one (a version
5 UUID: a server-made thread has one id for both, and costs nothing) and only for a run
whose stream modes name the thread (a `values` stream has nothing to write it into). The
lookup never delays the run: events published before it answers keep the storage id and
are translated by the web as an older worker's are, and so is every event when it fails.
"""

from __future__ import annotations

import asyncio
import logging

from shared.runs.model import Run
from shared.runs.thread_ids import PublicIds, storage_shaped
from workers.runtime import WorkerRuntime
from workers.stream_modes import StreamTranslator

log = logging.getLogger(__name__)


def write_public_ids(rt: WorkerRuntime, run: Run, translator: StreamTranslator) -> None:
    """Have `translator` write the run's thread's public id into its events, now or once
    it is known (a lookup started here, on the loop)."""
    tid = run.thread_id
    if run.thread_public_id is not None:
        translator.ids = PublicIds.at_source(tid, run.thread_public_id)
        return
    if run.user_id is None or not storage_shaped(tid) or not translator.names_threads:
        return  # a server-made id, or no event of the run would name the thread
    if run.kwargs.get("protocol_events"):
        return  # the thread streaming protocol's events name no thread (protocol_events.py)
    owner = run.user_id

    async def lookup() -> None:
        try:
            found = await asyncio.to_thread(rt.store.public_ids, owner, [tid])
        except Exception:  # the web translates instead, as for an older worker's events
            log.debug("public id lookup failed", exc_info=True, extra={"run_id": run.run_id})
            return
        translator.ids = PublicIds.at_source(tid, found.get(tid))

    translator.lookup = asyncio.ensure_future(lookup())
