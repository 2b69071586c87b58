"""Assistants as MCP tools (app/protocols/mcp/tools.py), pure: names valid for MCP and
unique, input schemas a model can fill, and a run's end as a `CallToolResult`."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from app.protocols.mcp import tools
from shared.assistants.model import Assistant

NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def assistant(name: str, n: int = 0, owner: str | None = "alice", graph: str = "g") -> Assistant:
    at = T0 + dt.timedelta(seconds=n)
    return Assistant(f"id-{n}", graph, name, 1, at, at, owner=owner)


def test_names_are_valid_for_mcp() -> None:
    """Blanks become `_`, other characters outside the MCP set go, 128 at most."""
    assert tools.tool_name("  My  helper\tbot ") == "My_helper_bot"
    assert tools.tool_name("Ünïcode/émoji 🙂 bot!") == "ncodemoji__bot"
    assert len(tools.tool_name("x" * 300)) == 128
    assert tools.tool_name("!!!") == ""


def test_names_are_unique_in_a_fixed_order() -> None:
    """System assistants first, then by creation: the second `helper` is `helper_2`, and an
    assistant whose name keeps nothing is named after its graph."""
    found = [
        assistant("helper", 2),
        assistant("helper", 1),
        assistant("g", 5, owner=None),
        assistant("???", 3, graph="lead_agent"),
        assistant("x" * 200, 6),
        assistant("x" * 200, 7),
    ]
    named = tools.named(found)
    assert [(k, a.assistant_id) for k, a in named.items()][:4] == [
        ("g", "id-5"),
        ("helper", "id-1"),
        ("helper_2", "id-2"),
        ("lead_agent", "id-3"),
    ]
    assert all(NAME.match(k) for k in named)
    assert len(named) == len(found)
    assert tools.named(reversed(found)).keys() == named.keys()


def message_schema() -> dict[str, Any]:
    ref = {"oneOf": [{"$ref": "#/$defs/AIMessage"}, {"$ref": "#/$defs/HumanMessage"}]}
    return {
        "$defs": {"AIMessage": {}, "HumanMessage": {}, "ToolCall": {}, "Other": {"type": "string"}},
        "properties": {"messages": {"type": "array", "items": ref, "title": "Messages"}},
        "required": ["messages"],
    }


def test_message_lists_become_one_string() -> None:
    """LangChain message lists are a string for a model to fill; other definitions stay."""
    out = tools.input_schema(message_schema())
    assert out["type"] == "object"
    assert out["properties"]["messages"] == {
        "type": "string",
        "title": "Messages",
        "description": tools.MESSAGE_FIELD,
    }
    assert out["$defs"] == {"Other": {"type": "string"}}
    assert tools.input_schema(None) == {"type": "object"}
    original = message_schema()
    tools.input_schema(original)
    assert original == message_schema()  # the graph's own schema is left as it was


def test_a_tool_names_its_assistant() -> None:
    """The tool's title is the assistant's name; a description falls back to it."""
    tool = tools.tool("helper", assistant("My helper"), {"type": "object"})
    assert (tool.name, tool.title) == ("helper", "My helper")
    assert tool.description == "Runs the My helper assistant"


def test_results() -> None:
    """The last AI message's text and the values; an error or a cancel is `isError`."""
    meta = {"run_id": "r"}
    values = {
        "messages": [
            {"type": "human", "content": "hi"},
            {
                "type": "ai",
                "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}],
            },
            {"type": "tool", "content": "tool output"},
        ]
    }
    ok = tools.call_result(values, "success", meta)
    assert (ok.is_error, ok.content[0].text, ok.structured_content) == (False, "hello", values)  # type: ignore[union-attr]
    plain = tools.call_result({"n": 1}, "success", meta)
    assert plain.content[0].text == '{"n":1}'  # type: ignore[union-attr]
    failed = tools.call_result(
        {"__error__": {"error": "ValueError", "message": "bad"}}, "error", meta
    )
    assert failed.is_error and failed.content[0].text == "ValueError: bad"  # type: ignore[union-attr]
    cancelled = tools.call_result(None, "interrupted", meta)
    assert cancelled.is_error and "interrupted" in cancelled.content[0].text  # type: ignore[union-attr]
    assert cancelled.meta == meta
