"""The upgraded socket under simple-websocket, made safe for our use: whole frames under
one lock, and a reason before a "message too big" close."""

from __future__ import annotations

import socket
import threading
from typing import Any

from wsproto.events import CloseConnection, Event, Message
from wsproto.frame_protocol import CloseReason

from shared import serde


class WholeFrames:
    """The upgraded socket, written one whole frame at a time.

    simple-websocket writes with `sock.send()`, ignores a short write, and writes from two
    threads (our frames; pings from its reader). Once a slow reader's buffers are full a
    gevent socket's send() writes only what fits, cutting a frame, and two writers could
    interleave the parts of a large one. `sendall` under one lock prevents both.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()

    def send(self, data: bytes, flags: int = 0) -> int:
        with self._lock:
            self._sock.sendall(data, flags)
        return len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class ExplainTooBig:
    """The socket's wsproto connection, with a reason before a "message too big" close.

    simple-websocket answers a frame above `max_message_size` with a bare close 1009
    "Message is too big" from its reader thread. A browser's WebSocket API hides close
    reasons behind a generic "the connection closed", so a user who pasted a 300 KB text saw
    no reason at all. Here that close becomes an `error` frame naming the limit
    (`limit_exceeded`, `ws_max_frame_bytes`, like SSE/HTTP name theirs) followed by the
    same 1009 close with a reason that names the size.
    """

    def __init__(self, conn: Any, max_bytes: int) -> None:
        self._conn = conn
        self._max_bytes = max_bytes

    def send(self, event: Event) -> bytes:
        if isinstance(event, CloseConnection) and event.code == CloseReason.MESSAGE_TOO_BIG:
            error = {
                "type": "error",
                "code": "limit_exceeded",
                "limit": "ws_max_frame_bytes",
                "max_bytes": self._max_bytes,
                "message": f"a frame is larger than {self._max_bytes} bytes "
                "(ws_max_frame_bytes); the socket closes",
                "request_id": None,
            }
            reason = f"frame larger than {self._max_bytes} bytes (ws_max_frame_bytes)"
            out: bytes = self._conn.send(Message(data=serde.dumps_str(error)))
            return out + bytes(self._conn.send(CloseConnection(event.code, reason)))
        return bytes(self._conn.send(event))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)
