"""Pure memory decisions (M4, M5) and the built-in model's extraction and report rules."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from shared.agent.model import BuiltinChatModel, plan_reply
from shared.memory.base import (
    MemoryUpdate,
    Signal,
    content_hash,
    detect_signals,
    keep_for_memory,
    merge_updates,
    render_memory,
)
from shared.memory.extraction import ExtractionFailed, extract_facts, parse_facts
from shared.vocab import EXTRACT_TASK


def update(msgs: list[tuple[str, str]], **kw: object) -> MemoryUpdate:
    return MemoryUpdate(
        "agent",
        "u",
        "t",
        [{"id": i, "role": "user", "content": c} for i, c in msgs],
        **kw,  # type: ignore[arg-type]
    )


def test_m4_keep_for_memory_drops_tool_turns_and_hidden_blocks_and_caps() -> None:
    msgs = [
        HumanMessage("<memory>", id="m", additional_kwargs={"threadrun_hidden": "x"}),
        HumanMessage("q1", id="h1"),
        AIMessage("", id="c", tool_calls=[{"name": "t", "args": {}, "id": "1"}]),
        AIMessage("a1", id="a1"),
        HumanMessage("q2", id="h2"),
    ]
    assert [m["id"] for m in keep_for_memory(msgs, 10)] == ["h1", "a1", "h2"]
    assert [m["id"] for m in keep_for_memory(msgs, 2)] == ["a1", "h2"]


@pytest.mark.parametrize(
    ("text", "signals"),
    [
        ("No, that's wrong: I prefer tea", [Signal.CORRECTION]),
        ("Exactly, keep doing that", [Signal.REINFORCEMENT]),
        ("Tell me about tea", []),
    ],
)
def test_m4_signals(text: str, signals: list[str]) -> None:
    assert detect_signals([{"id": "1", "role": "user", "content": text}]) == signals


def test_m4_merge_latest_wins_messages_merged_by_id() -> None:
    a = update([("1", "x"), ("2", "y")], trace_id="r1", signals=["correction"])
    b = update([("2", "y"), ("3", "z")], trace_id="r2", urgent=True)
    merged = merge_updates([a, b], 10)
    assert [m["id"] for m in merged.messages] == ["1", "2", "3"]
    assert merged.trace_id == "r2" and merged.urgent and merged.signals == ["correction"]
    assert merged.merged == 2 and merged.priority
    assert MemoryUpdate.from_json(merged.as_json()) == merged


def test_m1_fact_identity_ignores_case_space_and_end_punctuation() -> None:
    assert content_hash("I  prefer tea.") == content_hash("i prefer tea")
    assert render_memory([]) == ""


def test_m4_builtin_model_extracts_stated_preferences_deterministically() -> None:
    u = update(
        [
            ("1", "Hello. I prefer reports in bullet points; the weather is nice"),
            ("2", "Always answer in French!"),
        ]
    )
    facts = extract_facts(BuiltinChatModel(), u)
    assert [(f.category, f.content) for f in facts] == [
        ("preference", "I prefer reports in bullet points"),
        ("preference", "Always answer in French"),
    ]
    assert extract_facts(BuiltinChatModel(), update([("1", "what time is it")])) == []


def test_m4_replaces_only_ids_the_extractor_was_shown() -> None:
    """M4: a `replaces` id that is not one of the user's known facts is dropped."""
    known = "11111111-1111-4111-8111-111111111111"
    answer = (
        '{"facts": [{"content": "c", "category": "preference", "replaces": '
        f'["{known}", "22222222-2222-4222-8222-222222222222"]}}]}}'
    )
    assert parse_facts(answer, [known])[0].replaces == (known,)
    assert parse_facts(answer)[0].replaces == ()
    with pytest.raises(ExtractionFailed):
        parse_facts('{"facts": [{"content": "c", "replaces": "x"}]}')


def test_m4_extraction_answer_must_be_facts_json() -> None:
    with pytest.raises(ExtractionFailed):
        parse_facts("sure! here are the facts")
    assert (
        parse_facts('```json\n{"facts": [{"content": " x ", "category": "fact"}]}\n```')[0].content
        == "x"
    )


def test_builtin_task_replies_ignore_the_tokens_knob() -> None:
    prompt = [SystemMessage(EXTRACT_TASK), HumanMessage("User: I like jazz")]
    plan = plan_reply(prompt, 3, [])
    assert json.loads(" ".join(plan.words))["facts"][0]["content"] == "I like jazz"


def test_m2_builtin_report_follows_injected_preferences_only() -> None:
    hidden = HumanMessage(
        "<memory>\n- [preference] conclusion first, amounts in RMB\n</memory>",
        additional_kwargs={"threadrun_hidden": "durable_context"},
    )
    ask = HumanMessage("write a report")
    with_pref = plan_reply([hidden, ask], 8, ["write_artifact"])
    plain = plan_reply([ask], 8, ["write_artifact"])
    assert with_pref.words[:2] == plain.words[:2] == ["(turn", "1)"], "a hidden block is not a turn"
    assert with_pref.tool_call is not None and plain.tool_call is not None
    content = with_pref.tool_call.args["content"]
    assert content.index("## Conclusion") < content.index("## Details") and "RMB" in content
    assert "Preferences" not in plain.tool_call.args["content"]
