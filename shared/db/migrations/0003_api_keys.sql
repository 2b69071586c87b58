-- API keys hashed at rest (A4). The key itself is shown once by `threadrun keys create`;
-- only its sha256 is stored (the key holds 256 random bits, so a fast hash is enough),
-- with a short public prefix to name it in listings and revocations.
CREATE TABLE api_keys (
    key_id      uuid PRIMARY KEY,
    prefix      text NOT NULL UNIQUE,
    key_hash    bytea NOT NULL UNIQUE,
    user_id     text NOT NULL,
    role        text NOT NULL CHECK (role IN ('user', 'ops')),
    name        text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

CREATE INDEX api_keys_user ON api_keys (user_id, created_at);
