"""Client-written `messages` checked before they reach the graph's reducer (A3).

`POST /threads/{id}/state` hands `values.messages` to LangGraph's `add_messages`, which
coerces each item with LangChain's `convert_to_messages`. A shape it cannot coerce (`5`,
`[null]`, `[["a", "b", "c"]]`, `tool_calls: 5`, a tool call without a name) raised
NotImplementedError or TypeError deep in the graph, a 500 with a traceback. The same
coercion is run here first, item by item, so that the answer is a 422 naming the item.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages.utils import convert_to_messages

from shared.errors import ValidationFailed

FIELD = "values.messages"


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text.split(" For troubleshooting", 1)[0][:300] or type(exc).__name__


def check_messages(values: Any) -> None:
    """Raise ValidationFailed (422) unless `values.messages`, if given, coerces to messages.

    Accepts what `add_messages` accepts: one message or a list of them, each a message
    object, a dict with role/type and content, a (role, content) pair or a string.
    """
    if not isinstance(values, dict) or values.get("messages") is None:
        return
    items = values["messages"]
    many = isinstance(items, list)
    for index, item in enumerate(items if many else [items]):
        field = f"{FIELD}[{index}]" if many else FIELD
        try:
            convert_to_messages([item])
        except Exception as exc:
            raise ValidationFailed(f"{field}: not a message: {_reason(exc)}", field=field) from exc
