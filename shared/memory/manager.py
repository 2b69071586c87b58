"""`MemoryManager` (M1): read context, admit updates, process due batches, list/delete facts.

Middlewares, the memory task and the API all go through it; only the backend speaks
SQL and only the queue speaks Redis.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage

from shared.memory.base import (
    AdmitOutcome,
    Fact,
    FailurePolicy,
    MemoryBackend,
    MemoryReadFailed,
    MemoryUpdate,
    ReadPolicy,
    detect_signals,
    keep_for_memory,
    merge_updates,
    render_memory,
)
from shared.memory.extraction import extract_facts
from shared.memory.queue import MemoryQueue

log = logging.getLogger(__name__)


class MemoryManager:
    """The one entry point to long-term memory."""

    def __init__(
        self,
        backend: MemoryBackend,
        queue: MemoryQueue,
        *,
        read_policy: ReadPolicy | None = None,
        max_facts: int = 20,
        max_messages: int = 40,
        known_facts: int = 50,
    ) -> None:
        self.backend = backend
        self.queue = queue
        # M3: the backend's failure_policy.read decides, unless the caller overrides it.
        policy = getattr(backend, "failure_policy", None) or FailurePolicy()
        self.read_policy: ReadPolicy = read_policy or policy.read
        self.max_facts = max_facts
        self.max_messages = max_messages
        self.known_facts = known_facts

    # --- read (M2, M3) -------------------------------------------------------------------
    def context(self, agent_name: str, user_id: str) -> str | None:
        """The memory block for (agent_name, user_id): "" if none, None on a fail-open error."""
        try:
            facts = self.backend.list_facts(agent_name, user_id, self.max_facts)
        except Exception as exc:  # M3 decides below
            if self.read_policy == "fail_closed":
                raise MemoryReadFailed(f"memory read failed: {exc!r}") from exc
            log.warning("memory read failed, continuing without memory (fail_open): %r", exc)
            return None
        return render_memory(facts)

    # --- write (M4, M5) ------------------------------------------------------------------
    def add(
        self,
        thread_id: str,
        messages: Sequence[BaseMessage],
        agent_name: str,
        user_id: str,
        trace_id: str | None = None,
        *,
        urgent: bool = False,
    ) -> AdmitOutcome:
        """Keep user inputs and final replies, flag signals, admit into the memory queue."""
        kept = keep_for_memory(messages, self.max_messages)
        if not any(m["role"] == "user" for m in kept):
            return AdmitOutcome.EMPTY
        update = MemoryUpdate(
            agent_name=agent_name,
            user_id=user_id,
            thread_id=thread_id,
            messages=kept,
            trace_id=trace_id,
            signals=detect_signals(kept),
            urgent=urgent,
        )
        outcome = self.queue.admit(update)
        log.info(
            "memory update %s",
            outcome.value,
            extra={"thread_id": thread_id, "user_id": user_id, "signals": update.signals},
        )
        return outcome

    # --- extraction (the memory worker) --------------------------------------------------
    def process(self, token: str, model: BaseChatModel) -> int:
        """Extract and store one claimed batch, then ack it; returns facts stored.

        An exception leaves the batch leased: the drain loop re-sends it when the
        lease runs out (at most `max_attempts` times).
        """
        updates = self.queue.load(token)
        if not updates:
            return 0  # acked by an earlier attempt
        update = merge_updates(updates, self.max_messages)
        known = self.backend.list_facts(update.agent_name, update.user_id, self.known_facts)
        facts = extract_facts(model, update, known)
        stored = self.backend.upsert_facts(
            update.agent_name,
            update.user_id,
            facts,
            source_thread_id=update.thread_id,
            trace_id=update.trace_id,
        )
        self.queue.ack(token)
        log.info(
            "memory batch %s: %d updates merged, %d facts stored",
            token,
            update.merged,
            stored,
            extra={"thread_id": update.thread_id, "user_id": update.user_id},
        )
        return stored

    # --- API (M6) ------------------------------------------------------------------------
    def list_facts(
        self, user_id: str, agent_name: str | None = None, limit: int = 100
    ) -> list[Fact]:
        """A user's facts, newest first."""
        return self.backend.list_facts(agent_name, user_id, limit)

    def delete_fact(self, user_id: str, fact_id: str) -> None:
        """Delete one of the user's facts (404 for anyone else's)."""
        self.backend.delete_fact(user_id, fact_id)
