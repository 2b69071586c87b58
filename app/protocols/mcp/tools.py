"""Assistants as MCP tools, without IO: a tool name valid for MCP from each assistant's name
(unique among the caller's tools), its input schema simplified for a model to fill, and a
run's final values as a `CallToolResult`.

Names follow the official server's rule (whitespace runs become `_`, any character outside
`[A-Za-z0-9_.-]` is dropped, at most 128 characters); where two assistants would share a
name the official server drops the second, here it gets a `_2`, `_3`... suffix in a fixed
order (system assistants first, then by creation), so that `tools/call` finds the assistant
`tools/list` named, on any web process.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

import mcp_types as types

from shared import serde
from shared.assistants.model import Assistant

NAME_MAX = 128
_BLANKS = re.compile(r"\s+")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.\-]")

MESSAGE_DEFS = frozenset(
    f"{kind}{suffix}"
    for kind in ("AI", "Human", "Chat", "System", "Function", "Tool")
    for suffix in ("Message", "MessageChunk")
)
"""The LangChain message models a graph's input schema defines in `$defs`."""
SUPPORT_DEFS = frozenset(
    {
        "ToolCall",
        "ToolCallChunk",
        "InvalidToolCall",
        "UsageMetadata",
        "InputTokenDetails",
        "OutputTokenDetails",
    }
)
"""The models those messages refer to, gone with them."""
MESSAGE_FIELD = "The user message to send to the agent."
ANNOTATIONS = types.ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
)
"""A run may write its thread and reach the world through its tools: no safe hints."""


def tool_name(name: str) -> str:
    """An MCP tool name (`^[A-Za-z0-9_.-]{1,128}$`) from an assistant's name, possibly
    empty when the name has no character it may keep."""
    return _NOT_NAME.sub("", _BLANKS.sub("_", name.strip()))[:NAME_MAX]


def _order(assistant: Assistant) -> tuple[bool, str, str]:
    return (not assistant.system, assistant.created_at.isoformat(), assistant.assistant_id)


def named(assistants: Iterable[Assistant]) -> dict[str, Assistant]:
    """Each assistant under a unique tool name: its own, else with the first free `_<n>`
    suffix; an assistant whose name keeps nothing is named after its graph."""
    out: dict[str, Assistant] = {}
    for assistant in sorted(assistants, key=_order):
        base = tool_name(assistant.name) or tool_name(assistant.graph_id) or "assistant"
        name, n = base, 1
        while name in out:
            n += 1
            tail = f"_{n}"
            name = base[: NAME_MAX - len(tail)] + tail
        out[name] = assistant
    return out


def _is_message_list(prop: Mapping[str, Any]) -> bool:
    if prop.get("type") != "array" or not isinstance(prop.get("items"), dict):
        return False
    items = prop["items"]
    options = items.get("oneOf") or items.get("anyOf") or [items]
    return any(
        isinstance(o, dict) and str(o.get("$ref", "")).removeprefix("#/$defs/") in MESSAGE_DEFS
        for o in options
    )


def input_schema(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """The tool's `inputSchema` from the graph's input JSON Schema (as `GET
    /assistants/{id}/schemas` gives it): a list of LangChain messages becomes one string (the
    user's message, which LangGraph's `add_messages` reads as a human message), and the
    root is an object as MCP requires."""
    out = copy.deepcopy(dict(schema or {}))
    defs = out.get("$defs")
    if isinstance(defs, dict) and MESSAGE_DEFS & set(defs):
        props = out.get("properties")
        if isinstance(props, dict):
            for key, prop in list(props.items()):
                if isinstance(prop, dict) and _is_message_list(prop):
                    title = prop.get("title", key)
                    props[key] = {"type": "string", "title": title, "description": MESSAGE_FIELD}
        for name in MESSAGE_DEFS | SUPPORT_DEFS:
            defs.pop(name, None)
        if not defs:
            del out["$defs"]
    out.setdefault("type", "object")
    return out


def tool(name: str, assistant: Assistant, schema: Mapping[str, Any] | None) -> types.Tool:
    """The MCP tool of `assistant`."""
    return types.Tool(
        name=name,
        title=assistant.name,
        description=assistant.description or f"Runs the {assistant.name} assistant",
        input_schema=input_schema(schema),
        annotations=ANNOTATIONS,
    )


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            c if isinstance(c, str) else str(c.get("text", ""))
            for c in content
            if isinstance(c, str) or (isinstance(c, dict) and c.get("type") == "text")
        ]
        return "".join(parts)
    return ""


def last_ai_text(values: Any) -> str | None:
    """The text of the last AI message in the run's values, if there is one."""
    messages = values.get("messages") if isinstance(values, dict) else None
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("type") in ("ai", "AIMessageChunk"):
            return _text_of(message.get("content"))
    return None


def call_result(final: Any, status: str, meta: dict[str, Any]) -> types.CallToolResult:
    """A run's end as the tool's result: the text of its last AI message (else its values
    as JSON) and the values as `structuredContent`; `isError` with the run's error for a
    failed run, and for one cancelled (`interrupted`) or timed out. A graph waiting on
    `interrupt()` succeeded: its values carry `__interrupt__`."""
    if isinstance(final, dict) and "__error__" in final:
        error = final["__error__"]
        text = (
            f"{error.get('error', 'RunError')}: {error.get('message', '')}".rstrip(": ")
            if isinstance(error, dict)
            else str(error)
        )
        return _result(text, None, True, meta)
    if status != "success":  # interrupted (cancelled) or timed out
        return _result(f"the run ended {status}", None, True, meta)
    structured = final if isinstance(final, dict) else {"value": final}
    said = last_ai_text(final)
    return _result(serde.dumps(final).decode() if said is None else said, structured, False, meta)


def _result(
    text: str, structured: dict[str, Any] | None, error: bool, meta: dict[str, Any]
) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=error,
        _meta=meta,
    )
