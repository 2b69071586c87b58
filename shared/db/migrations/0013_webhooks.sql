-- Webhooks: a run may name a URL that is POSTed the run once it has ended.
-- `runs.webhook` is the URL as the client gave it (shown with the run); the delivery
-- itself is an outbox row written in the run's admission transaction, so a run that ends
-- can never lose its webhook, whoever ends it and whatever dies in between.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS webhook text;

-- One delivery per run. No foreign key to runs on purpose: the row outlives its run (a
-- temporary thread is deleted once its run ended, a user may delete a thread) so that a
-- delivery whose body is frozen still goes out, and its outcome stays queryable.
--   state            pending -> delivered | failed (terminal; never sent again)
--   attempts         attempts claimed so far (an attempt is counted when it is claimed)
--   next_attempt_at  NULL: as soon as the run ends; else not before (backoff)
--   claimed_until    an attempt in flight (a duplicate task finds it claimed and leaves)
--   dispatched_at    last time the reaper's sweep sent the task (not more than once per
--                    `webhook_stale_s`)
--   body             the exact bytes sent, frozen by the first attempt: every retry sends
--                    the same body, signed anew
CREATE TABLE webhook_deliveries (
    run_id           uuid PRIMARY KEY,
    thread_id        uuid NOT NULL,
    url              text NOT NULL,
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    last_status      integer,
    last_error       text,
    next_attempt_at  timestamptz,
    claimed_until    timestamptz,
    dispatched_at    timestamptz,
    delivered_at     timestamptz,
    body             bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
-- The sweep reads only pending rows.
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (next_attempt_at)
    WHERE state = 'pending';
-- A temporary thread waits for the bodies of its runs' deliveries before it is deleted.
CREATE INDEX webhook_deliveries_unfrozen ON webhook_deliveries (thread_id)
    WHERE state = 'pending' AND body IS NULL;

-- The deployment's signing secret when THREADRUN_WEBHOOK_SECRET is not set: generated once
-- by the first process that needs it (INSERT … ON CONFLICT DO NOTHING), so every worker of
-- the deployment signs with the same one.
CREATE TABLE webhook_secret (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    secret      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
