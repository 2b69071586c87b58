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

State: the graph's schema is `ThreadState` (S1), and `write_artifact` records the path it
saved in the `artifacts` channel by returning a `Command` that carries both the state
update and the ToolMessage; create_agent's tool node applies it like any tool result, so
the model sees the same ToolMessage as before and the thread's state (GET
/threads/{id}/state) lists the artifact. (That tool wraps `shared.agent.tools.write_artifact`
here for now; it belongs in tools.py.) Subagents (S6) share `ThreadState` but run with no
checkpointer of their own: `build_subagent`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Annotated, Any, cast

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command

from shared.agent.middleware.durable_context import DurableContextMiddleware
from shared.agent.middleware.memory import (
    MemoryInjectionMiddleware,
    MemoryWriteMiddleware,
    urgent_flush_hook,
)
from shared.agent.middleware.summarization import SummarizationMiddleware, build_summarizer
from shared.agent.model import make_model
from shared.agent.tools import list_artifacts, read_artifact, write_artifact
from shared.memory.manager import MemoryManager
from shared.memory.services import memory_manager
from shared.settings import Settings
from shared.state.modes import thread_state_schema
from shared.state.thread_state import ThreadState

GRAPH_ID = "lead_agent"

SYSTEM_PROMPT = """\
You are the lead agent of threadrun, a helpful assistant in a multi-turn conversation.
Answer the user directly and concisely. When the user asks for a file, a report or any
other artifact, write it with the write_artifact tool (a bare file name such as
"report.md"), then tell the user its path. Use list_artifacts and read_artifact to see
what this conversation has already produced."""


# The plain tool's function does the checks and the write (errors raise ToolException,
# which handle_tool_error turns into an error ToolMessage and no state update); its
# docstring becomes this tool's description, so the model sees the very same tool.
_write_file = cast("Callable[[str, str, RunnableConfig], str]", write_artifact.func)


def _save_artifact(
    filename: str,
    content: str,
    config: RunnableConfig,
    tool_call_id: Annotated[str, InjectedToolCallId],
) -> Command[Any]:
    result = _write_file(filename, content, config)
    message = ToolMessage(result, tool_call_id=tool_call_id, name=write_artifact.name)
    return Command(update={"artifacts": [json.loads(result)["path"]], "messages": [message]})


_save_artifact.__doc__ = _write_file.__doc__

save_artifact: StructuredTool = StructuredTool.from_function(
    func=_save_artifact,
    name=write_artifact.name,
    parse_docstring=True,
    handle_tool_error=True,
)
"""`write_artifact` that also records the saved path in the thread's `artifacts` (S2)."""

LEAD_TOOLS: tuple[BaseTool, ...] = (save_artifact, read_artifact, list_artifacts)


def lead_middleware(settings: Settings, model: BaseChatModel) -> list[AgentMiddleware[Any, Any]]:
    """SPEC §8 in order: memory injection (before_agent), summarization (before_model),
    durable context (around the model call), memory write (after_agent).

    The memory manager is built on first use (no connection at import)."""

    def manager() -> MemoryManager:
        return memory_manager(settings)

    middleware: list[AgentMiddleware[Any, Any]] = []
    if settings.memory_enabled:
        middleware.append(
            MemoryInjectionMiddleware(manager, timeout_s=settings.memory_injection_timeout_s)
        )
    if settings.summary_enabled:
        hooks = [urgent_flush_hook(manager)] if settings.memory_enabled else []
        middleware.append(SummarizationMiddleware(build_summarizer(settings, model, hooks)))
    middleware.append(DurableContextMiddleware())
    if settings.memory_enabled:
        middleware.append(MemoryWriteMiddleware(manager))
    return middleware


def build_lead_agent(settings: Settings | None = None) -> CompiledStateGraph[Any, Any, Any, Any]:
    """Build the lead agent graph, compiled without a checkpointer (the runtime adds one)."""
    settings = settings if settings is not None else Settings()
    model = make_model(settings)
    return create_agent(
        model,
        list(LEAD_TOOLS),
        system_prompt=SYSTEM_PROMPT,
        middleware=lead_middleware(settings, model),
        # S4: the checkpoint mode is fixed here, when the process builds its graph.
        state_schema=thread_state_schema(
            settings.checkpoint_mode, settings.checkpoint_snapshot_every
        ),
        name=GRAPH_ID,
    )


def build_subagent(
    name: str,
    model: BaseChatModel,
    tools: Sequence[BaseTool],
    *,
    system_prompt: str,
    middleware: Sequence[AgentMiddleware[Any, Any]] = (),
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A subagent over `ThreadState` with no checkpointer of its own (S6).

    `checkpointer=False` keeps it from inheriting the parent run's checkpointer when it
    is invoked inside a parent node: it writes no checkpoints and has no child thread
    identity; what survives is what the parent writes back into its own state.
    """
    return create_agent(
        model,
        list(tools),
        system_prompt=system_prompt,
        middleware=list(middleware),
        state_schema=ThreadState,
        checkpointer=False,
        name=name,
    )


graph = build_lead_agent()
