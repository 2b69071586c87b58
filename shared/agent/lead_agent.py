"""The default assistant graph, `lead_agent` (SPEC §9).

How the per-run knobs (`configurable.tokens`, `configurable.token_delay_ms`) reach
the model: the model reads them itself, at call time, from the RunnableConfig it runs
under. `create_agent`'s model node calls `model.ainvoke(messages)` without passing a
config, but LangGraph runs every node with the run's config as the ambient one, and
`BuiltinChatModel` resolves its config through `ensure_config`, which picks it up. So
the graph is built once, at import, and still honours each run's knobs, with no
per-run model construction and no extra middleware; the same model, called directly
with a config, behaves the same. A provider model (settings.model is not "builtin")
ignores those knobs, as it should.
"""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langgraph.graph.state import CompiledStateGraph

from shared.agent.model import make_model
from shared.agent.tools import ARTIFACT_TOOLS
from shared.settings import Settings

GRAPH_ID = "lead_agent"

SYSTEM_PROMPT = """\
You are the lead agent of threadrun, a helpful assistant in a multi-turn conversation.
Answer the user directly and concisely. When the user asks for a file, a report or any
other artifact, write it with the write_artifact tool (a bare file name such as
"report.md"), then tell the user its path. Use list_artifacts and read_artifact to see
what this conversation has already produced."""


def build_lead_agent(settings: Settings | None = None) -> CompiledStateGraph[Any, Any, Any, Any]:
    """Build the lead agent graph, compiled without a checkpointer (the runtime adds one)."""
    settings = settings if settings is not None else Settings()
    # Run in order around every model call; memory injection, durable context,
    # summarization and memory write (SPEC §8) are added here as they are built.
    middleware: list[AgentMiddleware[Any, Any]] = []
    return create_agent(
        make_model(settings),
        list(ARTIFACT_TOOLS),
        system_prompt=SYSTEM_PROMPT,
        middleware=middleware,
        name=GRAPH_ID,
    )


graph = build_lead_agent()
