"""The built-in deterministic chat model and the model factory."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from pydantic import SecretStr

from shared.agent.model import (
    MODEL_NAME,
    BuiltinChatModel,
    make_model,
    plan_reply,
    token_filler,
    wants_artifact,
)
from shared.agent.providers import ModelConfigError
from shared.settings import Settings


@tool
def write_artifact(filename: str, content: str) -> str:
    """Save a file."""
    return json.dumps({"path": f"outputs/{filename}", "size": len(content)})


def knobs(**values: Any) -> RunnableConfig:
    return RunnableConfig(configurable=values)


async def collect(
    model: Any, messages: list[BaseMessage], config: RunnableConfig | None = None
) -> list[AIMessageChunk]:
    return [chunk async for chunk in model.astream(messages, config)]


def merged(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return total


def test_streams_exactly_n_tokens_with_usage_on_the_last_chunk() -> None:
    model = BuiltinChatModel()
    chunks = asyncio.run(collect(model, [HumanMessage("hello there")], knobs(tokens=30)))

    assert len(chunks) == 30
    assert all(len(str(c.content).split()) == 1 for c in chunks)
    assert len("".join(str(c.content) for c in chunks).split()) == 30
    assert all(c.usage_metadata is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.usage_metadata == {"input_tokens": 2, "output_tokens": 30, "total_tokens": 32}
    assert last.response_metadata["finish_reason"] == "stop"
    assert last.response_metadata["model_name"] == MODEL_NAME
    assert last.chunk_position == "last"


def test_reply_references_the_message_and_pads_with_self_numbered_tokens() -> None:
    model = BuiltinChatModel(tokens=10)
    words = model.invoke([HumanMessage("hello there")]).text.split()

    assert words[:6] == ["(turn", "1)", "You", "said:", "hello", "there"]
    assert (
        words[6:] == [token_filler(i) for i in range(6, 10)] == ["t0006", "t0007", "t0008", "t0009"]
    )


def test_a_long_message_is_trimmed_to_n_tokens() -> None:
    model = BuiltinChatModel()
    reply = model.invoke([HumanMessage("word " * 50)], knobs(tokens=5))
    assert reply.text.split() == ["(turn", "1)", "You", "said:", "word"]


def test_turn_counts_the_human_messages_of_the_thread() -> None:
    history: list[BaseMessage] = [
        SystemMessage("be brief"),
        HumanMessage("one"),
        AIMessage("ok"),
        HumanMessage("two"),
    ]
    assert BuiltinChatModel(tokens=8).invoke(history).text.startswith("(turn 2) You said: two")


def test_field_defaults_come_from_settings() -> None:
    model = BuiltinChatModel()
    assert model.tokens == Settings.model_fields["builtin_tokens"].default
    assert model.token_delay_ms == Settings.model_fields["builtin_token_delay_ms"].default
    assert len(model.invoke([HumanMessage("hi")]).text.split()) == model.tokens


def test_config_knobs_override_fields_and_accept_strings() -> None:
    model = BuiltinChatModel(tokens=3)
    assert len(model.invoke([HumanMessage("hi")], knobs(tokens="12")).text.split()) == 12
    assert len(list(model.stream([HumanMessage("hi")], knobs(tokens=4)))) == 4
    assert len(model.invoke([HumanMessage("hi")]).text.split()) == 3


@pytest.mark.parametrize(
    "bad",
    [
        {"tokens": 0},
        {"tokens": 10**6},
        {"tokens": "many"},
        {"token_delay_ms": -1},
        {"token_delay_ms": float("inf")},
    ],
)
def test_bad_knobs_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        BuiltinChatModel().invoke([HumanMessage("hi")], knobs(**bad))


def test_deterministic_and_every_path_gives_the_same_message() -> None:
    model = BuiltinChatModel(tokens=9)
    messages: list[BaseMessage] = [HumanMessage("same input")]

    sync_stream = merged(list(model.stream(messages)))
    async_stream = merged(asyncio.run(collect(model, messages)))
    sync_invoke = model.invoke(messages)
    async_invoke = asyncio.run(model.ainvoke(messages))

    for message in (async_stream, sync_invoke, async_invoke, model.invoke(messages)):
        assert message.content == sync_stream.content
        assert message.usage_metadata == sync_stream.usage_metadata
        assert message.response_metadata == sync_stream.response_metadata
        assert message.tool_calls == sync_stream.tool_calls == []


def test_tool_call_then_final_answer() -> None:
    model = BuiltinChatModel(tokens=8).bind_tools([write_artifact])
    history: list[BaseMessage] = [HumanMessage("Please write a report to notes.md")]

    chunks = asyncio.run(collect(model, history))
    assert len(chunks) == 8
    assert all(not c.tool_call_chunks for c in chunks[:-1])
    (call_chunk,) = chunks[-1].tool_call_chunks
    assert call_chunk["name"] == "write_artifact"
    assert call_chunk["id"] == "call_0"
    assert chunks[-1].response_metadata["finish_reason"] == "tool_calls"
    first = merged(chunks)
    (call,) = first.tool_calls
    assert call["args"]["filename"] == "notes.md"
    assert "Please write a report to notes.md" in call["args"]["content"]
    assert asyncio.run(model.ainvoke(history)).tool_calls == first.tool_calls

    result = write_artifact.invoke(call["args"])
    history += [
        AIMessage(content=first.content, tool_calls=first.tool_calls),
        ToolMessage(result, tool_call_id=call["id"], name="write_artifact"),
    ]
    final = asyncio.run(model.ainvoke(history))
    assert final.tool_calls == []
    assert final.response_metadata["finish_reason"] == "stop"
    assert final.text.startswith("(turn 1) Saved artifact outputs/notes.md (")
    assert len(final.text.split()) == 8


def test_a_failed_tool_call_is_reported_not_retried() -> None:
    model = BuiltinChatModel(tokens=12).bind_tools([write_artifact])
    call = {"name": "write_artifact", "args": {"filename": "x", "content": "y"}, "id": "call_0"}
    history: list[BaseMessage] = [
        HumanMessage("save a file"),
        AIMessage(content="", tool_calls=[call]),
        ToolMessage("disk full", tool_call_id="call_0", status="error"),
    ]
    final = model.invoke(history)
    assert final.tool_calls == []
    assert final.text.startswith("(turn 1) Could not save artifact: disk full")


def test_no_tool_call_without_the_tool_or_with_tool_choice_none() -> None:
    request: list[BaseMessage] = [HumanMessage("write a report")]
    assert BuiltinChatModel().invoke(request).tool_calls == []
    bound = BuiltinChatModel().bind_tools([write_artifact], tool_choice="none")
    assert bound.invoke(request).tool_calls == []


def test_call_ids_are_deterministic_per_thread() -> None:
    history: list[BaseMessage] = [HumanMessage("hi"), AIMessage("hello"), HumanMessage("save it")]
    plan = plan_reply(history, 6, ["write_artifact"])
    assert plan.tool_call is not None
    assert plan.tool_call.id == "call_1"
    assert plan.tool_call.args["filename"] == "report.md"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("write me something", True),
        ("Save the REPORTS", True),
        ("an artifact please", True),
        ("open the file", True),
        ("what is your profile", False),
        ("hello", False),
        ("rewrite history", False),
    ],
)
def test_artifact_request_rule(text: str, expected: bool) -> None:
    assert wants_artifact(text) is expected


def test_token_delay_applies_in_sync_and_async_paths() -> None:
    model = BuiltinChatModel(tokens=5)
    config = knobs(token_delay_ms=20)

    started = time.perf_counter()
    assert len(list(model.stream([HumanMessage("hi")], config))) == 5
    assert time.perf_counter() - started >= 0.09

    started = time.perf_counter()
    assert len(asyncio.run(collect(model, [HumanMessage("hi")], config))) == 5
    assert time.perf_counter() - started >= 0.09


def test_async_streaming_yields_to_the_event_loop_at_zero_delay() -> None:
    async def scenario() -> tuple[int, int]:
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        chunks = await collect(BuiltinChatModel(tokens=200, token_delay_ms=0), [HumanMessage("hi")])
        done = True
        await task
        return len(chunks), ticks

    n, ticks = asyncio.run(scenario())
    assert n == 200
    assert ticks >= 100


def test_make_model_builtin_uses_settings_and_config_knobs() -> None:
    settings = Settings(builtin_tokens=7, builtin_token_delay_ms=1.5)
    model = make_model(settings)
    assert isinstance(model, BuiltinChatModel)
    assert (model.tokens, model.token_delay_ms) == (7, 1.5)

    tuned = make_model(settings, knobs(tokens=3, token_delay_ms=0))
    assert isinstance(tuned, BuiltinChatModel)
    assert (tuned.tokens, tuned.token_delay_ms) == (3, 0.0)


def test_make_model_passes_endpoint_and_key_only_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    import langchain.chat_models

    seen: list[tuple[str, dict[str, Any]]] = []
    sentinel = BuiltinChatModel()

    def fake_init(model: str, **kwargs: Any) -> BuiltinChatModel:
        seen.append((model, kwargs))
        return sentinel

    monkeypatch.setattr(langchain.chat_models, "init_chat_model", fake_init)
    wrapped = make_model(Settings(model="openai:gpt-4o-mini"))
    assert getattr(wrapped, "inner", None) is sentinel  # tried by our retries (retrying.py)
    make_model(
        Settings(
            model="openai:gpt-4o-mini",
            model_base_url="http://llm:8000/v1",
            model_api_key=SecretStr("sk-x"),
        )
    )
    bounded = {"timeout": 60.0, "max_retries": 0, "stream_usage": True}  # the client's: off
    assert seen == [
        ("openai:gpt-4o-mini", bounded),
        (
            "openai:gpt-4o-mini",
            {**bounded, "base_url": "http://llm:8000/v1", "api_key": "sk-x"},
        ),
    ]


def test_make_model_names_the_missing_provider_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing provider package names the package and the one install command."""
    import langchain.chat_models

    def missing(model: str, **kwargs: Any) -> BuiltinChatModel:
        raise ImportError("No module named 'langchain_anthropic'", name="langchain_anthropic")

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(langchain.chat_models, "init_chat_model", missing)
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "langchain_anthropic" else real_find_spec(name, *a),
    )
    with pytest.raises(
        ModelConfigError, match=r"langchain-anthropic.*make install EXTRAS=anthropic"
    ):
        make_model(Settings(model="anthropic:claude-sonnet-4-5"))
