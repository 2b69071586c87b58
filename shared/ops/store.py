"""SQL of the ops view: read-only figures about runs, and the ops audit (STYLE 4).

State changes (cancel, requeue) go through RunStore / RunManager; this store only reads
runs and appends to `ops_audit`.
"""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from shared import serde
from shared.db import DictPool
from shared.db.statistics import TableStatistics, TableStats

RUNS_BY_STATUS_SQL = """
SELECT status, sum(n) AS n FROM run_status_counts GROUP BY status HAVING sum(n) <> 0
"""
"""The runs of each status from the deltas the triggers of migration 0018 keep (a few rows,
folded by the reaper), not a count of every run."""
FENCED_STATUS_SQL = """
SELECT count(*) AS n FROM run_events WHERE category = 'lifecycle' AND type = 'fenced'
"""
_RUN_COLUMNS = """
r.run_id::text, r.thread_id::text, t.owner AS user_id, r.assistant_id, r.status, r.owner,
r.owner_epoch, r.attempt, r.cancel_action, r.created_at, r.dispatched_at, r.started_at,
r.updated_at, r.ended_at, r.error, r.usage
"""
# Whether another run of the thread is ahead of this one: a pending run behind it is
# waiting its turn (R3 enqueue), not stuck; the reaper's head rule (R4) is the same.
_BEHIND = """
EXISTS (SELECT 1 FROM runs o
        WHERE o.thread_id = r.thread_id AND o.run_id <> r.run_id
          AND (o.status = 'running' OR (o.status = 'pending' AND o.seq < r.seq))) AS behind,
(r.due_at IS NULL OR r.due_at <= now()) AS due,
extract(epoch FROM now() - r.updated_at)::float8 AS idle_s
"""
LIST_RUNS_SQL = f"""
SELECT {_RUN_COLUMNS}, {_BEHIND} FROM runs r JOIN threads t USING (thread_id)
WHERE (%(status)s::text IS NULL OR r.status = %(status)s)
ORDER BY r.seq DESC
LIMIT %(limit)s
"""
INFLIGHT_RUNS_SQL = f"""
SELECT {_RUN_COLUMNS}, {_BEHIND} FROM runs r JOIN threads t USING (thread_id)
WHERE r.status IN ('pending', 'running')
ORDER BY r.seq
LIMIT %(limit)s
"""
GET_RUN_SQL = f"""
SELECT {_RUN_COLUMNS}, {_BEHIND} FROM runs r JOIN threads t USING (thread_id)
WHERE r.run_id = %(run_id)s
"""
# A prefix of the hex digits is a range of uuids (uuids sort by their bytes, as their hex
# reads), so the primary key answers it without scanning the table.
PREFIX_RUNS_SQL = f"""
SELECT {_RUN_COLUMNS}, {_BEHIND} FROM runs r JOIN threads t USING (thread_id)
WHERE r.run_id BETWEEN %(low)s::uuid AND %(high)s::uuid
ORDER BY r.run_id
LIMIT %(limit)s
"""
FAILURES_SQL = f"""
SELECT {_RUN_COLUMNS} FROM runs r JOIN threads t USING (thread_id)
WHERE r.status IN ('error', 'timeout')
  AND r.ended_at >= now() - make_interval(secs => %(window_s)s)
ORDER BY r.ended_at DESC
LIMIT %(limit)s
"""
ENDED_SQL = """
SELECT status, count(*) AS n FROM runs
WHERE ended_at >= now() - make_interval(secs => %(window_s)s)
GROUP BY status
"""
# Pending due heads of their thread that nobody dispatched for `stale_s` (a lost dispatch,
# R4): nothing runs ahead of them and no run of the thread ended within `stale_s` (the
# next run is dispatched right after its predecessor ends).
UNDISPATCHED_HEADS_SQL = """
SELECT r.run_id::text FROM runs r
WHERE r.status = 'pending' AND r.dispatched_at IS NULL
  AND (r.due_at IS NULL OR r.due_at <= now() - make_interval(secs => %(stale_s)s))
  AND r.updated_at < now() - make_interval(secs => %(stale_s)s)
  AND NOT EXISTS (
      SELECT 1 FROM runs o
      WHERE o.thread_id = r.thread_id AND o.run_id <> r.run_id
        AND (o.status = 'running' OR (o.status = 'pending' AND o.seq < r.seq)
             OR o.ended_at > now() - make_interval(secs => %(stale_s)s)))
"""
# Enabled crons and how late the latest-due one is: a scheduler that stopped ticking
# leaves crons due in the past.
CRONS_DUE_SQL = """
SELECT count(*) AS enabled,
       count(*) FILTER (WHERE next_run_at < now() - make_interval(secs => %(late_s)s)) AS overdue,
       extract(epoch FROM now() - min(next_run_at))::float8 AS most_late_s
FROM crons WHERE enabled AND next_run_at IS NOT NULL
"""
# The runs queue's oldest message: the pending run dispatched longest ago (runs waiting
# behind another run of their thread are not in the queue: dispatched_at is NULL).
OLDEST_DISPATCHED_SQL = """
SELECT extract(epoch FROM now() - min(dispatched_at))::float8 AS age_s
FROM runs WHERE status = 'pending' AND dispatched_at IS NOT NULL
"""
# Webhook deliveries due now: pending, past their backoff, their run ended (or gone). Their
# age counts from when they became due (the retry's time, else the run's end). The partial
# index `webhook_deliveries_pending` holds only pending rows.
WEBHOOKS_DUE_SQL = """
SELECT count(*) AS due,
       extract(epoch FROM now() - min(coalesce(d.next_attempt_at, r.ended_at, d.created_at)))::float8
           AS oldest_s
FROM webhook_deliveries d LEFT JOIN runs r ON r.run_id = d.run_id
WHERE d.state = 'pending' AND (d.next_attempt_at IS NULL OR d.next_attempt_at <= now())
  AND (r.run_id IS NULL OR r.status NOT IN ('pending', 'running'))
"""
STUCK_CANDIDATES_SQL = """
SELECT run_id::text FROM runs
WHERE status = 'running' AND updated_at < now() - make_interval(secs => %(min_age_s)s)
"""
TOKENS_PER_HOUR_SQL = """
SELECT date_trunc('hour', created_at) AS hour,
       sum(coalesce((payload -> 'usage' ->> 'input_tokens')::bigint, 0)) AS input_tokens,
       sum(coalesce((payload -> 'usage' ->> 'output_tokens')::bigint, 0)) AS output_tokens
FROM run_events
WHERE category = 'model' AND type = 'model.end' AND created_at >= to_timestamp(%(since)s)
GROUP BY 1 ORDER BY 1
"""
RUN_STATUSES_SQL = """
SELECT run_id::text, status, attempt, error FROM runs WHERE run_id = ANY(%(ids)s::uuid[])
"""
INSERT_AUDIT_SQL = """
INSERT INTO ops_audit (actor, action, run_id, params, result, detail)
VALUES (%(actor)s, %(action)s, %(run_id)s, %(params)s, %(result)s, %(detail)s)
RETURNING audit_id, at, actor, action, run_id::text, params, result, detail
"""
LIST_AUDIT_SQL = """
SELECT audit_id, at, actor, action, run_id::text, params, result, detail FROM ops_audit
WHERE (%(run_id)s::uuid IS NULL OR run_id = %(run_id)s)
ORDER BY audit_id DESC
LIMIT %(limit)s
"""


def _json(value: Any) -> Jsonb:
    return Jsonb(value, dumps=serde.dumps_str)


class OpsStore:
    """Ops reads over runs/run_events and the `ops_audit` table."""

    def __init__(self, pool: DictPool) -> None:
        self._pool = pool

    def table_stats(self) -> list[TableStats]:
        """Each table's statistics state (the health strip's `statistics` tile)."""
        return TableStatistics(self._pool).read()

    def runs_by_status(self) -> dict[str, int]:
        """How many runs have each status."""
        with self._pool.connection() as conn:
            return {r["status"]: int(r["n"]) for r in conn.execute(RUNS_BY_STATUS_SQL)}

    def fenced_status_writes(self) -> int:
        """Terminal-status writes refused to a stale owner (lifecycle `fenced` events)."""
        with self._pool.connection() as conn:
            row = conn.execute(FENCED_STATUS_SQL).fetchone()
        return int(row["n"]) if row else 0

    def list_runs(self, *, status: str | None, limit: int) -> list[dict[str, Any]]:
        """Runs of every user, newest first."""
        with self._pool.connection() as conn:
            return conn.execute(LIST_RUNS_SQL, {"status": status, "limit": limit}).fetchall()

    def inflight_runs(self, limit: int) -> list[dict[str, Any]]:
        """Pending and running runs, oldest first."""
        with self._pool.connection() as conn:
            return conn.execute(INFLIGHT_RUNS_SQL, {"limit": limit}).fetchall()

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        """One run with its thread's owner as `user_id`."""
        with self._pool.connection() as conn:
            return conn.execute(GET_RUN_SQL, {"run_id": run_id}).fetchone()

    def runs_by_prefix(self, low: str, high: str, limit: int) -> list[dict[str, Any]]:
        """Runs whose id lies in [low, high] (the ends of an id prefix), by id."""
        with self._pool.connection() as conn:
            params = {"low": low, "high": high, "limit": limit}
            return conn.execute(PREFIX_RUNS_SQL, params).fetchall()

    def failures(self, window_s: float, limit: int) -> list[dict[str, Any]]:
        """Runs that ended `error` or `timeout` within `window_s`, latest end first."""
        with self._pool.connection() as conn:
            return conn.execute(FAILURES_SQL, {"window_s": window_s, "limit": limit}).fetchall()

    def ended_by_status(self, window_s: float) -> dict[str, int]:
        """How many runs ended with each terminal status within `window_s`."""
        with self._pool.connection() as conn:
            rows = conn.execute(ENDED_SQL, {"window_s": window_s})
            return {r["status"]: int(r["n"]) for r in rows}

    def undispatched_heads(self, stale_s: float) -> list[str]:
        """Pending due head runs nobody dispatched for `stale_s` (see the SQL)."""
        with self._pool.connection() as conn:
            return [r["run_id"] for r in conn.execute(UNDISPATCHED_HEADS_SQL, {"stale_s": stale_s})]

    def crons_due(self, late_s: float) -> dict[str, Any]:
        """Enabled crons, how many are overdue by more than `late_s`, the most late (s)."""
        with self._pool.connection() as conn:
            row = conn.execute(CRONS_DUE_SQL, {"late_s": late_s}).fetchone()
        assert row is not None
        late = row["most_late_s"]
        return {
            "enabled": int(row["enabled"]),
            "overdue": int(row["overdue"]),
            "most_late_s": None if late is None else max(0.0, float(late)),
        }

    def oldest_dispatched_age_s(self) -> float | None:
        """Seconds since the oldest still-pending dispatch (None when none waits)."""
        with self._pool.connection() as conn:
            row = conn.execute(OLDEST_DISPATCHED_SQL).fetchone()
        return None if row is None or row["age_s"] is None else float(row["age_s"])

    def webhooks_due(self) -> dict[str, Any]:
        """Webhook deliveries due now in the outbox and the oldest one's wait (s, or None)."""
        with self._pool.connection() as conn:
            row = conn.execute(WEBHOOKS_DUE_SQL).fetchone()
        assert row is not None
        oldest = row["oldest_s"]
        return {"due": int(row["due"]), "oldest_s": None if oldest is None else max(0.0, oldest)}

    def stuck_candidates(self, min_age_s: float) -> list[str]:
        """Running runs not updated for `min_age_s` (stuck if their lease is gone)."""
        with self._pool.connection() as conn:
            return [
                r["run_id"] for r in conn.execute(STUCK_CANDIDATES_SQL, {"min_age_s": min_age_s})
            ]

    def tokens_per_hour(self, since: int) -> dict[int, tuple[int, int]]:
        """Model tokens (input, output) by hour (of the `model.end` event, its start in epoch
        seconds) from the hour starting at `since` (epoch seconds) on."""
        with self._pool.connection() as conn:
            rows = conn.execute(TOKENS_PER_HOUR_SQL, {"since": since}).fetchall()
        return {
            int(r["hour"].timestamp()): (int(r["input_tokens"]), int(r["output_tokens"]))
            for r in rows
        }

    def run_statuses(self, run_ids: list[str]) -> dict[str, dict[str, Any]]:
        """{run_id: {status, attempt, error}} of the runs that still exist."""
        if not run_ids:
            return {}
        with self._pool.connection() as conn:
            rows = conn.execute(RUN_STATUSES_SQL, {"ids": run_ids}).fetchall()
        return {r["run_id"]: r for r in rows}

    def audit(
        self,
        *,
        actor: str,
        action: str,
        run_id: str | None,
        params: dict[str, Any],
        result: str,
        detail: dict[str, Any],
    ) -> dict[str, Any]:
        """Append one audit record and return it."""
        with self._pool.connection() as conn:
            row = conn.execute(
                INSERT_AUDIT_SQL,
                {
                    "actor": actor,
                    "action": action,
                    "run_id": run_id,
                    "params": _json(params),
                    "result": result,
                    "detail": _json(detail),
                },
            ).fetchone()
        assert row is not None
        return row

    def list_audit(self, *, run_id: str | None, limit: int) -> list[dict[str, Any]]:
        """Audit records, newest first."""
        with self._pool.connection() as conn:
            return conn.execute(LIST_AUDIT_SQL, {"run_id": run_id, "limit": limit}).fetchall()
