-- Delayed runs (`after_seconds`): a pending run is not dispatched or claimed before its
-- due time; the reaper dispatches it once due, so it survives any restart in between.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS due_at timestamptz;
