"""What langgraph.json's `checkpointer.ttl` and the settings say about thread expiry (P6).

Meanings as on the LangGraph Agent Server: `default_ttl` (minutes) is the TTL of a thread
created without one; `strategy` what happens once it has passed (`delete` the thread, or
`keep_latest`: prune its checkpoints to the newest); `sweep_interval_minutes` (default 5)
and `sweep_limit` (default 1000) pace the sweep. The project's values win over the settings
(`THREADRUN_THREAD_SWEEP_INTERVAL_MINUTES`, `THREADRUN_THREAD_SWEEP_LIMIT`), which are the
defaults when the project says nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.project import ThreadTTLSection, load_project
from shared.runs.model import ThreadTTL
from shared.settings import Settings
from shared.vocab import PruneStrategy


@dataclass(frozen=True, slots=True)
class SweepPolicy:
    """How the sweep runs."""

    interval_s: float
    limit: int
    lock_timeout_s: float
    audit_retention_days: float


def default_ttl_of(section: ThreadTTLSection | None) -> ThreadTTL | None:
    """The TTL of a thread created without one; None: such threads never expire."""
    if section is None or section.default_ttl is None:
        return None
    return ThreadTTL(PruneStrategy(section.strategy), float(section.default_ttl))


def sweep_policy_of(section: ThreadTTLSection | None, settings: Settings) -> SweepPolicy:
    """The sweep's pace: the project's `checkpointer.ttl`, else the settings."""
    minutes = settings.thread_sweep_interval_minutes
    limit = settings.thread_sweep_limit
    if section is not None:
        minutes = section.sweep_interval_minutes or minutes
        limit = section.sweep_limit or limit
    return SweepPolicy(
        interval_s=float(minutes) * 60.0,
        limit=limit,
        lock_timeout_s=settings.thread_sweep_lock_timeout_s,
        audit_retention_days=settings.audit_retention_days,
    )


def default_ttl(settings: Settings) -> ThreadTTL | None:
    """`default_ttl_of` the project file of `settings`."""
    return default_ttl_of(load_project(settings.config).thread_ttl)


def sweep_policy(settings: Settings) -> SweepPolicy:
    """`sweep_policy_of` the project file of `settings`."""
    return sweep_policy_of(load_project(settings.config).thread_ttl, settings)
