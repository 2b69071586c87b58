"""`tools/list` and `tools/call` over the REST API's own paths: the caller's visible
assistants (`assistants.search` under the project's auth), each graph's input schema as
`GET /assistants/{id}/schemas` computes it, and a run admitted by `app/admission.py` (rate,
active-run slot, `threads.create_run`) and followed through the bridge's subscriber (exact
replay from its first event; a gap ends the follow and the status is read durably).

A call runs on a new temporary thread (deleted when the run ends, as `POST /runs/wait`), or
on the thread the client names in the request's `_meta.thread_id` (made when missing).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from app import authz, public_ids
from app.admission import admit_run
from app.auth import principal
from app.http import validate
from app.protocols.mcp import tools
from app.protocols.mcp.jsonrpc import INVALID_PARAMS, RpcError
from app.schemas import RunCreate, StatelessRunCreate
from app.services import Services, current_services
from shared import serde
from shared.assistants import graph_schemas
from shared.assistants.model import Assistant
from shared.assistants.store import AssistantFilter
from shared.bridge.base import BEFORE_FIRST, END_EVENT, Event, Gap
from shared.errors import NotFound
from shared.runs.model import Run
from shared.runs.result import final_result

log = logging.getLogger(__name__)

THREAD_META = "thread_id"
"""The `_meta` key of `tools/call` naming the thread to run on."""
PROGRESS_MODES = ["updates", "messages-tuple"]
"""What a call that asked for progress streams: a step per node, a token per chunk."""
QUIET_MODES = ["values"]
"""What a call without progress streams (only its `end` is read)."""


def visible_assistants(svc: Services) -> dict[str, Assistant]:
    """The caller's assistants and the system ones, each under its tool name."""
    decision = authz.authorize(
        "assistants",
        "search",
        {"graph_id": None, "metadata": {}, "limit": svc.settings.mcp_max_tools, "offset": 0},
    )
    metadata = authz.narrowed(decision, None) if decision else None
    found = svc.assistants.search(
        principal().user_id,
        AssistantFilter(metadata=metadata),
        limit=svc.settings.mcp_max_tools,
        offset=0,
        sort_by="created_at",
        sort_order="asc",
    )
    return tools.named(found)


def _schema(svc: Services, assistant: Assistant) -> dict[str, Any] | None:
    """The graph's input schema; None when the graph cannot give one (the tool then takes
    any object: the official server leaves such an assistant out, but it runs all the same)."""
    try:
        _, graph = svc.assistants.compiled(principal().user_id, assistant.assistant_id)
        schema = graph_schemas.schemas(graph)["input_schema"]
    except Exception:  # one broken graph must not hide every other tool
        log.warning("no input schema for an MCP tool", exc_info=True)
        return None
    return schema if isinstance(schema, dict) else None


def list_tools(params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    """One page of the caller's tools; `nextCursor` is the offset of the next page."""
    svc = current_services()
    cursor = (params.cursor if params is not None else None) or ""
    try:
        offset = int(cursor) if cursor else 0
    except ValueError:
        raise RpcError(
            INVALID_PARAMS, f"Invalid params: cursor: unknown cursor {cursor[:40]!r}"
        ) from None
    if offset < 0:
        raise RpcError(INVALID_PARAMS, "Invalid params: cursor: unknown cursor")
    named = list(visible_assistants(svc).items())
    size = svc.settings.mcp_tools_page_size
    page = named[offset : offset + size]
    listed = [tools.tool(name, assistant, _schema(svc, assistant)) for name, assistant in page]
    more = offset + size < len(named)
    return types.ListToolsResult(tools=listed, next_cursor=str(offset + size) if more else None)


def admit_call(params: types.CallToolRequestParams, progress: bool) -> Run:
    """Admit the run of a tool call as `POST /runs/wait` (or `/threads/{id}/runs/wait`)
    admits one; -32602 for an unknown tool or a `_meta.thread_id` that is not a thread id."""
    svc = current_services()
    assistant = visible_assistants(svc).get(params.name)
    if assistant is None:
        raise RpcError(INVALID_PARAMS, f"Unknown tool: {params.name[:200]}")
    raw: dict[str, Any] = {
        "assistant_id": assistant.assistant_id,
        "input": params.arguments or {},
        "stream_mode": PROGRESS_MODES if progress else QUIET_MODES,
    }
    thread_id = (params.meta or {}).get(THREAD_META)
    owner = principal().user_id
    if thread_id is None:
        return admit_run(owner, validate(StatelessRunCreate, raw).to_request(), raw)
    if not isinstance(thread_id, str):
        raise RpcError(INVALID_PARAMS, "Invalid params: _meta.thread_id: must be a thread id")
    raw["if_not_exists"] = "create"
    storage = public_ids.resolve(thread_id, None)  # threads.create_run: admit_run asks it
    wanted = public_ids.on_thread(validate(RunCreate, raw).to_request(storage))
    return admit_run(owner, wanted, raw)


@dataclass
class Progress:
    """How far a run got: events seen, and what the last one said."""

    count: int
    text: str | None


def _describe(event: Event) -> str | None:
    """A line for a progress notification: the node that ran, or the token streamed."""
    try:
        data = serde.loads(event.data)
    except ValueError:
        return event.event
    if event.event == "updates" and isinstance(data, dict) and data:
        return "ran " + ", ".join(str(k) for k in data)
    if event.event == "messages" and isinstance(data, list) and data:
        chunk = data[0]
        if isinstance(chunk, dict):
            return tools.last_ai_text({"messages": [{**chunk, "type": "ai"}]}) or None
    return event.event


class RunFollow:
    """Follows an admitted run to its end: yields a `Progress` per batch of events and None
    while idle (a heartbeat); `status` holds its terminal status once the iteration ends."""

    def __init__(self, svc: Services, run: Run) -> None:
        self._svc = svc
        self.run = run
        self.status: str | None = None
        self._count = 0

    def __iter__(self) -> Iterator[Progress | None]:
        svc, run_id = self._svc, self.run.run_id
        batches = svc.run_batches(run_id, BEFORE_FIRST, admitted=True)
        for batch in batches:
            events = [i for i in batch if isinstance(i, Event) and i.event != END_EVENT]
            if events:
                self._count += len(events)
                yield Progress(self._count, _describe(events[-1]))
            ended = next((i for i in batch if isinstance(i, Event) and i.event == END_EVENT), None)
            if ended is not None:
                self.status = _end_status(ended)
                return
            if any(isinstance(i, Gap) for i in batch):
                break
            if not events:
                yield None
        yield from self._until_terminal()

    def _until_terminal(self) -> Iterator[None]:
        """After a gap (the stream was lost): the durable status, once it is terminal."""
        store, wait = self._svc.store, threading.Event()
        while True:
            status = store.run_status(self.run.run_id)
            if status is None or status.terminal:
                self.status = status.value if status is not None else None
                return
            yield None
            wait.wait(self._svc.settings.stream_heartbeat_s / 5)


def _end_status(event: Event) -> str | None:
    try:
        data = serde.loads(event.data)
    except ValueError:
        return None
    status = data.get("status") if isinstance(data, dict) else None
    return status if isinstance(status, str) else None


def final_values(svc: Services, run: Run) -> Any:
    """What `/wait` answers for the ended run (its values, or `__error__`), as
    app/api/runs.py reads it: the worker's stored answer for a temporary thread, else the
    thread's state."""
    if run.deletes_thread:
        stored = svc.runs.stored_result(run.run_id)
        if stored is not None:
            return serde.loads(stored)
    try:
        ended = svc.store.get_run(run.thread_id, run.run_id, principal().user_id)
    except NotFound:
        return {}
    state = svc.state.get(ended.thread_id, ended.graph_id)
    return final_result(ended.status, ended.error, state["values"], state["interrupts"])


def result(svc: Services, follow: RunFollow) -> types.CallToolResult:
    """The tool's result for a followed run."""
    run = follow.run
    meta = {"run_id": run.run_id}
    if not run.deletes_thread:
        meta["thread_id"] = public_ids.public_of(run.thread_id)
    status = follow.status or "error"
    final = final_values(svc, run) if status in ("success", "error") else None
    return tools.call_result(final, status, meta)
