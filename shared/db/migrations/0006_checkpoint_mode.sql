-- S4: the checkpoint channel mode every process sharing this database must run.
-- One row, written by the first process that starts; changed only by
-- `python -m shared.state.modes migrate --to delta`.
CREATE TABLE IF NOT EXISTS threadrun_checkpoint_mode (
    id              boolean PRIMARY KEY DEFAULT true CHECK (id),
    mode            text NOT NULL CHECK (mode IN ('full', 'delta')),
    snapshot_every  integer NOT NULL CHECK (snapshot_every > 0),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
