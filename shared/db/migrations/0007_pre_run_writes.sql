-- R5: the pending writes of the pre-run checkpoint, copied when the run starts. A resume
-- run adds its own writes to that very checkpoint, so the rollback point is the
-- checkpoint id plus this copy (values serialized by the checkpoint saver's serde).
ALTER TABLE runs ADD COLUMN IF NOT EXISTS pre_run_writes jsonb;
