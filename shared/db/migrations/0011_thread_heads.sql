-- A copy of each thread's head state as thread objects show it (`values`, `interrupts`),
-- so a page of thread objects is read from here instead of computing every thread's head
-- checkpoint through its graph (shared/state/head_copies.py).
--
-- A table beside `threads`, not columns on it: the thread row is read with `SELECT *` (and
-- locked) by every admission, patch and settle, which must not drag a state copy along.
-- `json`, not `jsonb`: the text is kept as encoded, so a read embeds it as it is (no
-- re-encoding, key order as `get_state` gives it) and `\u0000` in a message is accepted.
--
-- `checkpoint_id` is the head the copy was made from; a read uses the copy only while it
-- still names the thread's head checkpoint, else it reads the checkpoint (and refreshes the
-- copy). `values_json` NULL: the head's values were larger than THREADRUN_THREAD_VALUES_MAX_BYTES
-- and are read from the checkpoint.
CREATE TABLE IF NOT EXISTS thread_heads (
    thread_id      uuid PRIMARY KEY REFERENCES threads (thread_id) ON DELETE CASCADE,
    checkpoint_id  text NOT NULL,
    values_json    json,
    interrupts     json NOT NULL DEFAULT '{}'::json,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
