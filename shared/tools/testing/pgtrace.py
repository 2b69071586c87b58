"""Counting PostgreSQL round trips with libpq's protocol trace (`PQtrace`).

A round trip is a turn of the conversation: the client sends, then waits for the server's
answer. In the trace every message is a line, `F` for the client's and `B` for the
server's, so the round trips are the times a `B` line follows an `F` line. A count, not a
time: the same on a loaded machine as on a quiet one.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from psycopg import pq


@dataclass
class Trace:
    """What one traced stretch of a connection's conversation said."""

    lines: list[str] = field(default_factory=list)

    @property
    def round_trips(self) -> int:
        """How many times the server answered after the client had spoken."""
        return len(self.flights())

    def flights(self) -> list[str]:
        """What the client sent before each answer, one text per round trip (the trace's
        `F` lines; a statement prepared earlier shows as its name, not its SQL)."""
        out: list[str] = []
        sent: list[str] = []
        last = ""
        for line in self.lines:
            side = line.split("\t", 1)[0]
            if side == "F":
                sent.append(line)
            elif side == "B" and last == "F":
                out.append("\n".join(sent))
                sent = []
            if side in ("F", "B"):
                last = side
        return out


@contextmanager
def traced(pgconn: pq.abc.PGconn) -> Iterator[Trace]:
    """Trace `pgconn` (a psycopg connection's `.pgconn`) for the block; the `Trace` is
    filled when the block ends."""
    trace = Trace()
    with tempfile.TemporaryFile(mode="w+") as f:
        pgconn.trace(f.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield trace
        finally:
            pgconn.untrace()
            f.seek(0)
            trace.lines = f.read().splitlines()
