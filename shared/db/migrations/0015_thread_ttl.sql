-- Thread expiry (SPEC P6): `checkpointer.ttl` of langgraph.json, or the `ttl` a client gives
-- a thread (POST /threads, PATCH /threads/{id}). `ttl_minutes` NULL: the thread never
-- expires. `expires_at` is refreshed to now() + ttl_minutes on activity (create, patch, a
-- run's admission: shared/runs/queries.sql), not when a run ends, so a thread whose run
-- outlived its TTL is swept by the first sweep after the run ended (shared/retention/).
-- `keep_latest` threads get `expires_at` NULL once pruned, until their next activity.
ALTER TABLE threads ADD COLUMN IF NOT EXISTS ttl_strategy text
    CHECK (ttl_strategy IN ('delete', 'keep_latest'));
ALTER TABLE threads ADD COLUMN IF NOT EXISTS ttl_minutes double precision
    CHECK (ttl_minutes > 0);
ALTER TABLE threads ADD COLUMN IF NOT EXISTS expires_at timestamptz;
-- The sweep: WHERE expires_at <= now() ORDER BY expires_at LIMIT sweep_limit.
CREATE INDEX IF NOT EXISTS threads_expires_at ON threads (expires_at)
    WHERE expires_at IS NOT NULL;
