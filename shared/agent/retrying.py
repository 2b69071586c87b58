"""Honest waiting on a provider model: our retries, a first-byte timeout, progress events.

`make_model` (shared/agent/model.py) wraps every provider model in `RetryingChatModel`
and turns the client's own retries off (`max_retries=0`), so that the number of attempts
the run reports is the number of requests the provider received.

One model call (`astream`/`ainvoke`, and so every call `create_agent` makes) is:

- attempt k of n = THREADRUN_MODEL_MAX_RETRIES + 1 sends the request and waits for its
  first streamed chunk, at most THREADRUN_MODEL_FIRST_BYTE_TIMEOUT_S (a provider that
  hangs raises `FirstByteTimeout`, shared/model_errors.py);
- a failure before that first chunk that is worth another attempt (`is_retryable`:
  408/409/429/5xx, a timeout, a connection error) waits `RetryPolicy.backoff(k)`
  (THREADRUN_MODEL_RETRY_BACKOFF_S doubled per retry, at least the answer's Retry-After,
  at most THREADRUN_MODEL_RETRY_BACKOFF_MAX_S) and tries again; any other failure, or
  the last attempt's, raises `ModelCallFailed` (its cause the attempt's error), which
  `describe_model_error` turns into the run's `error` record with the attempts made;
- once the first chunk is in, the answer streams as it comes: a failure mid-answer is
  not retried (its tokens are already on the run's stream; a second answer would be
  glued to them), it ends the call with `ModelCallFailed(mid_stream=True)`; a stall
  mid-answer is the client's per-read timeout (THREADRUN_MODEL_TIMEOUT_S).

While it waits the call writes `custom` stream events (LangGraph's stream writer, so
they reach the run's Redis Stream like every event and a client that asked for the
`custom` mode sees them):

    {"kind": "model_wait", "state": "waiting" | "retrying" | "answering" | "failed",
     "attempt": k, "of": n, "waited_s": <seconds since the call began>,
     "cause": <short cause of the last failure, e.g. "HTTP 500"> | None,
     "retry_in_s": <backoff, on "retrying" only>}

`waiting` when attempt k is sent and again every THREADRUN_MODEL_WAIT_HEARTBEAT_S until
it answers, `retrying` when an attempt failed and the next one is due in `retry_in_s`,
`answering` at its first chunk, `failed` when the call gives up. Outside a graph (the
memory worker) there is no stream and nothing is written.

Why not LangChain's `with_retry` or its `ModelRetryMiddleware`: both retry the whole
call, so a failure after tokens were streamed would stream a second answer after the
first, neither has a first-byte timeout, and `with_retry` returns a Runnable that
`create_agent` cannot bind tools to. The policy itself is tenacity's (`AsyncRetrying`,
`stop_after_attempt`, `retry_if_exception`, `before_sleep`), which `with_retry` uses too.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import generate_from_stream
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolCallChunk
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
)

from shared.model_errors import (
    FirstByteTimeout,
    ModelCallFailed,
    is_model_failure,
    is_retryable,
    retry_after_s,
    short_cause,
)
from shared.settings import Settings

__all__ = ["WAIT_KIND", "RetryPolicy", "RetryingChatModel", "wait_event"]

WAIT_KIND = "model_wait"
"""The `kind` of the custom events a waiting model call writes."""

Writer = Callable[[Any], None]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently one model call is tried (Settings.model_*)."""

    retries: int
    backoff_s: float
    backoff_max_s: float
    first_byte_timeout_s: float
    heartbeat_s: float

    @classmethod
    def of(cls, settings: Settings) -> RetryPolicy:
        """The policy the settings give."""
        return cls(
            retries=settings.model_max_retries,
            backoff_s=settings.model_retry_backoff_s,
            backoff_max_s=settings.model_retry_backoff_max_s,
            first_byte_timeout_s=settings.model_first_byte_timeout_s,
            heartbeat_s=settings.model_wait_heartbeat_s,
        )

    @property
    def attempts(self) -> int:
        """The most attempts one call makes (the first and its retries)."""
        return self.retries + 1

    def backoff(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number `retry` (1 = the second attempt):
        base × 2^(retry-1), at least what the failed answer's Retry-After asked, never
        more than the max (exponential in the retry, so never decreasing)."""
        exponent = min(max(retry - 1, 0), 60)  # 2**60 s is past any cap already
        wait = self.backoff_s * float(2**exponent)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return min(wait, self.backoff_max_s)

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        after = retry_after_s(exc) if exc is not None else None
        return self.backoff(state.attempt_number, after)

    def retrying(self, before_sleep: Callable[[RetryCallState], Any]) -> AsyncRetrying:
        """tenacity's loop over the attempts of one call."""
        return AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=self._wait,
            retry=retry_if_exception(is_retryable),
            before_sleep=before_sleep,
            reraise=True,
        )

    def retrying_sync(self) -> Retrying:
        """The same, for the blocking path."""
        return Retrying(
            stop=stop_after_attempt(self.attempts),
            wait=self._wait,
            retry=retry_if_exception(is_retryable),
            reraise=True,
        )


def wait_event(
    state: str, attempt: int, of: int, waited_s: float, cause: str | None, **extra: Any
) -> dict[str, Any]:
    """One `model_wait` custom event (the shape documented above)."""
    return {
        "kind": WAIT_KIND,
        "state": state,
        "attempt": attempt,
        "of": of,
        "waited_s": round(waited_s, 1),
        "cause": cause,
        **extra,
    }


def _stream_writer() -> Writer | None:
    """The running graph node's stream writer; None outside a graph."""
    from langgraph.config import get_stream_writer

    try:
        writer: Writer = get_stream_writer()
    except (RuntimeError, KeyError, TypeError):
        return None
    return writer


class _Progress:
    """The `model_wait` events of one call."""

    def __init__(self, policy: RetryPolicy, writer: Writer | None) -> None:
        self.of = policy.attempts
        self.heartbeat_s = policy.heartbeat_s
        self.started = time.monotonic()
        self.writer = writer
        self.cause: str | None = None

    def emit(self, state: str, attempt: int, **extra: Any) -> None:
        if self.writer is None:
            return
        waited = time.monotonic() - self.started
        self.writer(wait_event(state, attempt, self.of, waited, self.cause, **extra))

    async def beat(self, attempt: int) -> None:
        """`waiting` now and every heartbeat until cancelled (the attempt answered)."""
        while True:
            self.emit("waiting", attempt)
            await asyncio.sleep(self.heartbeat_s)


def _endpoint_host(model: BaseChatModel) -> str | None:
    """host:port of a provider model's endpoint, when it has a base URL we can see."""
    for attr in ("openai_api_base", "base_url", "anthropic_api_url", "azure_endpoint"):
        url = getattr(model, attr, None)
        if isinstance(url, str) and url:
            parts = urlsplit(url)
            if parts.hostname:
                return f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname
    return None


def _as_chunk(message: BaseMessage) -> ChatGenerationChunk:
    """A whole AI message (a model that does not stream) as one chunk."""
    calls = message.tool_calls if isinstance(message, AIMessage) else []
    chunk = AIMessageChunk(
        content=message.content,
        additional_kwargs=message.additional_kwargs,
        response_metadata=message.response_metadata,
        id=message.id,
        usage_metadata=message.usage_metadata if isinstance(message, AIMessage) else None,
        tool_call_chunks=[
            ToolCallChunk(name=c["name"], args=json.dumps(c["args"]), id=c["id"], index=i)
            for i, c in enumerate(calls)
        ],
    )
    return ChatGenerationChunk(message=chunk)


class RetryingChatModel(BaseChatModel):
    """A provider chat model, tried by `policy` (see the module's docstring)."""

    inner: BaseChatModel
    policy: RetryPolicy

    @property
    def _llm_type(self) -> str:
        return self.inner._llm_type

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return dict(self.inner._identifying_params)

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        return self.inner._get_ls_params(stop=stop, **kwargs)

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The inner model's tool binding (its format and options), applied to this one."""
        bound = self.inner.bind_tools(tools, tool_choice=tool_choice, **kwargs)
        return self.bind(**getattr(bound, "kwargs", {}))

    # --- the inner model's stream -------------------------------------------------------

    def _streams(self) -> bool:
        cls = type(self.inner)
        return (
            cls._astream is not BaseChatModel._astream or cls._stream is not BaseChatModel._stream
        )

    async def _generated(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> AsyncIterator[ChatGenerationChunk]:
        result = await self.inner._agenerate(messages, stop=stop, **kwargs)
        for generation in result.generations:
            yield _as_chunk(generation.message)

    def _inner_astream(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> AsyncIterator[ChatGenerationChunk]:
        # No run manager: the callbacks (tokens, errors) are this model's, once per call.
        if self._streams():
            return self.inner._astream(messages, stop=stop, **kwargs)
        return self._generated(messages, stop, kwargs)

    async def _first_chunk(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
        progress: _Progress,
        attempt: int,
    ) -> tuple[AsyncIterator[ChatGenerationChunk], ChatGenerationChunk | None]:
        """Send attempt `attempt` and wait for its first chunk (None: an empty answer)."""
        stream = self._inner_astream(messages, stop, kwargs)
        beat = asyncio.create_task(progress.beat(attempt))
        limit = asyncio.timeout(self.policy.first_byte_timeout_s)
        try:
            async with limit:
                first = await anext(aiter(stream))
        except StopAsyncIteration:
            return stream, None
        except TimeoutError:
            await _close(stream)
            if not limit.expired():
                raise
            raise FirstByteTimeout(
                self.policy.first_byte_timeout_s, _endpoint_host(self.inner)
            ) from None
        except BaseException:
            await _close(stream)
            raise
        finally:
            beat.cancel()
            with suppress(asyncio.CancelledError):
                await beat
        return stream, first

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        progress = _Progress(self.policy, _stream_writer())
        attempt = 0

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            progress.cause = short_cause(exc) if exc is not None else None
            wait = state.upcoming_sleep
            progress.emit("retrying", state.attempt_number + 1, retry_in_s=round(wait, 2))

        try:
            async for trying in self.policy.retrying(before_sleep):
                with trying:
                    attempt = trying.retry_state.attempt_number
                    stream, first = await self._first_chunk(
                        messages, stop, kwargs, progress, attempt
                    )
        except Exception as exc:
            if not is_model_failure(exc):
                raise  # not the provider failing (a bad argument, ...): as it is
            progress.cause = short_cause(exc)
            progress.emit("failed", attempt)
            raise ModelCallFailed(
                progress.cause, attempts=attempt, of=self.policy.attempts
            ) from exc
        progress.emit("answering", attempt)
        if first is None:
            return
        try:
            yield first
            async for chunk in stream:
                yield chunk
        except Exception as exc:
            if not is_model_failure(exc):
                raise
            progress.cause = short_cause(exc)
            progress.emit("failed", attempt)
            raise ModelCallFailed(
                progress.cause, attempts=attempt, of=self.policy.attempts, mid_stream=True
            ) from exc
        finally:
            await _close(stream)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        chunks = [c async for c in self._astream(messages, stop, **kwargs)]
        return generate_from_stream(iter(chunks))

    # --- the blocking path (the memory worker): retries, no first-byte timeout, no events

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        attempt = 0
        try:
            for trying in self.policy.retrying_sync():
                with trying:
                    attempt = trying.retry_state.attempt_number
                    result = self.inner._generate(messages, stop=stop, **kwargs)
        except Exception as exc:
            if not is_model_failure(exc):
                raise
            cause = short_cause(exc)
            raise ModelCallFailed(cause, attempts=attempt, of=self.policy.attempts) from exc
        for generation in result.generations:
            yield _as_chunk(generation.message)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return generate_from_stream(self._stream(messages, stop, **kwargs))


async def _close(stream: AsyncIterator[Any]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with suppress(Exception):
            await aclose()
