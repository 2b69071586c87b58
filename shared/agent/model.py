"""The built-in deterministic chat model and the model factory (SPEC §9).

`BuiltinChatModel` is what the whole system runs and is tested with when no network
model is configured. It goes through the same code paths a provider model does:
token streaming (`_stream`/`_astream` yield `AIMessageChunk`s), a last chunk with
`usage_metadata` and `response_metadata`, `bind_tools`, and streamed tool calls.

Reply rule (every call, N = the `tokens` knob, exactly N whitespace-separated tokens):

    token 0..1   "(turn", "<k>)"     k = number of HumanMessages in the input
    token 2..    a head that depends on the situation (below)
    the rest     "t{i:04d}"         self-numbered filler, i = the token's position

The head is trimmed when it is longer than N - 2 tokens. Situations:

- the latest human message asks for an artifact (it contains one of the words
  write/writes, file/files, report/reports, artifact/artifacts, save/saves, case
  insensitive, as whole words), a tool named `write_artifact` is bound, tool_choice is
  not "none", and no `write_artifact` call was made after that human message yet:
  head "Writing artifact <filename>." and the last chunk also carries a tool call
  (`tool_call_chunks`, id `call_<number of AI messages so far>`) to `write_artifact`
  with args {"filename", "content"}. The filename is the first `name.ext` word of the
  request (ext one of md, txt, json, csv, html, py), else `report.md`.
- a ToolMessage answers that call: head "Saved artifact <path> (<size> bytes)." or
  "Could not save artifact: <error>".
- otherwise: head "You said: <the latest human message>".

Hidden context (SPEC C3, M2): a HumanMessage with `additional_kwargs[HIDDEN_KEY]` is a
block the runtime injected (memory, summary), not user input: it is not a turn and never
"the latest human message". The `- [preference] <text>` lines of such a block shape a
report artifact: a preference mentioning "conclusion first" puts the Conclusion section
before the Details, one mentioning RMB writes amounts in RMB; the report lists the
preferences it applied. With no preference the report is the plain one above.

Task prompts (the summary and memory-extraction calls; the `tokens` knob does not apply,
the delay does): a SystemMessage starting with `SUMMARY_TASK` gets a summary of the
`Human:`/`User:` lines (after those of a `Previous summary:` line) of the other messages,
blank when there are none; one starting with `EXTRACT_TASK` gets `{"facts": [...]}` JSON with one
`preference` fact per sentence of a `User:` line that states one ("I prefer ...",
"I like ...", "I want ...", "always ...").

Knobs, per call: `tokens` and `token_delay_ms` from `config["configurable"]` (the
config passed to invoke/stream, or the ambient one LangGraph sets for the running
node), else the model's fields, whose defaults are `Settings.builtin_tokens` and
`Settings.builtin_token_delay_ms`. The async path awaits `asyncio.sleep(delay)` per
token, even at 0, so a long reply never starves the event loop; the sync path sleeps
only when the delay is positive.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import generate_from_stream
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolCallChunk,
    ToolMessage,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, ensure_config
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

from shared.settings import Settings
from shared.vocab import EXTRACT_TASK, HIDDEN_KEY

MODEL_NAME = "threadrun-builtin"
ARTIFACT_TOOL = "write_artifact"
MAX_TOKENS = 20_000
MAX_TOKEN_DELAY_MS = 2_000.0
"""The knobs' bounds: a reply of at most ~11 h at the slowest pace (the worker's
`run_timeout_s` ends a run long before); they are test and demo knobs, not a way to hold
a worker slot for days."""
DEFAULT_ARTIFACT_NAME = "report.md"
SUMMARY_TASK = "[threadrun:summarize]"
SUMMARY_MAX_LINES = 10
SUMMARY_LINE_WORDS = 16

_ARTIFACT_REQUEST = re.compile(r"\b(?:write|file|report|artifact|save)s?\b", re.IGNORECASE)
_FILENAME = re.compile(r"\b([A-Za-z0-9][\w-]{0,63}\.(?:md|txt|json|csv|html|py))\b")
_KNOBS = ("tokens", "token_delay_ms")
_PREFERENCE = re.compile(
    r"\b(?:i (?:prefer|like|want|would like|need)|(?:please )?always)\b", re.IGNORECASE
)
_SENTENCE = re.compile(r"[^.!?;\n]+")
_KNOWN_FACT = re.compile(r"^- \[([0-9a-fA-F-]{36})\] \((\w+)\) (.+)$", re.MULTILINE)
_NOT_SUBJECT = frozenset(
    [
        "prefer",
        "like",
        "want",
        "would",
        "need",
        "please",
        "always",
        "actually",
        "instead",
        "rather",
        "that",
        "this",
        "with",
        "them",
        "they",
        "their",
        "your",
        "from",
        "have",
        "into",
        "should",
        "every",
        "wrong",
        "right",
    ]
)
_SAID_OPEN = 'The user said "'
_SAID_CLOSE = '".'


def token_filler(i: int) -> str:
    """The self-numbered filler token at position i of a reply."""
    return f"t{i:04d}"


def wants_artifact(text: str) -> bool:
    """Whether a human message asks for a file/report/artifact (the tool-call rule)."""
    return _ARTIFACT_REQUEST.search(text) is not None


@dataclass(frozen=True)
class PlannedToolCall:
    """A tool call the model will stream on its last chunk."""

    name: str
    args: dict[str, Any]
    id: str


@dataclass(frozen=True)
class ReplyPlan:
    """The exact tokens of the next reply and its tool call, if any."""

    words: list[str]
    tool_call: PlannedToolCall | None


def _pad(head: list[str], n: int) -> list[str]:
    words = head[:n]
    return words + [token_filler(i) for i in range(len(words), n)]


def _artifact_filename(request: str) -> str:
    match = _FILENAME.search(request)
    return match.group(1) if match else DEFAULT_ARTIFACT_NAME


def _artifact_outcome(result: ToolMessage) -> list[str]:
    if result.status == "error":
        return ["Could", "not", "save", "artifact:", *result.text.split()]
    try:
        info = json.loads(result.text)
        return ["Saved", "artifact", str(info["path"]), f"({int(info['size'])}", "bytes)."]
    except (ValueError, KeyError, TypeError):
        return ["Saved", "artifact:", *result.text.split()]


def is_hidden_block(message: BaseMessage) -> bool:
    """An injected context block (memory, summary), not user input."""
    return isinstance(message, HumanMessage) and bool(message.additional_kwargs.get(HIDDEN_KEY))


def _task(messages: Sequence[BaseMessage]) -> str | None:
    for m in messages:
        if isinstance(m, SystemMessage):
            for marker in (SUMMARY_TASK, EXTRACT_TASK):
                if m.text.startswith(marker):
                    return marker
    return None


def _lines(messages: Sequence[BaseMessage], *prefixes: str) -> list[str]:
    out = []
    for m in messages:
        if isinstance(m, SystemMessage):
            continue
        for line in m.text.splitlines():
            for prefix in prefixes:
                if line.startswith(prefix):
                    out.append(line[len(prefix) :].strip())
    return [line for line in out if line]


def said_sentences(text: str) -> list[str]:
    """What `re.findall(r'The user said "(.*?)"\\.', text)` finds, in linear time.

    Why not that regex: the text is a user's (a message can carry a `Previous summary:`
    line), and the lazy `.*?` rescans the rest of the line from every `The user said "`
    that has no `".` after it: 120 KB of them took ~5 s of CPU. Here each
    part of the text is searched at most twice: a sentence ends at the first `".` after its
    opening, never past a newline (the regex's `.`), and an opening with no `".` before the
    next newline lets the search go on after that newline.
    """
    out: list[str] = []
    pos, newline = 0, -1
    while (start := text.find(_SAID_OPEN, pos)) >= 0:
        start += len(_SAID_OPEN)
        if newline < start:
            newline = text.find("\n", start)
            if newline < 0:
                newline = len(text)
        end = text.find(_SAID_CLOSE, start, newline)
        if end < 0:
            pos = newline + 1
            continue
        out.append(text[start:end])
        pos = end + len(_SAID_CLOSE)
    return out


def builtin_summary(messages: Sequence[BaseMessage]) -> str:
    """The built-in model's summary of a summarization prompt ("" when nothing to say).

    One `The user said "<first words>".` sentence per user line, the previous summary's
    sentences first, the newest `SUMMARY_MAX_LINES` kept."""
    previous = _lines(messages, "Previous summary:")
    said = said_sentences(previous[-1]) if previous else []
    # maxsplit: only the first words are kept, so a long line is not split whole.
    said += [
        " ".join(s.split(maxsplit=SUMMARY_LINE_WORDS)[:SUMMARY_LINE_WORDS])
        for s in _lines(messages, "Human:", "User:")
    ]
    return " ".join(f'The user said "{s}".' for s in said[-SUMMARY_MAX_LINES:])


def _known_facts(messages: Sequence[BaseMessage]) -> list[tuple[str, str, str]]:
    """(id, category, content) of the `- [id] (category) content` lines of the prompt."""
    return [
        (m.group(1), m.group(2), m.group(3))
        for msg in messages
        if not isinstance(msg, SystemMessage)
        for m in _KNOWN_FACT.finditer(msg.text)
    ]


def _subject(text: str) -> set[str]:
    """The words that say what a preference is about (not how it is stated)."""
    return {w for w in re.findall(r"[a-z]{4,}", text.lower()) if w not in _NOT_SUBJECT}


def builtin_facts(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """The preferences the user stated, as extraction facts (deterministic).

    Under a `correction` signal a new preference replaces the known preferences that
    share a subject word with it ("I prefer reports with details first" replaces "I prefer
    reports with the conclusion first"), and of the preferences stated in the transcript
    only the latest on a subject is kept (the transcript repeats the earlier turns).
    """
    correction = any("signals:" in m.text and "correction" in m.text for m in messages)
    known = _known_facts(messages) if correction else []
    facts: list[dict[str, Any]] = []
    for line in _lines(messages, "User:", "Human:"):
        for sentence in _SENTENCE.findall(line):
            text = " ".join(sentence.split())
            if _PREFERENCE.search(text) and text not in [f["content"] for f in facts]:
                confidence = 0.95 if correction else 0.9
                replaces = [
                    fid
                    for fid, category, content in known
                    if category == "preference"
                    and content != text
                    and _subject(content) & _subject(text)
                ]
                if correction:
                    facts = [f for f in facts if not _subject(f["content"]) & _subject(text)]
                facts.append(
                    {
                        "category": "preference",
                        "content": text,
                        "confidence": confidence,
                        "replaces": replaces,
                    }
                )
    return facts


def _preferences(hidden: Sequence[BaseMessage]) -> list[str]:
    return [
        line.removeprefix("- [preference]").strip()
        for m in hidden
        for line in m.text.splitlines()
        if line.startswith("- [preference]")
    ]


def _report(filename: str, request: str, turn: int, prefs: list[str]) -> str:
    signature = f"Written by {MODEL_NAME} on turn {turn}.\n"
    if not prefs:
        return f"# {filename}\n\nRequest: {request}\n\n{signature}"
    joined = " ".join(prefs).lower()
    currency = "RMB" if re.search(r"\b(?:rmb|cny|yuan)\b", joined) else "USD"
    conclusion = "## Conclusion\n\nThe request is answered below.\n"
    details = f"## Details\n\nAmount: {currency} 1,000.00\n"
    body = [conclusion, details] if "conclusion first" in joined else [details, conclusion]
    applied = "; ".join(prefs)
    return (
        f"# {filename}\n\nRequest: {request}\nPreferences applied: {applied}\n\n"
        + "\n".join(body)
        + f"\n{signature}"
    )


def plan_reply(
    messages: Sequence[BaseMessage], n: int, tool_names: Sequence[str], tool_choice: Any = None
) -> ReplyPlan:
    """Decide the words (and the tool call, if any) of the next reply; pure, no IO."""
    task = _task(messages)
    if task == SUMMARY_TASK:
        return ReplyPlan(builtin_summary(messages).split(" "), None)
    if task == EXTRACT_TASK:
        return ReplyPlan(json.dumps({"facts": builtin_facts(messages)}).split(" "), None)
    hidden = [m for m in messages if is_hidden_block(m)]
    messages = [m for m in messages if not is_hidden_block(m)]
    human_at = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    turn = len(human_at)
    request = messages[human_at[-1]].text if human_at else ""
    this_turn = messages[human_at[-1] + 1 :] if human_at else messages
    prefix = ["(turn", f"{turn})"]

    calls = {
        tc["id"]
        for m in this_turn
        if isinstance(m, AIMessage)
        for tc in m.tool_calls
        if tc["name"] == ARTIFACT_TOOL
    }
    results = [m for m in this_turn if isinstance(m, ToolMessage) and m.tool_call_id in calls]
    if results:
        return ReplyPlan(_pad(prefix + _artifact_outcome(results[-1]), n), None)

    if (
        not calls
        and ARTIFACT_TOOL in tool_names
        and tool_choice != "none"
        and wants_artifact(request)
    ):
        filename = _artifact_filename(request)
        content = _report(filename, request, turn, _preferences(hidden))
        n_ai = sum(1 for m in messages if isinstance(m, AIMessage))
        call = PlannedToolCall(
            ARTIFACT_TOOL, {"filename": filename, "content": content}, f"call_{n_ai}"
        )
        return ReplyPlan(_pad([*prefix, "Writing", "artifact", f"{filename}."], n), call)

    return ReplyPlan(_pad([*prefix, "You", "said:", *request.split()], n), None)


def _tool_names(tools: Any) -> list[str]:
    names: list[str] = []
    for spec in tools or []:
        if isinstance(spec, Mapping):
            fn = spec.get("function")
            name = fn.get("name") if isinstance(fn, Mapping) else spec.get("name")
            if isinstance(name, str):
                names.append(name)
    return names


def _tokens_knob(value: Any) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"tokens must be an integer, got {value!r}") from None
    if not 1 <= n <= MAX_TOKENS:
        raise ValueError(f"tokens must be between 1 and {MAX_TOKENS}, got {n}")
    return n


def _delay_ms_knob(value: Any) -> float:
    try:
        ms = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"token_delay_ms must be a number, got {value!r}") from None
    if not 0 <= ms <= MAX_TOKEN_DELAY_MS:
        raise ValueError(f"token_delay_ms must be between 0 and {MAX_TOKEN_DELAY_MS}, got {ms}")
    return ms


def _configurable_knobs(config: RunnableConfig | None) -> dict[str, Any]:
    configurable = ensure_config(config).get("configurable") or {}
    return {k: configurable[k] for k in _KNOBS if configurable.get(k) is not None}


class BuiltinChatModel(BaseChatModel):
    """Deterministic, offline chat model that streams tokens and calls tools like a real one."""

    tokens: int = Field(default=Settings.model_fields["builtin_tokens"].default, ge=1)
    token_delay_ms: float = Field(
        default=Settings.model_fields["builtin_token_delay_ms"].default, ge=0
    )

    @property
    def _llm_type(self) -> str:
        return MODEL_NAME

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": MODEL_NAME,
            "tokens": self.tokens,
            "token_delay_ms": self.token_delay_ms,
        }

    # --- knobs: the run's config reaches the model here ---------------------------------

    def _with_knobs(self, config: RunnableConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Call kwargs plus the knobs of `config` (explicit kwargs win)."""
        return {**_configurable_knobs(config), **kwargs}

    def invoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        """Invoke, with the knobs of `config` applied."""
        return super().invoke(input, config, stop=stop, **self._with_knobs(config, kwargs))

    async def ainvoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        """Invoke asynchronously, with the knobs of `config` applied."""
        return await super().ainvoke(input, config, stop=stop, **self._with_knobs(config, kwargs))

    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        """Stream, with the knobs of `config` applied."""
        yield from super().stream(input, config, stop=stop, **self._with_knobs(config, kwargs))

    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        """Stream asynchronously, with the knobs of `config` applied."""
        knobs = self._with_knobs(config, kwargs)
        async for chunk in super().astream(input, config, stop=stop, **knobs):
            yield chunk

    # --- tools -------------------------------------------------------------------------

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools the way provider models do: as OpenAI-format `tools` call kwargs."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)

    # --- generation --------------------------------------------------------------------

    def _chunks(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> list[AIMessageChunk]:
        n = _tokens_knob(kwargs.get("tokens", self.tokens))
        plan = plan_reply(messages, n, _tool_names(kwargs.get("tools")), kwargs.get("tool_choice"))
        input_tokens = sum(len(m.text.split()) for m in messages)
        chunks = [
            AIMessageChunk(content=word if i == 0 else f" {word}")
            for i, word in enumerate(plan.words)
        ]
        tool_call_chunks: list[ToolCallChunk] = []
        if plan.tool_call is not None:
            tool_call_chunks.append(
                ToolCallChunk(
                    name=plan.tool_call.name,
                    args=json.dumps(plan.tool_call.args),
                    id=plan.tool_call.id,
                    index=0,
                )
            )
        chunks[-1] = AIMessageChunk(
            content=chunks[-1].content,
            tool_call_chunks=tool_call_chunks,
            usage_metadata=UsageMetadata(
                input_tokens=input_tokens,
                output_tokens=len(plan.words),
                total_tokens=input_tokens + len(plan.words),
            ),
            response_metadata={
                "finish_reason": "tool_calls" if plan.tool_call else "stop",
                "model_name": MODEL_NAME,
            },
            chunk_position="last",
        )
        return chunks

    def _delay_s(self, kwargs: dict[str, Any]) -> float:
        return _delay_ms_knob(kwargs.get("token_delay_ms", self.token_delay_ms)) / 1000.0

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # BaseChatModel reports each token to the callbacks (on_llm_new_token) itself.
        delay = self._delay_s(kwargs)
        for chunk in self._chunks(messages, kwargs):
            if delay > 0:
                time.sleep(delay)
            yield ChatGenerationChunk(message=chunk)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        delay = self._delay_s(kwargs)
        for chunk in self._chunks(messages, kwargs):
            await asyncio.sleep(delay)
            yield ChatGenerationChunk(message=chunk)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return generate_from_stream(self._stream(messages, stop, **kwargs))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        chunks = [c async for c in self._astream(messages, stop, **kwargs)]
        return generate_from_stream(iter(chunks))


def make_model(settings: Settings, config: RunnableConfig | None = None) -> BaseChatModel:
    """The chat model `settings.model` names; `config` knobs set the built-in model's defaults."""
    if settings.model == "builtin":
        fields: dict[str, Any] = {
            "tokens": settings.builtin_tokens,
            "token_delay_ms": settings.builtin_token_delay_ms,
        }
        fields.update(_configurable_knobs(config) if config is not None else {})
        return BuiltinChatModel(
            tokens=_tokens_knob(fields["tokens"]),
            token_delay_ms=_delay_ms_knob(fields["token_delay_ms"]),
        )

    from langchain.chat_models import init_chat_model

    from shared.agent.providers import ModelConfigError, check_model, parse_model_id
    from shared.agent.retrying import RetryingChatModel, RetryPolicy

    # A per-request timeout and no retries of the client's own: ours (shared/agent/
    # retrying.py) count the attempts the provider really received, add a first-byte
    # timeout and tell the run's stream while they wait; a failing endpoint ends the run
    # with a typed error (shared/model_errors.py) instead of hanging it.
    options: dict[str, Any] = {"timeout": settings.model_timeout_s, "max_retries": 0}
    if parse_model_id(settings.model)[0] in ("openai", "azure_openai"):
        # Usage in the last streamed chunk (stream_options.include_usage): ChatOpenAI
        # turns it off by itself when a base URL is set, and the journal records it.
        options["stream_usage"] = True
    if settings.model_base_url:
        options["base_url"] = settings.model_base_url
    if settings.model_api_key is not None and settings.model_api_key.get_secret_value():
        options["api_key"] = settings.model_api_key.get_secret_value()
    try:
        model: BaseChatModel = init_chat_model(settings.model, **options)
    except ImportError as exc:
        problem = check_model("THREADRUN_MODEL", settings.model, settings)
        raise ModelConfigError(problem or f"model {settings.model!r}: {exc}") from exc
    return RetryingChatModel(inner=model, policy=RetryPolicy.of(settings))
