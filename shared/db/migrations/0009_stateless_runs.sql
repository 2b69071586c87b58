-- Runs without a thread (A1): such a run executes on a temporary thread of its own;
-- `delete` removes that thread (runs, checkpoints, workspace) once every run on it has
-- ended, `keep` leaves it to the caller. NULL: a run on a thread the client made.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS on_completion text
    CHECK (on_completion IN ('delete', 'keep'));
-- The recovery pass finds the temporary threads a crash left behind through this index.
CREATE INDEX IF NOT EXISTS runs_temporary_threads ON runs (thread_id)
    WHERE on_completion = 'delete';
