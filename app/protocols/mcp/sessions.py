"""MCP sessions and tool calls in flight, in Redis: any web process serves any request of a
session (its `Mcp-Session-Id` names a hash there), and a `notifications/cancelled` that
reaches another process than the call's finds the call's run there.

A session belongs to the identity that made it (`Principal.subject`): presented by anyone
else it reads exactly like a missing one. It lives `mcp_session_ttl_s` after its last
request.

A call and its cancel meet on one key, each writing it with `SET ... GET` (one atomic
step): the call writes its run and reads what was there, the cancel writes a tombstone
and reads what was there. Whichever comes second sees the other's value, so a cancel
that overtakes its call's admission still ends the run.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

import redis

from shared import serde
from shared.redis_keys import MCP_CALL_TTL_S, McpKeys

CANCELLED = b"cancelled"
"""A call key's value when the cancel came before the call had a run."""
SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{16,128}$")
"""What this server issues (`secrets.token_urlsafe`); anything else is not a session."""


@dataclass(frozen=True, slots=True)
class Session:
    """One MCP session: who made it and the protocol version it negotiated."""

    session_id: str
    subject: str  # the identity that made it (Principal.subject)
    version: str


@dataclass(frozen=True, slots=True)
class CallRecord:
    """The run a `tools/call` waits on (what a cancel of that request ends)."""

    run_id: str
    thread_id: str  # its storage id
    public_thread_id: str  # the id the caller knows it by

    def dumps(self) -> bytes:
        """The record as stored."""
        return serde.dumps(
            {"run_id": self.run_id, "thread_id": self.thread_id, "public": self.public_thread_id}
        )

    @classmethod
    def loads(cls, raw: bytes) -> CallRecord:
        """A stored record."""
        data: dict[str, Any] = serde.loads(raw)
        return cls(data["run_id"], data["thread_id"], data["public"])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SessionStore:
    """The sessions and call records of one deployment (one Redis prefix)."""

    def __init__(self, client: redis.Redis, keys: McpKeys, ttl_s: float) -> None:
        self._redis = client
        self._keys = keys
        self._ttl_ms = max(1, int(ttl_s * 1000))

    def create(self, subject: str, version: str) -> Session:
        """A new session of `subject` at `version`."""
        session = Session(secrets.token_urlsafe(24), subject, version)
        key = self._keys.session(session.session_id)
        pipe = self._redis.pipeline()
        pipe.hset(key, mapping={"subject": subject, "version": version})
        pipe.pexpire(key, self._ttl_ms)
        pipe.execute()
        return session

    def get(self, session_id: str, subject: str) -> Session | None:
        """The session if it exists and is `subject`'s (its lifetime starts again), else None."""
        if not SESSION_ID.match(session_id):
            return None
        key = self._keys.session(session_id)
        pipe = self._redis.pipeline()
        pipe.hgetall(key)
        pipe.pexpire(key, self._ttl_ms)
        found, _ = pipe.execute()
        fields = {_text(k): _text(v) for k, v in (found or {}).items()}
        if fields.get("subject") != subject:
            return None
        return Session(session_id, subject, fields.get("version", ""))

    def delete(self, session: Session) -> None:
        """End the session (its id is not found afterwards)."""
        self._redis.delete(self._keys.session(session.session_id))

    def start_call(self, session: Session, request_id: int | str, record: CallRecord) -> bool:
        """Record the run of a call; True when its cancel came first (end the run now)."""
        key = self._keys.call(session.session_id, request_id)
        before = self._redis.set(key, record.dumps(), ex=MCP_CALL_TTL_S, get=True)
        return before == CANCELLED

    def cancel_call(self, session: Session, request_id: int | str) -> CallRecord | None:
        """The run of a call to end, if it has one yet (else its call ends it on admission)."""
        key = self._keys.call(session.session_id, request_id)
        before = self._redis.set(key, CANCELLED, px=self._ttl_ms, get=True)
        if not isinstance(before, bytes) or before == CANCELLED:
            return None
        return CallRecord.loads(before)

    def end_call(self, session: Session, request_id: int | str) -> None:
        """The call answered: forget it."""
        self._redis.delete(self._keys.call(session.session_id, request_id))
