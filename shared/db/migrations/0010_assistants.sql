-- Assistants (SPEC A1): versioned configurations of a graph of the config. `owner` is the
-- user who created it, or NULL for a graph's system assistant (id uuid5 of the graph name,
-- upserted by every web process at start): every user reads those, no user writes them.
-- `version` is the current version, which `POST /assistants/{id}/latest` may move back.
CREATE TABLE assistants (
    assistant_id  uuid PRIMARY KEY,
    graph_id      text NOT NULL,
    owner         text,
    name          text NOT NULL,
    description   text,
    metadata      jsonb NOT NULL DEFAULT '{}'::jsonb,
    config        jsonb NOT NULL DEFAULT '{}'::jsonb,
    context       jsonb NOT NULL DEFAULT '{}'::jsonb,
    version       integer NOT NULL DEFAULT 1 CHECK (version >= 1),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX assistants_owner_created ON assistants (owner, created_at DESC);
CREATE INDEX assistants_system ON assistants (graph_id) WHERE owner IS NULL;
CREATE INDEX assistants_metadata ON assistants USING gin (metadata jsonb_path_ops);

-- Every version ever written, append-only; a PATCH adds max(version) + 1 while holding the
-- assistant's row lock, so concurrent updates get distinct versions.
CREATE TABLE assistant_versions (
    assistant_id  uuid NOT NULL REFERENCES assistants (assistant_id) ON DELETE CASCADE,
    version       integer NOT NULL CHECK (version >= 1),
    graph_id      text NOT NULL,
    config        jsonb NOT NULL DEFAULT '{}'::jsonb,
    context       jsonb NOT NULL DEFAULT '{}'::jsonb,
    metadata      jsonb NOT NULL DEFAULT '{}'::jsonb,
    name          text NOT NULL,
    description   text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (assistant_id, version)
);
