"""RunJournal: a LangChain callback handler that turns a run into audit events (SPEC J1-J3, J6).

Attach one per run attempt to the run's config (`config["callbacks"]`). It records:

- `model`: `model.start` / `model.end` (with `usage` and the usage `tag`) / `model.error`;
- `message`: `message.input` (the run's input messages) and `message.ai` (each reply);
- `tool`: `tool.call` / `tool.result` / `tool.error` (a handled tool error included);
- `artifact`: `artifact.written` for each successful `write_artifact` result, with the
  path, size and the SHA-256 of the content the tool was given;
- `middleware`: `middleware.state_change` (which state keys a middleware hook updated);
- `memory`: `memory.context` — only the SHA-256 of the memory text (J6);
- `lifecycle`: `run.progress` snapshots with counts and usage, at most one per
  `snapshot_interval_s` (J3).

Usage tags (J2). A model call's tokens go to exactly one tag:

1. the innermost run (following LangChain's parent_run_id chain) that introduced a
   `middleware:<name>` or `subagent:<name>` tag — set one with
   `runnable.with_config(tags=["subagent:researcher"])` or in the config passed to it
   (when one run introduces both kinds, `middleware:` wins);
2. a LangGraph node named like an agent middleware hook, `<Name>.before_model` (also
   before_agent, after_model, after_agent), introduces `middleware:<Name>` by itself, so a
   summarization middleware that calls a model is billed to it;
3. otherwise `lead_agent` (the `default_tag`).

LangChain merges tags into a sorted set, so their order says nothing about nesting;
that is why the journal follows the parent chain instead of picking a tag from the list.

Batching (J3). Events are buffered and written `flush_size` at a time. On the event
loop (the worker runs graphs with `astream`), a full buffer starts one background
writer task that writes batches through `asyncio.to_thread` while the buffer holds a
full batch; in a thread without a loop the batch is written inline. One lock orders all
writers, so seqs follow record order. A failed batch goes back to the front of the
buffer, the error is kept in `last_error`, and background writes pause with a backoff
(0.5 s doubling to 30 s); `flush()` waits for the writer, then writes everything in
batches and raises the first failure, again with the failed batch back at the front.
Nothing is dropped: the buffer is unbounded while the store is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, LLMResult

from shared.journal.base import Category, EventStore, RunEvent, check_category
from shared.journal.usage import (
    DEFAULT_TAG,
    MODEL_END,
    Usage,
    UsageSummary,
    add_usage,
    empty_usage,
    usage_summary,
)
from shared.model_errors import describe_model_error

log = logging.getLogger(__name__)

DEFAULT_FLUSH_SIZE = 20
DEFAULT_SNAPSHOT_INTERVAL_S = 5.0
ARTIFACT_TOOLS = frozenset({"write_artifact"})
TAG_PREFIXES = ("middleware:", "subagent:")
PROGRESS_TYPE = "run.progress"
RETRY_BACKOFF_S = (0.5, 30.0)
MAX_ERROR_CHARS = 2000

_MIDDLEWARE_NODE = re.compile(r"(?P<name>.+)\.(?P<hook>(?:before|after)_(?:agent|model))")


def sha256_text(text: str) -> str:
    """The hex SHA-256 of `text` encoded as UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _tag_rank(tag: str) -> tuple[int, str]:
    return (0 if tag.startswith("middleware:") else 1, tag)


def usage_tags(tags: Sequence[str] | None) -> set[str]:
    """The usage tags among LangChain tags (`middleware:<name>`, `subagent:<name>`)."""
    return {t for t in tags or () if t.startswith(TAG_PREFIXES) and t.partition(":")[2]}


def usage_of(response: LLMResult) -> Usage:
    """Token counts of a model response: message usage_metadata, else llm_output counts."""
    usage = empty_usage()
    found = False
    for generations in response.generations:
        for gen in generations:
            message = gen.message if isinstance(gen, ChatGeneration) else None
            meta = message.usage_metadata if isinstance(message, AIMessage) else None
            if meta:
                add_usage(usage, dict(meta))
                found = True
    if not found and response.llm_output:
        raw = response.llm_output.get("token_usage") or response.llm_output.get("usage") or {}
        if isinstance(raw, Mapping):
            add_usage(
                usage,
                {
                    "input_tokens": raw.get("prompt_tokens", raw.get("input_tokens")),
                    "output_tokens": raw.get("completion_tokens", raw.get("output_tokens")),
                    "total_tokens": raw.get("total_tokens"),
                },
            )
    if not usage["total_tokens"]:
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
    return usage


def _message_json(message: Any) -> dict[str, Any]:
    if isinstance(message, BaseMessage):
        return {"role": message.type, "content": str(message.text)}
    if isinstance(message, Mapping):
        return {
            "role": message.get("role") or message.get("type"),
            "content": message.get("content"),
        }
    return {"role": None, "content": str(message)}


def _error_json(error: BaseException) -> dict[str, Any]:
    # A failed provider call is recorded with its provider, host, status and kind.
    described = describe_model_error(error)
    if described is not None:
        return described
    return {"error": type(error).__name__, "message": str(error)[:MAX_ERROR_CHARS]}


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool returned, normalised: a ToolMessage, a Command carrying one, or a value."""

    status: str
    tool_call_id: str | None
    content: str
    state_keys: list[str] | None  # the keys of a Command's state update


def tool_result(output: Any) -> ToolResult:
    """Normalise a tool's output (on_tool_end) for the journal."""
    if isinstance(output, ToolMessage):
        return ToolResult(output.status, output.tool_call_id, str(output.text), None)
    update = None if isinstance(output, str) else getattr(output, "update", None)
    if isinstance(update, Sequence) and not isinstance(update, str):
        update = dict(u for u in update if isinstance(u, tuple) and len(u) == 2)
    if isinstance(update, Mapping):  # a Command(update={..., "messages": [ToolMessage]})
        messages = update.get("messages")
        found = [m for m in messages or () if isinstance(m, ToolMessage)]
        keys = sorted(str(k) for k in update)
        if found:
            msg = found[0]
            return ToolResult(msg.status, msg.tool_call_id, str(msg.text), keys)
        return ToolResult("success", None, str(output), keys)
    return ToolResult("success", None, output if isinstance(output, str) else str(output), None)


@dataclass(slots=True)
class _Node:
    """A LangChain run the journal saw start: its usage tag and the tags it carries."""

    parent: UUID | None
    carried: frozenset[str]
    tag: str
    hook: tuple[str, str] | None = None


@dataclass(slots=True)
class _ToolCall:
    name: str
    tag: str
    content_sha256: str | None = None


class RunJournal(BaseCallbackHandler):
    """Records one run attempt's model, tool, artifact, middleware and memory events (J1)."""

    # Called inline on the event loop (or the calling thread): no executor hop, so
    # events keep their order and recording costs a few dict operations.
    run_inline = True

    def __init__(
        self,
        store: EventStore,
        *,
        run_id: str,
        thread_id: str,
        flush_size: int = DEFAULT_FLUSH_SIZE,
        snapshot_interval_s: float = DEFAULT_SNAPSHOT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        default_tag: str = DEFAULT_TAG,
        artifact_tools: frozenset[str] = ARTIFACT_TOOLS,
    ) -> None:
        if flush_size < 1:
            raise ValueError("flush_size must be at least 1")
        self.store = store
        self.run_id = str(run_id)
        self.thread_id = str(thread_id)
        self.flush_size = flush_size
        self.snapshot_interval_s = snapshot_interval_s
        self.default_tag = default_tag
        self.artifact_tools = artifact_tools
        self._clock = clock
        self._lock = threading.Lock()  # buffer, counters, run tree
        self._write_lock = threading.Lock()  # one writer at a time: seqs in record order
        self._buffer: list[RunEvent] = []
        self._writer: asyncio.Task[None] | None = None
        self._retry_at = 0.0
        self._failures = 0
        self.last_error: BaseException | None = None
        self._nodes: dict[UUID, _Node] = {}
        self._models: dict[UUID, tuple[str, str | None]] = {}
        self._tools: dict[UUID, _ToolCall] = {}
        self._usage: dict[str, Usage] = {}
        self._artifacts: list[str] = []
        self._produced_output = False
        self._counts = dict.fromkeys(
            ("events", "model_calls", "tool_calls", "tool_errors", "artifacts"), 0
        )
        self._written = 0
        self._last_snapshot = clock()

    # --- what the run produced ------------------------------------------------------------
    def usage(self) -> UsageSummary:
        """`{"total": usage, "by_tag": {tag: usage}}` of this attempt's model calls (J2)."""
        with self._lock:
            return usage_summary(self._usage)

    def artifact_paths(self) -> list[str]:
        """Workspace-relative paths of the artifacts written (the receipt's presented paths)."""
        with self._lock:
            return list(dict.fromkeys(self._artifacts))

    @property
    def produced_output(self) -> bool:
        """Whether the attempt produced a reply with text or an artifact."""
        return self._produced_output

    def counts(self) -> dict[str, int]:
        """Events recorded and written, model/tool calls, tool errors, artifacts."""
        with self._lock:
            return {
                **self._counts,
                "written": self._written,
                "pending": len(self._buffer),
            }

    # --- recording --------------------------------------------------------------------------
    def record(self, category: str, type: str, payload: Mapping[str, Any]) -> None:
        """Record any event of this run (for middlewares and the executor)."""
        check_category(category)
        with self._lock:
            self._add(category, type, dict(payload))
        self._kick()

    def record_memory_context(self, text: str, *, source: str = "memory") -> str:
        """Record the memory context a model call used as its SHA-256 only (J6); returns it."""
        digest = sha256_text(text)
        self.record(
            Category.MEMORY,
            "memory.context",
            {"sha256": digest, "bytes": len(text.encode("utf-8")), "source": source},
        )
        return digest

    def record_middleware_change(self, middleware: str, hook: str, keys: Sequence[str]) -> None:
        """Record that a middleware hook changed these state keys (values are not copied)."""
        self.record(
            Category.MIDDLEWARE,
            "middleware.state_change",
            {"middleware": middleware, "hook": hook, "keys": sorted(keys)},
        )

    def _add(self, category: str, type: str, payload: dict[str, Any]) -> None:
        """Buffer one event (lock held), then a progress snapshot if one is due."""
        self._buffer.append(RunEvent(self.run_id, self.thread_id, category, type, payload))
        self._counts["events"] += 1
        now = self._clock()
        if type != PROGRESS_TYPE and now - self._last_snapshot >= self.snapshot_interval_s:
            self._last_snapshot = now
            snapshot = {**self._counts, "usage": usage_summary(self._usage)}
            self._add(Category.LIFECYCLE, PROGRESS_TYPE, snapshot)

    # --- the run tree and usage tags -----------------------------------------------------------
    def _enter(
        self,
        run_id: UUID,
        parent: UUID | None,
        tags: Sequence[str] | None,
        metadata: Mapping[str, Any] | None,
        name: str | None,
    ) -> _Node:
        """Register a LangChain run (lock held) and resolve its usage tag."""
        carried = set(usage_tags(tags))
        hook = None
        node_name = (metadata or {}).get("langgraph_node")
        if isinstance(node_name, str) and node_name == name:
            m = _MIDDLEWARE_NODE.fullmatch(node_name)
            if m:
                hook = (m.group("name"), m.group("hook"))
                carried.add(f"middleware:{hook[0]}")
        up = self._nodes.get(parent) if parent is not None else None
        introduced = carried - up.carried if up is not None else carried
        if introduced:
            tag = min(introduced, key=_tag_rank)
        else:
            tag = up.tag if up is not None else self.default_tag
        node = _Node(parent, frozenset(carried | (up.carried if up else set())), tag, hook)
        self._nodes[run_id] = node
        return node

    # --- callbacks: chains ---------------------------------------------------------------------
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Track the run tree; record the input messages of the root run."""
        with self._lock:
            self._enter(run_id, parent_run_id, tags, metadata, kwargs.get("name"))
            if parent_run_id is None and isinstance(inputs, Mapping):
                messages = inputs.get("messages")
                if isinstance(messages, Sequence) and not isinstance(messages, str) and messages:
                    payload = {"messages": [_message_json(m) for m in messages]}
                    self._add(Category.MESSAGE, "message.input", payload)
        self._kick()

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Record a middleware hook's state change (the keys it updated)."""
        with self._lock:
            node = self._nodes.pop(run_id, None)
            if node is None or node.hook is None:
                return
            # A hook returns a state update dict, or a Command carrying one.
            update = outputs if isinstance(outputs, Mapping) else getattr(outputs, "update", None)
            if isinstance(update, Mapping) and update:
                payload = {"middleware": node.hook[0], "hook": node.hook[1], "keys": sorted(update)}
                self._add(Category.MIDDLEWARE, "middleware.state_change", payload)
        self._kick()

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Forget the run."""
        with self._lock:
            self._nodes.pop(run_id, None)

    # --- callbacks: models ---------------------------------------------------------------------
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Record `model.start`."""
        self._model_start(
            serialized, sum(len(m) for m in messages), run_id, parent_run_id, tags, metadata, kwargs
        )

    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Record `model.start` of a completion model."""
        self._model_start(serialized, len(prompts), run_id, parent_run_id, tags, metadata, kwargs)

    def _model_start(
        self,
        serialized: dict[str, Any] | None,
        n_messages: int,
        run_id: UUID,
        parent: UUID | None,
        tags: list[str] | None,
        metadata: dict[str, Any] | None,
        kwargs: dict[str, Any],
    ) -> None:
        meta = metadata or {}
        params = kwargs.get("invocation_params") or {}
        model = (
            meta.get("ls_model_name")
            or params.get("model_name")
            or params.get("model")
            or (serialized or {}).get("name")
        )
        with self._lock:
            node = self._enter(run_id, parent, tags, metadata, kwargs.get("name"))
            self._models[run_id] = (node.tag, model)
            self._counts["model_calls"] += 1
            payload = {
                "call_id": str(run_id),
                "tag": node.tag,
                "model": model,
                "messages": n_messages,
                "node": meta.get("langgraph_node"),
            }
            self._add(Category.MODEL, "model.start", payload)
        self._kick()

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        """Record `model.end` with the token usage, and the reply as `message.ai`."""
        usage = usage_of(response)
        gen = (
            response.generations[0][0] if response.generations and response.generations[0] else None
        )
        text, finish = "", None
        tool_calls: list[dict[str, Any]] = []
        if isinstance(gen, ChatGeneration):
            text = str(gen.message.text)
            tool_calls = [
                {"id": tc.get("id"), "name": tc.get("name")}
                for tc in getattr(gen.message, "tool_calls", None) or []
            ]
            finish = gen.message.response_metadata.get("finish_reason")
        elif gen is not None:
            text = str(gen.text)
        with self._lock:
            self._nodes.pop(run_id, None)
            tag, model = self._models.pop(run_id, (self.default_tag, None))
            add_usage(self._usage.setdefault(tag, empty_usage()), usage)
            call = {"call_id": str(run_id), "tag": tag, "model": model}
            self._add(Category.MODEL, MODEL_END, {**call, "usage": usage, "finish_reason": finish})
            if text or tool_calls:
                self._add(
                    Category.MESSAGE,
                    "message.ai",
                    {**call, "content": text, "tool_calls": tool_calls},
                )
            if text.strip():
                self._produced_output = True
        self._kick()

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Record `model.error`."""
        with self._lock:
            self._nodes.pop(run_id, None)
            tag, model = self._models.pop(run_id, (self.default_tag, None))
            payload = {"call_id": str(run_id), "tag": tag, "model": model, **_error_json(error)}
            self._add(Category.MODEL, "model.error", payload)
        self._kick()

    # --- callbacks: tools ----------------------------------------------------------------------
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Record `tool.call`; remember the content hash of an artifact write."""
        name = str((serialized or {}).get("name") or kwargs.get("name") or "tool")
        with self._lock:
            node = self._enter(run_id, parent_run_id, tags, metadata, name)
            call = _ToolCall(name, node.tag)
            if name in self.artifact_tools and isinstance((inputs or {}).get("content"), str):
                call.content_sha256 = sha256_text((inputs or {})["content"])
            self._tools[run_id] = call
            self._counts["tool_calls"] += 1
            args: Any = inputs if inputs is not None else input_str
            payload = {"call_id": str(run_id), "name": name, "tag": node.tag, "args": args}
            self._add(Category.TOOL, "tool.call", payload)
        self._kick()

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Record `tool.result` (or `tool.error` for a handled error) and produced artifacts."""
        result = tool_result(output)
        with self._lock:
            self._nodes.pop(run_id, None)
            call = self._tools.pop(run_id, None) or _ToolCall(str(kwargs.get("name")), "")
            ident: dict[str, Any] = {
                "call_id": str(run_id),
                "name": call.name,
                "tool_call_id": result.tool_call_id,
            }
            payload: dict[str, Any] = {**ident, "status": result.status, "content": result.content}
            if result.state_keys is not None:
                payload["state_update"] = result.state_keys
            if result.status == "error":
                self._counts["tool_errors"] += 1
                self._add(Category.TOOL, "tool.error", payload)
            else:
                self._add(Category.TOOL, "tool.result", payload)
                if call.name in self.artifact_tools:
                    self._artifact(ident, result.content, call.content_sha256)
        self._kick()

    def _artifact(self, ident: dict[str, Any], content: str, sha256: str | None) -> None:
        try:
            info = json.loads(content)
            path, size = str(info["path"]), int(info["size"])
        except (ValueError, KeyError, TypeError):
            log.warning(
                "artifact tool result is not {path, size}",
                extra={"run_id": self.run_id, "thread_id": self.thread_id},
            )
            return
        self._artifacts.append(path)
        self._counts["artifacts"] += 1
        self._produced_output = True
        payload = {**ident, "path": path, "size": size, "sha256": sha256}
        self._add(Category.ARTIFACT, "artifact.written", payload)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Record `tool.error` for an exception the tool did not handle."""
        with self._lock:
            self._nodes.pop(run_id, None)
            call = self._tools.pop(run_id, None)
            name = call.name if call else kwargs.get("name")
            self._counts["tool_errors"] += 1
            payload = {
                "call_id": str(run_id),
                "name": name,
                "status": "error",
                **_error_json(error),
            }
            self._add(Category.TOOL, "tool.error", payload)
        self._kick()

    # --- writing -------------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Events buffered and not yet written."""
        with self._lock:
            return len(self._buffer)

    def _kick(self) -> None:
        """Start writing when a full batch is buffered (not on failure backoff)."""
        if len(self._buffer) < self.flush_size or self._clock() < self._retry_at:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:  # a plain thread: write here
            # A failure is kept (last_error), logged and retried by _write; the run goes on.
            with contextlib.suppress(Exception):
                self._write(full_only=True)
            return
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._background_write())

    async def _background_write(self) -> None:
        with contextlib.suppress(Exception):  # kept and logged by _write
            await asyncio.to_thread(self._write, full_only=True)

    def _failed(self, exc: BaseException) -> None:
        """Keep the error and pause background writes (0.5 s doubling to 30 s)."""
        self._failures += 1
        self.last_error = exc
        lo, hi = RETRY_BACKOFF_S
        self._retry_at = self._clock() + min(hi, lo * 2 ** (self._failures - 1))
        log.warning(
            "journal write failed (%d buffered, kept): %s",
            self.pending,
            exc,
            extra={"run_id": self.run_id, "thread_id": self.thread_id},
        )

    def _write(self, *, full_only: bool) -> int:
        """Write buffered batches in order; a failed batch goes back to the front, then raises."""
        written = 0
        with self._write_lock:
            while True:
                with self._lock:
                    if not self._buffer or (full_only and len(self._buffer) < self.flush_size):
                        break
                    batch = self._buffer[: self.flush_size]
                    del self._buffer[: self.flush_size]
                try:
                    self.store.append_batch(batch)
                except BaseException as exc:
                    with self._lock:
                        self._buffer[0:0] = batch
                    self._failed(exc)
                    raise
                written += len(batch)
                with self._lock:
                    self._written += len(batch)
                    self._failures = 0
                    self._retry_at = 0.0
        return written

    async def flush(self) -> int:
        """Wait for the background writer, then write every buffered event in batches.

        Returns how many events this call wrote. Raises the store's error when a batch
        fails; that batch and every later event stay buffered, in order, for the next try.
        """
        writer = self._writer
        if writer is not None and not writer.done():
            await asyncio.wait([writer])
        return await asyncio.to_thread(self._write, full_only=False)

    def flush_sync(self) -> int:
        """`flush()` for code without an event loop (never call it on the loop)."""
        return self._write(full_only=False)


def journal_from_config(config: Mapping[str, Any] | None) -> RunJournal | None:
    """The RunJournal among a RunnableConfig's callbacks, if any.

    For code that runs inside the graph and records events itself, e.g. a memory
    middleware (J6): `journal_from_config(langgraph.config.get_config())`. Inside a node
    the callbacks are a CallbackManager; at the top they are the list the run was given.
    """
    callbacks = (config or {}).get("callbacks")
    if isinstance(callbacks, BaseCallbackManager):
        handlers = [*callbacks.handlers, *callbacks.inheritable_handlers]
    elif isinstance(callbacks, Sequence):
        handlers = list(callbacks)
    else:
        return None
    return next((h for h in handlers if isinstance(h, RunJournal)), None)
