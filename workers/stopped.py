"""Stop keeps what was said: the partial answer of an interrupted run is committed.

A cancel with action `interrupt` (the stop button) cancels the graph task mid model
call, so the answer being streamed never reaches a checkpoint: the transcript kept the
user's message only, and after two stops a thread held two user messages in a row.
`PartialReplies` follows the tokens of the lead model's calls in flight (the callback
LangChain sends for every streamed chunk, whatever the client's stream mode); on an
interrupt the executor commits the text streamed so far as an AIMessage marked
`response_metadata.stopped = true`, with the streamed message's id so a client that
showed the stream sees the same message, through the state accessor with the run's
fence keys (L2: only the current owner writes), as the model node's output, and
nothing is left to run next (the after-agent hooks of a stopped turn are skipped).

Only a streamed call has tokens to keep (LangChain streams a model call when a client
asked for messages); a stop during a tool call or between calls keeps nothing new.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import add_ai_message_chunks
from langchain_core.outputs import ChatGenerationChunk, GenerationChunk
from langgraph.constants import TAG_NOSTREAM

MODEL_NODE = "model"
"""create_agent's model node: the calls whose answer is the thread's next AI message."""
STOPPED_KEY = "stopped"
"""`response_metadata` key of an answer cut short by a stop."""


class PartialReplies(BaseCallbackHandler):
    """The streamed text of the root graph's model calls that have not ended yet."""

    run_inline = True  # in order, on the loop: no thread hop per token

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # The chunks of each call so far, merged only when a stop asks (`partial`): adding
        # each chunk to the message so far rebuilt the whole message per token (quadratic
        # in the reply's length, and a tenth of a worker's CPU on a 200-token reply).
        self._calls: dict[UUID, list[AIMessageChunk]] = {}

    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Follow a call of the root graph's model node (not a subgraph's, not hidden)."""
        md = metadata or {}
        ns = str(md.get("langgraph_checkpoint_ns", ""))
        if (
            md.get("langgraph_node") == MODEL_NODE
            and "|" not in ns
            and TAG_NOSTREAM not in (tags or [])
        ):
            with self._lock:
                self._calls[run_id] = []

    def on_llm_new_token(
        self,
        token: str | list[str | dict[str, Any]],
        *,
        chunk: GenerationChunk | ChatGenerationChunk | None = None,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """Keep one streamed chunk of its call."""
        with self._lock:
            pieces = self._calls.get(run_id)
            if pieces is None:
                return
            message = getattr(chunk, "message", None)
            if isinstance(message, AIMessageChunk):
                pieces.append(message)
            else:
                pieces.append(AIMessageChunk(content=token if isinstance(token, str) else ""))

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """A finished call is the graph's to commit, not ours."""
        with self._lock:
            self._calls.pop(run_id, None)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """A call cut short: keep its text only when the error is the stop's cancellation."""
        if not isinstance(error, asyncio.CancelledError):
            with self._lock:
                self._calls.pop(run_id, None)

    def partial(self) -> AIMessage | None:
        """The text streamed by the newest unfinished call, as a stopped AIMessage."""
        with self._lock:
            calls = [list(pieces) for pieces in self._calls.values() if pieces]
        if not calls:
            return None
        first, *rest = calls[-1]
        last = add_ai_message_chunks(first, *rest) if rest else first
        text = last.text
        if not text.strip():
            return None
        meta = {k: v for k, v in last.response_metadata.items() if k != "finish_reason"}
        kwargs: dict[str, Any] = {}
        if last.id:
            kwargs["id"] = last.id
        # Text only: a half-streamed tool call has no complete arguments to run.
        return AIMessage(
            content=text,
            response_metadata={**meta, STOPPED_KEY: True},
            usage_metadata=last.usage_metadata,
            **kwargs,
        )
