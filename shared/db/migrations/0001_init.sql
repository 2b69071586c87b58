-- threads, runs and the append-only run event log (SPEC §0, R1, R8, J4).
CREATE TABLE threads (
    thread_id   uuid PRIMARY KEY,
    owner       text NOT NULL,
    metadata    jsonb NOT NULL DEFAULT '{}'::jsonb,
    status      text NOT NULL DEFAULT 'idle'
                CHECK (status IN ('idle', 'busy', 'interrupted', 'error')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX threads_owner_created ON threads (owner, created_at DESC);
CREATE INDEX threads_metadata ON threads USING gin (metadata jsonb_path_ops);

CREATE TABLE runs (
    run_id                 uuid PRIMARY KEY,
    seq                    bigserial NOT NULL UNIQUE,
    thread_id              uuid NOT NULL REFERENCES threads (thread_id) ON DELETE CASCADE,
    assistant_id           text NOT NULL,
    graph_id               text NOT NULL,
    status                 text NOT NULL DEFAULT 'pending'
                           CHECK (status IN ('pending', 'running', 'success', 'error',
                                             'timeout', 'interrupted')),
    input                  jsonb,
    command                jsonb,
    config                 jsonb NOT NULL DEFAULT '{}'::jsonb,
    context                jsonb,
    metadata               jsonb NOT NULL DEFAULT '{}'::jsonb,
    kwargs                 jsonb NOT NULL DEFAULT '{}'::jsonb,
    multitask_strategy     text NOT NULL,
    on_disconnect          text NOT NULL DEFAULT 'continue',
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now(),
    dispatched_at          timestamptz,
    started_at             timestamptz,
    ended_at               timestamptz,
    owner                  text,
    owner_epoch            bigint NOT NULL DEFAULT 0,
    attempt                integer NOT NULL DEFAULT 0,
    pre_run_checkpoint_id  text,
    cancel_action          text CHECK (cancel_action IN ('interrupt', 'rollback')),
    error                  jsonb,
    usage                  jsonb,
    last_message           text
);
-- R3: at most one running run per thread, enforced by the database itself.
CREATE UNIQUE INDEX runs_one_running_per_thread ON runs (thread_id) WHERE status = 'running';
CREATE INDEX runs_thread_inflight ON runs (thread_id, seq) WHERE status IN ('pending', 'running');
CREATE INDEX runs_thread_created ON runs (thread_id, created_at DESC);
CREATE INDEX runs_pending_dispatch ON runs (dispatched_at) WHERE status = 'pending';
CREATE INDEX runs_running ON runs (started_at) WHERE status = 'running';

-- Append-only audit log (G1): never rebuilt from the live stream, never the checkpoint.
CREATE TABLE run_events (
    run_id      uuid NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    seq         bigint NOT NULL,
    thread_id   uuid NOT NULL,
    category    text NOT NULL,
    type        text NOT NULL,
    payload     jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX run_events_thread ON run_events (thread_id, created_at);
