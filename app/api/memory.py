"""Memory facts (M6) and manual compaction (C1): thin views over the managers."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response
from pydantic import BaseModel, ConfigDict, Field

from app import public_ids
from app.api.threads import owned_thread
from app.auth import principal
from app.http import answers, query
from app.responses import json_response
from app.services import current_services
from shared.agent.middleware.memory import urgent_flush_hook
from shared.agent.middleware.summarization import (
    NothingToCompact,
    SummaryContext,
    build_summarizer,
    compact_thread,
)
from shared.errors import Conflict, ValidationFailed
from shared.memory.services import memory_manager
from shared.runs.model import ThreadStatus

bp = Blueprint("memory", __name__)


class FactsQuery(BaseModel):
    """Query of GET /memory/facts."""

    model_config = ConfigDict(extra="forbid")
    agent_name: str | None = Field(default=None, min_length=1, max_length=200)
    limit: int = Field(default=100, ge=1)


@bp.get("/memory/facts")
@query(FactsQuery)
def list_facts(query: FactsQuery) -> Response:
    """The caller's memory facts, newest first."""
    settings = current_services().settings
    if query.limit > settings.memory_list_max:
        raise ValidationFailed(
            f"limit: at most {settings.memory_list_max}", field="limit", status=422
        )
    manager = memory_manager(settings)
    owner = principal().user_id
    facts = manager.list_facts(owner, query.agent_name, query.limit)
    sources = {f.source_thread_id for f in facts if f.source_thread_id}
    for storage, public in current_services().store.public_ids(owner, sources).items():
        public_ids.remember(storage, public)  # a source thread by its owner's id (A4)
    return json_response({"facts": [f.as_json() for f in facts]})


@bp.delete("/memory/facts/<fact_id>")
def delete_fact(fact_id: str) -> Response:
    """Delete one of the caller's facts (another user's fact id is a 404)."""
    memory_manager(current_services().settings).delete_fact(principal().user_id, fact_id)
    return json_response({"deleted": fact_id})


@bp.post("/threads/<thread_id>/compact")
@answers(502, "summary generation failed; the state is unchanged", json=True)
def compact(thread_id: str) -> Response:
    """Summarize the thread now: 409 nothing_to_compact, 502 summary_failed, or the result."""
    thread = owned_thread(thread_id)
    svc = current_services()
    graph_id = thread.metadata.get("graph_id")
    if not isinstance(graph_id, str) or graph_id not in svc.registry.ids():
        raise NothingToCompact("nothing to compact: the thread has no run yet")
    if thread.status is ThreadStatus.BUSY:
        raise Conflict("the thread has a run in progress; compact it when it is idle")
    settings = svc.settings
    user_id = principal().user_id
    hooks = []
    if settings.memory_enabled:
        hooks.append(urgent_flush_hook(lambda: memory_manager(settings)))
    summarizer = build_summarizer(settings, hooks=hooks)
    tid = thread.thread_id
    ctx = SummaryContext(tid, user_id, graph_id, [])
    result = compact_thread(svc.state, tid, graph_id, summarizer, ctx)  # SummaryFailed: 502
    body: dict[str, Any] = {"outcome": result.outcome.value, **result.record}
    return json_response(body)
