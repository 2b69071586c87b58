"""A2A objects <-> runs, threads and their events: pure functions, no IO.

    contextId  <-> a thread (its public id; a new thread when the message has none)
    task       <-> the run a message started, and the runs that resumed it
    task id    =   "<contextId>:<run id of its first run>" (as the official server)
    state      <-  the run's status; a run that ended with the thread on an interrupt
                   is `input-required`, and the next message on the task resumes it
    artifact   <-  the last AI message of the thread's values (id: that message's id)

The answers are A2A 1.0's ProtoJSON (`TASK_STATE_COMPLETED`, `ROLE_AGENT`, parts
`{"text": ...}`); `legacy` turns one into 0.3's shape for a client of the slash methods.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.protocols.a2a.wire import Part
from shared import serde
from shared.vocab import RunStatus

SUBMITTED = "TASK_STATE_SUBMITTED"
WORKING = "TASK_STATE_WORKING"
COMPLETED = "TASK_STATE_COMPLETED"
FAILED = "TASK_STATE_FAILED"
CANCELED = "TASK_STATE_CANCELED"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
FINAL_STATES = frozenset({COMPLETED, FAILED, CANCELED, INPUT_REQUIRED})
"""States after which a stream closes (input-required waits for the next message)."""

RUN_STATES: dict[RunStatus, str] = {
    RunStatus.PENDING: SUBMITTED,
    RunStatus.RUNNING: WORKING,
    RunStatus.SUCCESS: COMPLETED,
    RunStatus.ERROR: FAILED,
    RunStatus.TIMEOUT: FAILED,
    RunStatus.INTERRUPTED: CANCELED,  # cancelled; a graph's interrupt() ends in success
}
AI_TYPES = frozenset({"ai", "AIMessage", "AIMessageChunk"})
RESPONSE = "response"


def task_id_of(context_id: str, run_id: str) -> str:
    """The id of the task a run started."""
    return f"{context_id}:{run_id}"


def parse_task_id(task_id: str) -> tuple[str, str] | None:
    """(context id, first run id) of a task id, None when it is not one of ours."""
    context_id, sep, run_id = task_id.partition(":")
    return (context_id, run_id) if sep and context_id and run_id else None


def task_state(status: RunStatus, *, interrupted: bool) -> str:
    """The A2A state of a task whose latest run has `status`; `interrupted`: its thread
    waits on an interrupt after that run."""
    if status is RunStatus.SUCCESS and interrupted:
        return INPUT_REQUIRED
    return RUN_STATES[status]


def timestamp(at: dt.datetime | None = None) -> str:
    """RFC 3339 in UTC, as ProtoJSON writes a Timestamp."""
    at = at or dt.datetime.now(dt.UTC)
    return at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- in: A2A parts -> the graph's input ---------------------------------------------


def _block_type(media_type: str | None) -> str:
    top = (media_type or "").split("/", 1)[0].lower()
    return top if top in ("image", "audio", "video") else "file"


def content_block(part: Part) -> dict[str, Any]:
    """A part as a LangChain content block (a URL is passed on, never fetched here)."""
    kind = part.content
    if kind == "text":
        return {"type": "text", "text": part.text}
    if kind == "data":
        return {"type": "text", "text": serde.dumps(part.data).decode()}
    block: dict[str, Any] = {"type": _block_type(part.media_type)}
    if kind == "url":
        block["url"] = part.url
    else:
        block["base64"] = part.raw
    if part.media_type:
        block["mime_type"] = part.media_type
    if part.filename:
        block["extras"] = {"filename": part.filename}
    return block


def graph_input(parts: list[Part], message_id: str) -> dict[str, Any]:
    """The run's input for a user message: one human message (a string for text only,
    else content blocks), and each object `data` part's keys beside `messages`."""
    extra: dict[str, Any] = {}
    content: list[Part] = []
    for part in parts:
        if part.content == "data" and isinstance(part.data, dict):
            extra.update({k: v for k, v in part.data.items() if k != "messages"})
        else:
            content.append(part)
    out: dict[str, Any] = dict(extra)
    if content:
        if all(p.content == "text" for p in content):
            text: Any = "\n".join(p.text or "" for p in content)
        else:
            text = [content_block(p) for p in content]
        out["messages"] = [{"role": "human", "content": text, "id": message_id}]
    return out


def resume_value(parts: list[Part]) -> Any:
    """What a message answers an interrupt with: a data part's `resume` (or the data
    itself), else the text."""
    for part in parts:
        if part.content == "data":
            data = part.data
            return data["resume"] if isinstance(data, dict) and "resume" in data else data
    return "\n".join(p.text or "" for p in parts if p.content == "text")


# --- out: the graph's values -> A2A parts ---------------------------------------------


def text_of(content: Any) -> str:
    """The text of a message's content (a string, or blocks with text)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            b if isinstance(b, str) else str(b.get("text") or "")
            for b in content
            if isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text")
        )
    return ""


def _block_part(block: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = block.get("type")
    if kind == "text":
        return {"text": str(block.get("text") or "")}
    out: dict[str, Any] = {}
    if block.get("url"):
        out["url"] = block["url"]
    elif block.get("base64") or block.get("data"):
        out["raw"] = block.get("base64") or block.get("data")
    else:
        return None
    mime = block.get("mime_type") or block.get("mimeType")
    if mime:
        out["mediaType"] = mime
    extras = block.get("extras")
    if isinstance(extras, dict) and extras.get("filename"):
        out["filename"] = extras["filename"]
    return out


def content_parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as A2A parts (text, files by URL or bytes; other JSON as data)."""
    if isinstance(content, str):
        return [{"text": content}]
    parts: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else [content]:
        if isinstance(block, str):
            parts.append({"text": block})
        elif isinstance(block, dict):
            part = _block_part(block)
            parts.append(part if part is not None else {"data": block})
    return parts or [{"text": ""}]


def _kind(message: Mapping[str, Any]) -> str:
    return str(message.get("type") or message.get("role") or "")


def last_ai_message(values: Any) -> dict[str, Any] | None:
    """The newest AI message of the thread's `messages`, if any."""
    messages = values.get("messages") if isinstance(values, dict) else None
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and _kind(message) in AI_TYPES | {"assistant"}:
            return message
    return None


def response_artifact(values: Any) -> dict[str, Any] | None:
    """The task's artifact: the last AI message (its id is the artifact's), or the
    values as one data part for a graph without messages; None for no values at all."""
    message = last_ai_message(values)
    if message is not None:
        artifact_id = str(message.get("id") or RESPONSE)
        parts = content_parts(message.get("content"))
        return {"artifactId": artifact_id, "name": RESPONSE, "parts": parts}
    if isinstance(values, dict) and values and "messages" not in values:
        return {"artifactId": RESPONSE, "name": RESPONSE, "parts": [{"data": values}]}
    return None


def agent_message(
    parts: list[dict[str, Any]], *, message_id: str, context_id: str, task_id: str
) -> dict[str, Any]:
    """A message of the agent."""
    return {
        "messageId": message_id,
        "contextId": context_id,
        "taskId": task_id,
        "role": "ROLE_AGENT",
        "parts": parts,
    }


def interrupt_parts(interrupts: list[Any]) -> list[dict[str, Any]]:
    """What the task asks for when input is required: each interrupt's value as a data
    part (a string value also as text), its id in the part's metadata."""
    parts: list[dict[str, Any]] = []
    for item in interrupts:
        value = item.get("value") if isinstance(item, dict) else item
        meta = {"interruptId": item["id"]} if isinstance(item, dict) and item.get("id") else {}
        if isinstance(value, str):
            parts.append({"text": value, "metadata": meta})
        parts.append({"data": value, "metadata": meta})
    return parts or [{"text": "input required"}]


def user_message(
    run_input: Any, command: Any, *, context_id: str, task_id: str
) -> dict[str, Any] | None:
    """The client's message of one run of the task, rebuilt from the run's input (a
    resume: its value as a data part)."""
    if isinstance(command, dict) and "resume" in command:
        parts = [{"data": command["resume"]}]
        return _user(parts, f"{task_id}:resume", context_id, task_id)
    messages = run_input.get("messages") if isinstance(run_input, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return None
    last = messages[-1]
    return _user(content_parts(last.get("content")), str(last.get("id") or ""), context_id, task_id)


def _user(
    parts: list[dict[str, Any]], message_id: str, context_id: str, task_id: str
) -> dict[str, Any]:
    return {
        "messageId": message_id,
        "contextId": context_id,
        "taskId": task_id,
        "role": "ROLE_USER",
        "parts": parts,
    }


# --- tasks and stream events ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskView:
    """What a Task shows, gathered by the caller from the run store and the thread."""

    task_id: str
    context_id: str
    state: str
    at: dt.datetime | None = None
    artifact: dict[str, Any] | None = None
    message: dict[str, Any] | None = None  # the status message (input-required, failed)
    history: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)


def status(view: TaskView) -> dict[str, Any]:
    """The TaskStatus of a view."""
    out: dict[str, Any] = {"state": view.state, "timestamp": timestamp(view.at)}
    if view.message is not None:
        out["message"] = view.message
    return out


def task(view: TaskView, history_length: int | None = None) -> dict[str, Any]:
    """The Task object (artifacts only once it is completed or waits for input)."""
    out: dict[str, Any] = {"id": view.task_id, "contextId": view.context_id, "status": status(view)}
    if view.artifact is not None and view.state in (COMPLETED, INPUT_REQUIRED):
        out["artifacts"] = [view.artifact]
    history = view.history
    if history_length is not None:
        history = history[-history_length:] if history_length else []
    if history:
        out["history"] = history
    if view.metadata:
        out["metadata"] = view.metadata
    return out


def status_update(view: TaskView, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """A StreamResponse carrying a TaskStatusUpdateEvent."""
    event: dict[str, Any] = {
        "taskId": view.task_id,
        "contextId": view.context_id,
        "status": status(view),
    }
    if metadata:
        event["metadata"] = metadata
    return {"statusUpdate": event}


def artifact_update(
    task_id: str, context_id: str, artifact: dict[str, Any], *, append: bool, last: bool
) -> dict[str, Any]:
    """A StreamResponse carrying a TaskArtifactUpdateEvent."""
    event = {
        "taskId": task_id,
        "contextId": context_id,
        "artifact": artifact,
        "append": append,
        "lastChunk": last,
    }
    return {"artifactUpdate": event}


@dataclass
class StreamTranslator:
    """A run's events (the `messages-tuple` mode) -> A2A stream responses, in order: the
    first event says `working`; each AI text chunk is appended to the artifact of its
    message (the artifact id is the message id, the one the final Task shows). The end
    of the run is the caller's: it reads the durable outcome (`final`)."""

    task_id: str
    context_id: str
    resumed: bool = False  # after a cursor: the client has the artifacts' start
    started: bool = False
    seen: set[str] = field(default_factory=set)
    error: str | None = None

    def working(self) -> dict[str, Any]:
        """The `working` status update (once)."""
        self.started = True
        return status_update(TaskView(self.task_id, self.context_id, WORKING))

    def feed(self, event: str, data: str) -> list[dict[str, Any]]:
        """The responses one run event makes."""
        out: list[dict[str, Any]] = []
        if not self.started:
            out.append(self.working())
        if event == "error":
            self.error = _error_text(data)
        if event != "messages":
            return out
        try:
            chunk = serde.loads(data)[0]
        except (ValueError, IndexError, KeyError, TypeError):
            return out
        if not isinstance(chunk, dict) or _kind(chunk) not in AI_TYPES:
            return out
        text = text_of(chunk.get("content"))
        if not text:
            return out
        artifact_id = str(chunk.get("id") or RESPONSE)
        append = self.resumed or artifact_id in self.seen
        self.seen.add(artifact_id)
        artifact = {"artifactId": artifact_id, "name": RESPONSE, "parts": [{"text": text}]}
        out.append(
            artifact_update(self.task_id, self.context_id, artifact, append=append, last=False)
        )
        return out

    def final(self, view: TaskView) -> list[dict[str, Any]]:
        """The closing responses: the whole artifact (replacing what was streamed), then
        the final status."""
        out: list[dict[str, Any]] = []
        if not self.started:
            out.append(self.working())
        if view.artifact is not None and view.state in (COMPLETED, INPUT_REQUIRED):
            out.append(
                artifact_update(
                    self.task_id, self.context_id, view.artifact, append=False, last=True
                )
            )
        out.append(status_update(view))
        return out


def _error_text(data: str) -> str:
    try:
        value = serde.loads(data)
    except ValueError:
        return data
    if isinstance(value, dict):
        return str(value.get("message") or value.get("error") or value)
    return str(value)


# --- 0.3 ------------------------------------------------------------------------------

_LEGACY_ROLES = {"ROLE_USER": "user", "ROLE_AGENT": "agent"}
_WRAPPERS = {
    "task": "task",
    "message": "message",
    "statusUpdate": "status-update",
    "artifactUpdate": "artifact-update",
}


def state_name(state: str) -> str:
    """0.3's name of a state (`input-required`), also what error messages say."""
    return state.removeprefix("TASK_STATE_").lower().replace("_", "-")


def _legacy_part(part: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "text" in part:
        out = {"kind": "text", "text": part["text"]}
    elif "data" in part:
        data = part["data"]
        out = {"kind": "data", "data": data if isinstance(data, dict) else {"value": data}}
    else:
        file: dict[str, Any] = {"uri": part["url"]} if "url" in part else {"bytes": part.get("raw")}
        if part.get("mediaType"):
            file["mimeType"] = part["mediaType"]
        if part.get("filename"):
            file["name"] = part["filename"]
        out = {"kind": "file", "file": file}
    if part.get("metadata"):
        out["metadata"] = part["metadata"]
    return out


def _legacy(value: Any, key: str = "") -> Any:
    if isinstance(value, list):
        if key == "parts":
            return [_legacy_part(p) for p in value if isinstance(p, dict)]
        return [_legacy(v, key) for v in value]
    if not isinstance(value, dict):
        if key == "role" and isinstance(value, str):
            return _LEGACY_ROLES.get(value, value)
        if key == "state" and isinstance(value, str):
            return state_name(value)
        return value
    out = {k: _legacy(v, k) for k, v in value.items()}
    if key in ("message", "history") or "messageId" in value:
        out["kind"] = "message"
    return out


def legacy(result: dict[str, Any]) -> dict[str, Any]:
    """A 1.0 result (a Task, a SendMessageResponse or a StreamResponse) in 0.3's shape:
    unwrapped, with `kind`s, lower-case states and roles, `final` on status updates."""
    if len(result) == 1 and next(iter(result)) in _WRAPPERS:
        name, inner = next(iter(result.items()))
        out: dict[str, Any] = _legacy(inner)
        out["kind"] = _WRAPPERS[name]
        if name == "statusUpdate":
            out["final"] = inner["status"]["state"] in FINAL_STATES
        return out
    converted: dict[str, Any] = _legacy(result)
    if "status" in result and "id" in result:
        converted["kind"] = "task"
    return converted
