"""What the protocol's walk reads besides the run streams (shared/bridge/protocol.py's
`WalkSource`), from the web's stores, for one caller."""

from __future__ import annotations

from shared.bridge.protocol import RunFacts
from shared.errors import ThreadNotFound
from shared.runs.model import ThreadStatus
from shared.runs.store import RunStore


class StoreSource:
    """Runs and thread status from the runs store, as `owner` sees them."""

    def __init__(self, store: RunStore, owner: str) -> None:
        self._store = store
        self._owner = owner

    def run_facts(self, run_id: str) -> RunFacts | None:
        """One run of the walk (None: gone)."""
        run = self._store.get_run_by_id(run_id)
        if run is None:
            return None
        return RunFacts(run.run_id, run.seq, run.graph_id, bool(run.kwargs.get("protocol_events")))

    def run_at(self, thread_id: str, seq: int) -> str | None:
        """The thread's run admitted `seq`-th, if it is still there."""
        refs = self._store.runs_after(thread_id, seq - 1, 1) if seq > 0 else None
        return refs[0].run_id if refs and refs[0].seq == seq else None

    def on_hold(self, thread_id: str) -> bool:
        """Whether the thread waits on an interrupt."""
        try:
            return self._store.get_thread(thread_id, self._owner).status is ThreadStatus.INTERRUPTED
        except ThreadNotFound:
            return False
