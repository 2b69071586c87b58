-- Operations: the audit of ops actions, and the index behind the token chart.

-- Every ops action (cancel, requeue) with who asked, what, when and what came of it.
-- Append-only; `run_id` is not a foreign key so the audit outlives a deleted run.
CREATE TABLE ops_audit (
    audit_id    bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    actor       text NOT NULL,
    action      text NOT NULL,
    run_id      uuid,
    params      jsonb NOT NULL DEFAULT '{}'::jsonb,
    result      text NOT NULL,
    detail      jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX ops_audit_at ON ops_audit (at DESC);
CREATE INDEX ops_audit_run ON ops_audit (run_id, at DESC);

-- Token usage per hour reads only `model.end` events of the last hours; a partial index
-- keeps that read off the rest of the log.
CREATE INDEX run_events_model_end_at ON run_events (created_at)
    WHERE category = 'model' AND type = 'model.end';

-- The fenced terminal writes (lifecycle `fenced` events) counted by the ops view.
CREATE INDEX run_events_fenced_at ON run_events (created_at)
    WHERE category = 'lifecycle' AND type = 'fenced';
