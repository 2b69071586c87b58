"""SQL of the webhook outbox (`webhook_deliveries`). Only this module speaks SQL about it.

The row is inserted with the run (`insert_in`, inside `RunStore.admit`'s transaction); an
attempt is *claimed* before it is made (`claim`: attempts + 1, `claimed_until` set, only
when the run has ended and the backoff has passed), so duplicate tasks, the low-latency
dispatch and the reaper's sweep can race freely and one attempt goes out at a time; its
result is written with its audit event in one transaction (`record`), fenced by the
attempt number. A `delivered` or `failed` row is never claimed again.
"""

from __future__ import annotations

import datetime as dt
import enum
import secrets
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import DictRow

from shared.db import DictPool
from shared.journal import Category, append_in


class DeliveryState(enum.StrEnum):
    """Where a delivery is: still to be made, or done for good."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


INSERT_SQL = """
INSERT INTO webhook_deliveries (run_id, thread_id, url) VALUES (%(run_id)s, %(thread_id)s, %(url)s)
ON CONFLICT (run_id) DO NOTHING
"""
CLAIM_SQL = """
UPDATE webhook_deliveries d
SET attempts = d.attempts + 1, claimed_until = now() + make_interval(secs => %(lease_s)s),
    updated_at = now()
WHERE d.run_id = %(run_id)s AND d.state = 'pending'
  AND (d.next_attempt_at IS NULL OR d.next_attempt_at <= now())
  AND (d.claimed_until IS NULL OR d.claimed_until < now())
  AND (d.body IS NOT NULL OR NOT EXISTS (
        SELECT 1 FROM runs r WHERE r.run_id = d.run_id AND r.status IN ('pending', 'running')))
RETURNING d.run_id::text, d.thread_id::text, d.url, d.attempts, d.body
"""
FREEZE_SQL = """
UPDATE webhook_deliveries SET body = %(body)s WHERE run_id = %(run_id)s AND body IS NULL
RETURNING body
"""
GET_BODY_SQL = "SELECT body FROM webhook_deliveries WHERE run_id = %(run_id)s"
RECORD_SQL = """
UPDATE webhook_deliveries
SET state = %(state)s, last_status = %(status)s, last_error = %(error)s,
    next_attempt_at = CASE WHEN %(delay_s)s::float8 IS NULL THEN next_attempt_at
                           ELSE now() + make_interval(secs => %(delay_s)s::float8) END,
    delivered_at = CASE WHEN %(state)s = 'delivered' THEN now() END,
    claimed_until = NULL, updated_at = now()
WHERE run_id = %(run_id)s AND attempts = %(attempt)s AND state = 'pending'
RETURNING run_id
"""
SWEEP_SQL = """
UPDATE webhook_deliveries d SET dispatched_at = now()
WHERE d.state = 'pending'
  AND (d.claimed_until IS NULL OR d.claimed_until < now())
  AND (d.dispatched_at IS NULL OR d.dispatched_at < now() - make_interval(secs => %(stale_s)s))
  AND CASE WHEN d.next_attempt_at IS NOT NULL
           -- a retry whose countdown message is overdue
           THEN d.next_attempt_at < now() - make_interval(secs => %(stale_s)s)
           -- a first attempt: the run ended a while ago (or vanished unsent)
           ELSE NOT EXISTS (
                SELECT 1 FROM runs r WHERE r.run_id = d.run_id
                  AND (r.status IN ('pending', 'running')
                       OR r.ended_at >= now() - make_interval(secs => %(stale_s)s)))
      END
RETURNING d.run_id::text
"""
"""Overdue by `stale_s`: the low-latency dispatch (or the retry's countdown) had its
chance first, so the sweep only re-sends what a dead worker or a lost message left."""
GET_SQL = "SELECT * FROM webhook_deliveries WHERE run_id = %(run_id)s"
TARGET_SQL = """
SELECT d.url, t.owner FROM webhook_deliveries d
LEFT JOIN threads t ON t.thread_id = d.thread_id
WHERE d.run_id = %(run_id)s AND d.state = 'pending'
"""
GET_SECRET_SQL = "SELECT secret FROM webhook_secret WHERE singleton"
INSERT_SECRET_SQL = """
INSERT INTO webhook_secret (singleton, secret) VALUES (true, %(secret)s) ON CONFLICT DO NOTHING
"""


@dataclass(frozen=True, slots=True)
class ClaimedAttempt:
    """An attempt this process may make: its number and the frozen body, if any yet."""

    run_id: str
    thread_id: str
    url: str
    attempt: int
    body: bytes | None


@dataclass(frozen=True, slots=True)
class Delivery:
    """A `webhook_deliveries` row."""

    run_id: str
    url: str
    state: DeliveryState
    attempts: int
    last_status: int | None
    last_error: str | None
    next_attempt_at: dt.datetime | None
    delivered_at: dt.datetime | None
    body: bytes | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Delivery:
        """The delivery of a row."""
        body = row.get("body")
        return cls(
            run_id=str(row["run_id"]),
            url=row["url"],
            state=DeliveryState(row["state"]),
            attempts=int(row["attempts"]),
            last_status=row.get("last_status"),
            last_error=row.get("last_error"),
            next_attempt_at=row.get("next_attempt_at"),
            delivered_at=row.get("delivered_at"),
            body=bytes(body) if body is not None else None,
        )


def insert_in(conn: psycopg.Connection[DictRow], run_id: str, thread_id: str, url: str) -> None:
    """The run's delivery, in the caller's (the admission's) transaction."""
    conn.execute(INSERT_SQL, {"run_id": run_id, "thread_id": thread_id, "url": url})


class WebhookStore:
    """The outbox in Postgres."""

    def __init__(self, pool: DictPool) -> None:
        self._pool = pool

    def get(self, run_id: str) -> Delivery | None:
        """The run's delivery, if it has one."""
        with self._pool.connection() as conn:
            row = conn.execute(GET_SQL, {"run_id": run_id}).fetchone()
        return None if row is None else Delivery.from_row(row)

    def target(self, run_id: str) -> tuple[str, str | None] | None:
        """A pending delivery's URL and its thread's owner (None when the thread is gone
        already); None when no delivery is pending."""
        with self._pool.connection() as conn:
            row = conn.execute(TARGET_SQL, {"run_id": run_id}).fetchone()
        return None if row is None else (str(row["url"]), row["owner"])

    def claim(self, run_id: str, lease_s: float) -> ClaimedAttempt | None:
        """Claim the next attempt (None: no delivery, not due, in flight, or done)."""
        with self._pool.connection() as conn:
            row = conn.execute(CLAIM_SQL, {"run_id": run_id, "lease_s": lease_s}).fetchone()
        if row is None:
            return None
        body = row["body"]
        return ClaimedAttempt(
            row["run_id"],
            row["thread_id"],
            row["url"],
            int(row["attempts"]),
            bytes(body) if body is not None else None,
        )

    def freeze(self, run_id: str, body: bytes) -> bytes:
        """Keep the body every attempt sends; the body already frozen wins a race."""
        with self._pool.connection() as conn:
            row = conn.execute(FREEZE_SQL, {"run_id": run_id, "body": body}).fetchone()
            if row is None:
                row = conn.execute(GET_BODY_SQL, {"run_id": run_id}).fetchone()
        return bytes(row["body"]) if row is not None and row["body"] is not None else body

    def record(
        self,
        run_id: str,
        attempt: int,
        *,
        state: DeliveryState,
        status: int | None,
        error: str | None,
        delay_s: float | None,
        event: dict[str, Any],
    ) -> bool:
        """Write an attempt's result and its `delivery`/`webhook.attempt` audit event in one
        transaction (the event only while the run exists); False if the attempt was no
        longer ours (fenced by its number)."""
        with self._pool.connection() as conn, conn.transaction():
            row = conn.execute(
                RECORD_SQL,
                {
                    "run_id": run_id,
                    "attempt": attempt,
                    "state": state,
                    "status": status,
                    "error": error,
                    "delay_s": delay_s,
                },
            ).fetchone()
            if row is None:
                return False
            append_in(conn, run_id, Category.DELIVERY, "webhook.attempt", event)
        return True

    def sweep(self, stale_s: float) -> list[str]:
        """Runs whose delivery is overdue and was not dispatched for `stale_s` (marked
        dispatched now)."""
        with self._pool.connection() as conn:
            return [r["run_id"] for r in conn.execute(SWEEP_SQL, {"stale_s": stale_s})]

    def deployment_secret(self) -> bytes:
        """The generated signing secret of the deployment (made once, kept in Postgres)."""
        with self._pool.connection() as conn:
            conn.execute(INSERT_SECRET_SQL, {"secret": secrets.token_hex(32)})
            row = conn.execute(GET_SECRET_SQL).fetchone()
        assert row is not None  # inserted above or before
        return str(row["secret"]).encode()
