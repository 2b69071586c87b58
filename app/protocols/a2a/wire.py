"""The A2A wire: the JSON-RPC 2.0 envelope, the request params of each method and the
error codes, as pydantic models (the validation of every request; the error names the
field, as the client sent it).

Two revisions are read: A2A 1.0 (the `a2a-sdk` 1.x client: `SendMessage`, ProtoJSON field
names, `ROLE_USER`, parts `{"text": ...}` / `{"data": ...}` / `{"url"|"raw": ...}`) and 0.3
(the slash methods `message/send`, ..., parts `{"kind": "text", ...}`, roles `user`), which
the official Agent Server also accepts. Both validate into the same models; `Method.legacy`
says which shape the answer takes (app/protocols/a2a/mapping.py `legacy`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from shared.errors import ThreadrunError


class Code(enum.IntEnum):
    """The JSON-RPC error codes A2A uses (its own are in -32001..-32009)."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    TASK_NOT_FOUND = -32001
    TASK_NOT_CANCELABLE = -32002
    PUSH_NOTIFICATION_NOT_SUPPORTED = -32003
    UNSUPPORTED_OPERATION = -32004
    CONTENT_TYPE_NOT_SUPPORTED = -32005


REASONS = {
    Code.PARSE_ERROR: "PARSE_ERROR",
    Code.INVALID_REQUEST: "INVALID_REQUEST",
    Code.METHOD_NOT_FOUND: "METHOD_NOT_FOUND",
    Code.INVALID_PARAMS: "INVALID_PARAMS",
    Code.INTERNAL_ERROR: "INTERNAL_ERROR",
    Code.TASK_NOT_FOUND: "TASK_NOT_FOUND",
    Code.TASK_NOT_CANCELABLE: "TASK_NOT_CANCELABLE",
    Code.PUSH_NOTIFICATION_NOT_SUPPORTED: "PUSH_NOTIFICATION_NOT_SUPPORTED",
    Code.UNSUPPORTED_OPERATION: "UNSUPPORTED_OPERATION",
    Code.CONTENT_TYPE_NOT_SUPPORTED: "CONTENT_TYPE_NOT_SUPPORTED",
}
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


class RpcError(ThreadrunError):
    """A JSON-RPC error answer (`field`: the parameter at fault, when one is)."""

    # A JSON-RPC error code, where the root's `code` is a string: this family answers on
    # its own protocol, never through the HTTP error map.
    code: Code  # type: ignore[assignment]

    def __init__(self, code: Code, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field

    def payload(self) -> dict[str, Any]:
        """The `error` member: code, message, and the ErrorInfo detail the 1.x SDK reads."""
        metadata = {"field": self.field} if self.field else {}
        info = {
            "@type": ERROR_INFO,
            "reason": REASONS[self.code],
            "domain": "a2a-protocol.org",
            "metadata": metadata,
        }
        return {"code": int(self.code), "message": self.message, "data": [info]}


class Kind(enum.Enum):
    """What a method does."""

    SEND = "send"
    STREAM = "stream"
    GET = "get"
    CANCEL = "cancel"
    SUBSCRIBE = "subscribe"


@dataclass(frozen=True, slots=True)
class Method:
    """A JSON-RPC method name served: what it does, and in which revision it answers."""

    kind: Kind
    legacy: bool  # 0.3's slash names: 0.3 shapes in the answer

    @property
    def streams(self) -> bool:
        """Whether the answer is an SSE stream."""
        return self.kind in (Kind.STREAM, Kind.SUBSCRIBE)


METHODS: dict[str, Method] = {
    "SendMessage": Method(Kind.SEND, False),
    "SendStreamingMessage": Method(Kind.STREAM, False),
    "GetTask": Method(Kind.GET, False),
    "CancelTask": Method(Kind.CANCEL, False),
    "SubscribeToTask": Method(Kind.SUBSCRIBE, False),
    "message/send": Method(Kind.SEND, True),
    "message/stream": Method(Kind.STREAM, True),
    "tasks/get": Method(Kind.GET, True),
    "tasks/cancel": Method(Kind.CANCEL, True),
    "tasks/resubscribe": Method(Kind.SUBSCRIBE, True),
}
"""Every method served. Push notifications, ListTasks and the extended card are not."""

NOT_SUPPORTED = frozenset(
    {
        "ListTasks",
        "tasks/list",
        "GetExtendedAgentCard",
        "agent/getAuthenticatedExtendedCard",
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "DeleteTaskPushNotificationConfig",
        "tasks/pushNotificationConfig/set",
        "tasks/pushNotificationConfig/get",
        "tasks/pushNotificationConfig/list",
        "tasks/pushNotificationConfig/delete",
    }
)
"""A2A methods that exist but are not served here: UnsupportedOperation, not MethodNotFound."""


class RpcRequest(BaseModel):
    """A JSON-RPC 2.0 request object."""

    model_config = ConfigDict(extra="forbid")

    jsonrpc: Literal["2.0"]
    id: StrictStr | StrictInt | None = None
    method: StrictStr
    params: dict[str, Any] = Field(default_factory=dict)


class Wire(BaseModel):
    """ProtoJSON field names (camelCase) in, snake_case here; unknown fields ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class LegacyFile(Wire):
    """0.3's `file` of a file part: bytes (base64) or a URI."""

    bytes: str | None = None
    uri: str | None = None
    mime_type: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _one(self) -> LegacyFile:
        if (self.bytes is None) == (self.uri is None):
            raise ValueError("a file needs exactly one of `bytes` or `uri`")
        return self


class Part(Wire):
    """One part of a message: text, data (any JSON), or a file by URL or raw bytes."""

    text: str | None = None
    data: Any = None
    url: str | None = Field(default=None, max_length=8192)
    raw: str | None = None  # base64 (ProtoJSON bytes)
    media_type: str | None = Field(default=None, max_length=256)
    filename: str | None = Field(default=None, max_length=1024)
    metadata: dict[str, Any] | None = None
    kind: Literal["text", "data", "file"] | None = None  # 0.3
    file: LegacyFile | None = None  # 0.3

    @model_validator(mode="after")
    def _one_content(self) -> Part:
        if self.file is not None:  # 0.3's file part, as 1.0 says it
            self.url, self.raw = self.file.uri, self.file.bytes
            self.media_type = self.media_type or self.file.mime_type
            self.filename = self.filename or self.file.name
            self.file = None
        present = [k for k in ("text", "data", "url", "raw") if k in self._given()]
        if len(present) != 1:
            raise ValueError(
                "a part needs exactly one of `text`, `data`, `url` or `raw`"
                + (f" (got {', '.join(present)})" if present else "")
            )
        return self

    def _given(self) -> set[str]:
        given = {k for k in ("text", "url", "raw") if getattr(self, k) is not None}
        if "data" in self.model_fields_set:
            given.add("data")  # `data: null` is a data part holding JSON null
        return given

    @property
    def content(self) -> str:
        """Which content the part holds: `text`, `data`, `url` or `raw`."""
        return next(iter(self._given()))


class Message(Wire):
    """An A2A message from the client (role user)."""

    message_id: str = Field(min_length=1, max_length=256)
    context_id: str | None = Field(default=None, max_length=256)
    task_id: str | None = Field(default=None, max_length=600)
    role: Literal["user", "agent"]
    parts: list[Part] = Field(min_length=1)
    metadata: dict[str, Any] | None = None
    reference_task_ids: list[str] = Field(default_factory=list)

    @field_validator("role", mode="before")
    @classmethod
    def _role(cls, v: Any) -> Any:
        return {"ROLE_USER": "user", "ROLE_AGENT": "agent"}.get(v, v) if isinstance(v, str) else v

    @field_validator("context_id", "task_id", mode="before")
    @classmethod
    def _empty_is_none(cls, v: Any) -> Any:
        return None if v == "" else v  # ProtoJSON omits defaults; some clients send ""


class SendConfiguration(Wire):
    """`configuration` of a send."""

    accepted_output_modes: list[str] = Field(default_factory=list)
    history_length: int | None = Field(default=None, ge=0)
    return_immediately: bool = False
    blocking: bool | None = None  # 0.3: `blocking: false` answers at once


class SendParams(Wire):
    """`SendMessage` / `SendStreamingMessage` (and 0.3's `message/send` / `message/stream`)."""

    message: Message
    configuration: SendConfiguration | None = None
    metadata: dict[str, Any] | None = None

    @property
    def immediate(self) -> bool:
        """Whether the answer is the submitted task, without waiting for the run."""
        conf = self.configuration
        return conf is not None and (conf.return_immediately or conf.blocking is False)


class TaskParams(Wire):
    """`GetTask`, `CancelTask`, `SubscribeToTask` (and their 0.3 names)."""

    id: str = Field(min_length=1, max_length=600)
    history_length: int | None = Field(default=None, ge=0)
    metadata: dict[str, Any] | None = None


PARAMS: dict[Kind, type[Wire]] = {
    Kind.SEND: SendParams,
    Kind.STREAM: SendParams,
    Kind.GET: TaskParams,
    Kind.CANCEL: TaskParams,
    Kind.SUBSCRIBE: TaskParams,
}
