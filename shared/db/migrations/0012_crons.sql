-- Crons: a run payload fired on a schedule, on the cron's thread or on a new
-- temporary thread per firing (`thread_id` NULL; `on_run_completed` is that thread's fate).
-- `user_id` owns the cron and every run it fires. `payload` is the run request as the
-- client gave it (shown back); `request` is the typed RunRequest it was validated into at
-- create/update time, which each firing admits. `next_run_at` is the next due tick (NULL:
-- no tick left before `end_time`). Deleting the thread deletes its crons, so no firing
-- ever targets a deleted thread.
CREATE TABLE crons (
    cron_id           uuid PRIMARY KEY,
    user_id           text NOT NULL,
    assistant_id      text NOT NULL,
    thread_id         uuid REFERENCES threads (thread_id) ON DELETE CASCADE,
    schedule          text NOT NULL,
    timezone          text,
    payload           jsonb NOT NULL DEFAULT '{}'::jsonb,
    request           jsonb NOT NULL,
    metadata          jsonb NOT NULL DEFAULT '{}'::jsonb,
    enabled           boolean NOT NULL DEFAULT true,
    end_time          timestamptz,
    on_run_completed  text CHECK (on_run_completed IN ('delete', 'keep')),
    next_run_at       timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX crons_user_created ON crons (user_id, created_at DESC);
CREATE INDEX crons_thread ON crons (thread_id) WHERE thread_id IS NOT NULL;
-- The scheduler's scan: enabled crons by due time.
CREATE INDEX crons_due ON crons (next_run_at) WHERE enabled AND next_run_at IS NOT NULL;

-- One row per fired tick: the primary key is the exactly-once guarantee. It is inserted in
-- the same transaction as the run's admission and the cron's advance of `next_run_at`, so
-- a tick has either all three or none, and a second firing of the same tick (another
-- scheduler, a stale read) conflicts here and admits nothing. Not a foreign key: the
-- record of what fired (the audit) outlives a deleted cron, until the retention prunes it.
CREATE TABLE cron_firings (
    cron_id   uuid NOT NULL,
    tick_at   timestamptz NOT NULL,
    run_id    uuid,
    thread_id uuid,
    outcome   text NOT NULL,
    error     text,
    fired_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (cron_id, tick_at)
);
CREATE INDEX cron_firings_fired_at ON cron_firings (fired_at);
