-- Long-term memory facts (SPEC M1, M6): one bucket per (agent_name, user_id). A fact is
-- identified inside its bucket by the hash of its normalised text, so a re-run extraction
-- (a reclaimed batch of the memory queue) updates the same row instead of adding a copy.
-- source_thread_id has no foreign key on purpose: a fact outlives the thread it came from.
CREATE TABLE memory_facts (
    fact_id           uuid PRIMARY KEY,
    agent_name        text NOT NULL,
    user_id           text NOT NULL,
    category          text NOT NULL,
    content           text NOT NULL,
    content_hash      text NOT NULL,
    confidence        real NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
    source_thread_id  text,
    trace_id          text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (agent_name, user_id, content_hash)
);

-- Injection reads a bucket's newest facts; the API lists a user's facts newest first.
CREATE INDEX memory_facts_bucket ON memory_facts (agent_name, user_id, updated_at DESC);
CREATE INDEX memory_facts_user ON memory_facts (user_id, updated_at DESC);
