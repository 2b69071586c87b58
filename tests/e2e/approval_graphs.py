"""Graphs that pause on `interrupt()` for the chat page's approval tests
(tests/e2e/test_chat_approvals.py), served only by the config file those tests write.

`ask_chat` asks a plain question (`interrupt("...")`) and answers with what it was told.
`review_chat` asks for a review of a tool call in the shape LangChain's
HumanInTheLoopMiddleware emits (`action_requests` / `review_configs`) and answers with the
decision it got back (`{"decisions": [...]}`), so a test can read the resume value.
`inbox_chat` asks in agent-chat-ui's inbox shape (a list of `HumanInterrupt`:
`action_request` / `config` / `description`) and answers with the response list it got.
`hitl_agent` is no imitation: LangChain's own `create_agent` with its
`HumanInTheLoopMiddleware` over the built-in model and threadrun's `write_artifact` tool,
so an approval from the chat page really runs the tool (a file appears), an edit runs it
with the edited arguments and a rejection never runs it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypedDict

from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

from shared.agent.model import ARTIFACT_TOOL, BuiltinChatModel
from shared.agent.tools import write_artifact

QUESTION = "Which city should I book?"
REVIEW = {
    "action_requests": [
        {
            "name": "send_email",
            "args": {"to": "ops@example.com", "subject": "Deploy"},
            "description": "Send an email about the deploy",
        }
    ],
    "review_configs": [
        {"action_name": "send_email", "allowed_decisions": ["approve", "edit", "reject"]}
    ],
}

INBOX = [
    {
        "action_request": {"action": "send_email", "args": {"to": "ops@example.com"}},
        "config": {
            "allow_accept": True,
            "allow_edit": True,
            "allow_respond": True,
            "allow_ignore": True,
        },
        "description": "Send an email about the deploy",
    }
]


class ChatState(TypedDict):
    """A conversation."""

    messages: Annotated[list[AnyMessage], add_messages]


def ask(state: ChatState) -> dict[str, Any]:
    """Pause on a plain question, then say what the answer was."""
    answer = interrupt(QUESTION)
    return {"messages": [AIMessage(content=f"booking: {answer}")]}


def review(state: ChatState) -> dict[str, Any]:
    """Pause for a tool-call review, then say which decision came back."""
    decision = interrupt(REVIEW)
    return {"messages": [AIMessage(content=f"decision: {json.dumps(decision, sort_keys=True)}")]}


def inbox(state: ChatState) -> dict[str, Any]:
    """Pause in agent-chat-ui's inbox shape, then say which response came back."""
    response = interrupt(INBOX)
    return {"messages": [AIMessage(content=f"response: {json.dumps(response, sort_keys=True)}")]}


def _one_node(name: str, fn: Any) -> Any:
    builder = StateGraph(ChatState)
    builder.add_node(name, fn)
    builder.add_edge(START, name)
    builder.add_edge(name, END)
    return builder.compile()


ask_chat = _one_node("ask", ask)
review_chat = _one_node("review", review)
inbox_chat = _one_node("inbox", inbox)
hitl_agent = create_agent(
    BuiltinChatModel(tokens=16),
    [write_artifact],
    middleware=[HumanInTheLoopMiddleware(interrupt_on={ARTIFACT_TOOL: True})],
    name="hitl_agent",
)
