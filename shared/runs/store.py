"""SQL for threads and runs. Only `RunStore` and the modules it is made of speak SQL about them
(STYLE 4).

`RunStore` is the one object callers hold (`from shared.runs.store import RunStore`); it is
composed of one class per concept, all sharing its pool (shared/runs/store_base.py):

- `ThreadStore` (threads_store.py): threads, their public ids, search;
- `AdmissionStore` (admission_store.py): admission (R2, R3) and explicit cancel (R5);
- `RunReads` (run_reads.py): reads of runs, thread followers, the delete of an ended run;
- `ClaimStore` (claims.py): claim, rollback point and fenced finish (L1-L3);
- `ReaperQueries` (reaper_queries.py): lost dispatches, lapsed owners (R4, L5);
- `TemporaryThreadStore` (temporary_store.py): threads of runs without one (A1).

Their statements are named in shared/runs/queries.sql (loaded by shared/runs/queries.py);
a thread's queue (inflight runs, settle) is shared/runs/thread_queue.py. The result types
of each part are re-exported here, so their import paths do not follow the split.
"""

from __future__ import annotations

from shared.db import DictPool
from shared.runs.admission_store import Admission, AdmissionStore, AdmitItem
from shared.runs.claims import Claim, ClaimOutcome, ClaimStore, Finish
from shared.runs.model import ThreadTTL
from shared.runs.reaper_queries import Expired, ReaperQueries, RunningRun
from shared.runs.run_reads import RunReads
from shared.runs.temporary_store import TemporaryThreadStore
from shared.runs.threads_store import Doomed, ExpiryOutcome, ThreadStore

__all__ = [
    "Admission",
    "AdmitItem",
    "Claim",
    "ClaimOutcome",
    "Doomed",
    "Expired",
    "ExpiryOutcome",
    "Finish",
    "RunStore",
    "RunningRun",
]


class RunStore(
    ThreadStore, AdmissionStore, RunReads, ClaimStore, ReaperQueries, TemporaryThreadStore
):
    """Threads and runs in Postgres."""

    def __init__(
        self,
        pool: DictPool,
        *,
        default_ttl: ThreadTTL | None = None,
        max_threads_per_user: int | None = None,
    ) -> None:
        super().__init__(pool)
        self.default_ttl = default_ttl
        self.max_threads_per_user = max_threads_per_user
