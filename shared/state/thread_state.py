"""`ThreadState`: what one thread's checkpoint holds, channel by channel (SPEC §6, S1).

Every field carries its reducer (`shared.state.reducers`, S2) as the last `Annotated`
item, which is where LangGraph looks for it. `messages` is inherited from LangChain's
`AgentState` with its `add_messages` reducer, so `create_agent(state_schema=ThreadState)`
accepts the schema and the message channel stays exactly LangChain's.

Assembly with middlewares (S1: "the final schema is the assembled one"): nothing to do
here. `create_agent` merges the `state_schema` of every middleware, in registration
order, and then `state_schema=` last, so extra middleware channels are added and a field
that ThreadState also declares keeps ThreadState's reducer (e.g. LangChain's todo
middleware declares `todos` with no reducer; ours wins). The assembled schema of a built
graph is `graph.builder.state_schema`; a state-only graph built on it (S5 rollback and
compaction) gets the very same channels and reducers. tests/unit/test_thread_state.py
proves both.

Input: only `messages`, `title` and `goal` may come in a run's input. The other fields are
derived by the runtime (sandbox identity, workspace paths, ledgers, summary), so they are
marked `OmitFromInput`; `create_agent` leaves them out of the graph's input schema and
LangGraph drops them from an input, so a client cannot forge a thread's sandbox id or its
artifacts through a run (G3). The owner can still edit them through the state API (S5).
"""

# No `from __future__ import annotations` here: TypedDict must see NotRequired/Required
# when the class is created, or it counts every field as required.
from typing import Annotated, Any, Literal, NotRequired, Required

from langchain.agents.middleware import AgentState
from langchain.agents.middleware.types import OmitFromInput
from typing_extensions import TypedDict

from shared.state.reducers import (
    keep_last,
    merge_artifacts,
    merge_background_tasks,
    merge_delegations,
    merge_promoted,
    merge_sandbox,
    merge_todos,
    merge_uploaded_files,
    merge_viewed_images,
)

TaskStatus = Literal["pending", "running", "completed", "failed", "cancelled"]
"""Status of a delegation or background task; the last three are terminal."""


class SandboxState(TypedDict):
    """The thread's execution sandbox; its id is fixed for the life of the thread (§9)."""

    sandbox_id: str


class ThreadData(TypedDict, total=False):
    """Where the thread's files live inside its sandbox workspace."""

    workspace_path: str
    uploads_path: str
    outputs_path: str


class Todo(TypedDict):
    """One todo item, the shape LangChain's `write_todos` tool writes."""

    content: str
    status: Literal["pending", "in_progress", "completed"]


class UploadedFile(TypedDict, total=False):
    """A file the user uploaded to the thread, keyed by its workspace-relative path."""

    path: Required[str]
    filename: str
    size: int
    content_type: str


class ViewedImage(TypedDict, total=False):
    """An image the model has been shown, keyed by its workspace-relative path."""

    path: Required[str]
    mime_type: str


class PromotedTools(TypedDict):
    """Tools promoted into the active set from the tool catalog with this hash."""

    catalog_hash: str
    items: list[str]


class Delegation(TypedDict, total=False):
    """One subagent delegation; `version` grows with every update of this id."""

    status: Required[TaskStatus]
    version: int
    subagent: str
    task: str
    result: str
    error: str
    updated_at: str


class BackgroundTask(TypedDict, total=False):
    """One long-running background task; `version` grows with every update of this id."""

    status: Required[TaskStatus]
    version: int
    kind: str
    description: str
    result: str
    error: str
    updated_at: str


class ThreadState(AgentState[Any]):
    """The checkpointed state of a thread (S1); each field's reducer is its S2 rule."""

    sandbox: NotRequired[Annotated[SandboxState | None, OmitFromInput, merge_sandbox]]
    thread_data: NotRequired[Annotated[ThreadData | None, OmitFromInput, keep_last]]
    title: NotRequired[Annotated[str | None, keep_last]]
    artifacts: NotRequired[Annotated[list[str], OmitFromInput, merge_artifacts]]
    todos: NotRequired[Annotated[list[Todo], OmitFromInput, merge_todos]]
    goal: NotRequired[Annotated[str | None, keep_last]]
    uploaded_files: NotRequired[Annotated[list[UploadedFile], OmitFromInput, merge_uploaded_files]]
    viewed_images: NotRequired[Annotated[list[ViewedImage], OmitFromInput, merge_viewed_images]]
    promoted: NotRequired[Annotated[PromotedTools | None, OmitFromInput, merge_promoted]]
    delegations: NotRequired[Annotated[dict[str, Delegation], OmitFromInput, merge_delegations]]
    skill_context: NotRequired[Annotated[str | None, OmitFromInput, keep_last]]
    summary_text: NotRequired[Annotated[str | None, OmitFromInput, keep_last]]
    background_tasks: NotRequired[
        Annotated[dict[str, BackgroundTask], OmitFromInput, merge_background_tasks]
    ]


THREAD_STATE_FIELDS: tuple[str, ...] = (
    "messages",
    "sandbox",
    "thread_data",
    "title",
    "artifacts",
    "todos",
    "goal",
    "uploaded_files",
    "viewed_images",
    "promoted",
    "delegations",
    "skill_context",
    "summary_text",
    "background_tasks",
)
"""The S1 fields, in the order the spec lists them."""
