-- The run journal's event store (SPEC J4, J5): one seq allocator per run, idempotent
-- delivery receipts, and the index that lists a thread's events in run order.

-- J4: every writer of run_events (the journal, delivery receipts, RunStore's lifecycle
-- events) takes its seq from this row with an upsert in the same statement as the
-- insert, so concurrent appenders from several processes serialise on one narrow row
-- for the length of one statement and never collide on (run_id, seq). Seeded from the
-- events written before this migration.
CREATE TABLE run_event_seqs (
    run_id    uuid PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
    last_seq  bigint NOT NULL
);
INSERT INTO run_event_seqs (run_id, last_seq)
SELECT run_id, max(seq) FROM run_events GROUP BY run_id;

-- J5: at most one `run.delivery` receipt per (run, attempt); a retried write that had in
-- fact committed finds it here instead of writing a second one.
CREATE UNIQUE INDEX run_events_delivery_once ON run_events (run_id, (payload ->> 'attempt'))
    WHERE category = 'delivery' AND type = 'run.delivery';

-- Listing a thread's events in run order (runs.seq, then the event seq).
CREATE INDEX runs_thread_seq ON runs (thread_id, seq);
