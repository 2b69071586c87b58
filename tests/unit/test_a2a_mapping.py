"""app/protocols/a2a/mapping.py and cards.py: runs, threads and run events <-> A2A objects,
checked against the `a2a-sdk`'s own protobuf types (what the 1.x client parses)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from a2a.client.card_resolver import parse_agent_card
from a2a.types.a2a_pb2 import SendMessageResponse, StreamResponse, TaskState
from a2a.utils.proto_utils import parse_lenient

from app.protocols.a2a import cards, mapping
from app.protocols.a2a.mapping import StreamTranslator, TaskView
from app.protocols.a2a.wire import Part
from shared import serde
from shared.assistants.model import Assistant
from shared.vocab import RunStatus

AT = dt.datetime(2026, 12, 7, 1, 2, 3, tzinfo=dt.UTC)


def part(**fields: Any) -> Part:
    return Part.model_validate(fields)


@pytest.mark.parametrize(
    ("status", "interrupted", "state"),
    [
        (RunStatus.PENDING, False, "TASK_STATE_SUBMITTED"),
        (RunStatus.RUNNING, False, "TASK_STATE_WORKING"),
        (RunStatus.SUCCESS, False, "TASK_STATE_COMPLETED"),
        (RunStatus.SUCCESS, True, "TASK_STATE_INPUT_REQUIRED"),
        (RunStatus.ERROR, False, "TASK_STATE_FAILED"),
        (RunStatus.TIMEOUT, False, "TASK_STATE_FAILED"),
        (RunStatus.INTERRUPTED, False, "TASK_STATE_CANCELED"),
        (RunStatus.INTERRUPTED, True, "TASK_STATE_CANCELED"),
    ],
)
def test_task_state(status: RunStatus, interrupted: bool, state: str) -> None:
    """a run's status (and its thread waiting on an interrupt) -> the task's state, every
    one a state of the SDK's enum."""
    assert mapping.task_state(status, interrupted=interrupted) == state
    assert TaskState.Value(state)


def test_task_ids_round_trip() -> None:
    """a task id names its context and first run; anything else is not one of ours."""
    assert mapping.parse_task_id(mapping.task_id_of("c", "r")) == ("c", "r")
    for bad in ("", "nope", ":r", "c:"):
        assert mapping.parse_task_id(bad) is None


def test_graph_input_text_data_and_files() -> None:
    """text only: one human message with a string; with a file: content blocks (the URL
    passed on, never fetched); an object data part's keys beside `messages`."""
    assert mapping.graph_input([part(text="a"), part(text="b")], "m1") == {
        "messages": [{"role": "human", "content": "a\nb", "id": "m1"}]
    }
    got = mapping.graph_input(
        [
            part(text="look"),
            part(url="https://x/cat.png", mediaType="image/png"),
            part(raw="aGk=", mediaType="application/pdf", filename="a.pdf"),
            part(data={"topic": "cats", "messages": "ignored"}),
        ],
        "m2",
    )
    assert got["topic"] == "cats"
    assert got["messages"][0]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image", "url": "https://x/cat.png", "mime_type": "image/png"},
        {
            "type": "file",
            "base64": "aGk=",
            "mime_type": "application/pdf",
            "extras": {"filename": "a.pdf"},
        },
    ]
    legacy = part(kind="file", file={"uri": "https://x/y", "mimeType": "audio/ogg"})
    assert mapping.content_block(legacy) == {
        "type": "audio",
        "url": "https://x/y",
        "mime_type": "audio/ogg",
    }


def test_resume_value() -> None:
    """an interrupt's answer: a data part's `resume`, the data itself, else the text."""
    assert mapping.resume_value([part(data={"resume": {"ok": 1}})]) == {"ok": 1}
    assert mapping.resume_value([part(data=[1, 2])]) == [1, 2]
    assert mapping.resume_value([part(text="yes")]) == "yes"


def test_artifact_and_interrupt_parts() -> None:
    """the artifact is the last AI message (its id, its text and files); an interrupt's
    value a data part; a graph without messages answers its values as data."""
    values = {
        "messages": [
            {"type": "human", "content": "hi", "id": "h"},
            {"type": "ai", "content": [{"type": "text", "text": "yo"}], "id": "a1"},
            {"type": "tool", "content": "t", "id": "t"},
        ]
    }
    assert mapping.response_artifact(values) == {
        "artifactId": "a1",
        "name": "response",
        "parts": [{"text": "yo"}],
    }
    assert mapping.response_artifact({"n": 1}) == {
        "artifactId": "response",
        "name": "response",
        "parts": [{"data": {"n": 1}}],
    }
    assert mapping.response_artifact({}) is None
    parts = mapping.interrupt_parts([{"value": {"question": "approve?"}, "id": "i1"}])
    assert parts == [{"data": {"question": "approve?"}, "metadata": {"interruptId": "i1"}}]


def chunk(text: str, mid: str = "run-1", kind: str = "AIMessageChunk") -> str:
    return serde.dumps(
        [{"type": kind, "content": text, "id": mid}, {"langgraph_node": "x"}]
    ).decode()


def parsed(response: dict[str, Any]) -> StreamResponse:
    """A response as the 1.x client parses it (unknown fields would be ignored there, so
    every field is also checked to survive)."""
    got = parse_lenient(response, StreamResponse())
    assert got.WhichOneof("payload") is not None
    return got


def test_stream_translator() -> None:
    """working first, then each AI chunk appended to its message's artifact (human and
    tool chunks skipped), then the whole artifact and the final status (B1)."""
    t = StreamTranslator("c:r", "c")
    out = t.feed("metadata", '{"run_id": "r"}')
    out += t.feed("messages", chunk("hel"))
    out += t.feed("messages", chunk("lo"))
    out += t.feed("messages", chunk("nope", kind="human"))
    out += t.feed("values", "{}")
    responses = [parsed(r) for r in out]
    assert responses[0].status_update.status.state == TaskState.TASK_STATE_WORKING
    assert [r.artifact_update.append for r in responses[1:]] == [False, True]
    assert "".join(r.artifact_update.artifact.parts[0].text for r in responses[1:]) == "hello"
    artifact = {"artifactId": "run-1", "name": "response", "parts": [{"text": "hello"}]}
    final = [parsed(r) for r in t.final(TaskView("c:r", "c", mapping.COMPLETED, AT, artifact))]
    assert final[0].artifact_update.last_chunk and not final[0].artifact_update.append
    assert final[1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert final[1].status_update.status.timestamp.ToDatetime(dt.UTC) == AT


def test_resumed_translator_appends_everything() -> None:
    """after a cursor the client has the start of each artifact: every chunk appends."""
    t = StreamTranslator("c:r", "c", resumed=True, started=True)
    assert [r["artifactUpdate"]["append"] for r in t.feed("messages", chunk("x"))] == [True]


def test_task_parses_in_the_sdk() -> None:
    """a Task with artifact, status message and history parses as the SDK's Task."""
    message = mapping.agent_message([{"text": "hi"}], message_id="m", context_id="c", task_id="c:r")
    artifact = {"artifactId": "a", "name": "response", "parts": [{"text": "hi"}]}
    view = TaskView("c:r", "c", mapping.COMPLETED, AT, artifact, None, [message], {"k": 1})
    got = parse_lenient({"task": mapping.task(view)}, SendMessageResponse()).task
    assert got.id == "c:r" and got.artifacts[0].parts[0].text == "hi"
    assert got.history[0].role == 2  # ROLE_AGENT
    assert "history" not in mapping.task(view, 0)
    working = mapping.task(TaskView("c:r", "c", mapping.WORKING, AT, artifact))
    assert "artifacts" not in working  # only a completed task shows its artifact


def test_legacy_shapes() -> None:
    """0.3: unwrapped, `kind`s, lower-case states and roles, `final` on status updates."""
    view = TaskView("c:r", "c", mapping.INPUT_REQUIRED, AT, None, None)
    update = mapping.legacy(mapping.status_update(view))
    assert update["kind"] == "status-update" and update["final"] is True
    assert update["status"]["state"] == "input-required"
    message = mapping.agent_message([{"data": 3}], message_id="m", context_id="c", task_id="t")
    task = mapping.legacy(
        {"task": mapping.task(TaskView("t", "c", mapping.FAILED, AT, message=message))}
    )
    assert task["kind"] == "task" and task["status"]["message"]["role"] == "agent"
    assert task["status"]["message"]["kind"] == "message"
    assert task["status"]["message"]["parts"] == [{"kind": "data", "data": {"value": 3}}]
    assert mapping.legacy(mapping.task(view))["kind"] == "task"


def test_card_parses_in_the_sdk() -> None:
    """the card is the SDK's AgentCard: one JSONRPC 1.0 interface at this server's URL,
    streaming, one skill, the API key scheme when keys are needed."""
    assistant = Assistant("a-1", "lead_agent", "helper", 1, AT, AT, description="helps")
    body = cards.card(assistant, "http://h:1/", version="0.1.0", keyed=True)
    card = parse_agent_card(serde.loads(serde.dumps(body)))
    assert [(i.url, i.protocol_binding, i.protocol_version) for i in card.supported_interfaces] == [
        ("http://h:1/a2a/a-1", "JSONRPC", "1.0")
    ]
    assert card.capabilities.streaming and card.skills[0].id == "a-1-main"
    assert card.security_schemes["apiKey"].api_key_security_scheme.name == "x-api-key"
    assert "securitySchemes" not in cards.card(assistant, "http://h:1", version="0", keyed=False)
