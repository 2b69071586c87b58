-- The SQL of threads and runs, by name (shared/runs/queries.py loads it once at import).
--
-- A section starts with a `-- name: <query>` line; the `--` lines right after it say why
-- the query is written as it is (they are not sent); the statement follows, up to the next
-- header, with no trailing semicolon (a statement may be embedded in another, as
-- `with_event` does with `claim`). Parameters are psycopg's `%(name)s`. SQL composed at run
-- time stays in Python beside the code that composes it: `search_threads`
-- (shared/runs/threads_store.py) and the claim's lifecycle event (shared/runs/claims.py).


-- threads (shared/runs/threads_store.py) ------------------------------------------------

-- name: insert_thread
-- Either key may conflict: the storage id, or the owner's public id (a client that chose
-- an id its own server-made thread has). `ttl_minutes` NULL: no expiry (P6).
INSERT INTO threads (thread_id, public_id, owner, metadata, ttl_strategy, ttl_minutes, expires_at)
VALUES (%(thread_id)s, coalesce(%(public_id)s::uuid, %(thread_id)s::uuid), %(owner)s, %(metadata)s,
        %(ttl_strategy)s, %(ttl_minutes)s::float8,
        now() + %(ttl_minutes)s::float8 * interval '1 minute')
ON CONFLICT DO NOTHING
RETURNING *

-- name: thread_quota
-- How many threads the owner has (the sum of its shard rows in `owner_counts`, at most 16,
-- kept by the triggers of migration 0017), and whether the one about to be created exists
-- already (then creating it is no new thread: `if_exists=do_nothing`, `if_not_exists=create`).
SELECT (SELECT coalesce(sum(n), 0) FROM owner_counts
        WHERE kind = 'threads' AND owner = %(owner)s) AS n,
       EXISTS (SELECT 1 FROM threads WHERE thread_id = %(thread_id)s::uuid
               OR (owner = %(owner)s AND public_id = %(public_id)s::uuid)) AS present

-- name: resolve_thread
SELECT thread_id::text FROM threads WHERE owner = %(owner)s AND public_id = %(public_id)s

-- name: public_ids
SELECT thread_id::text, public_id::text FROM threads
WHERE owner = %(owner)s AND thread_id = ANY(%(ids)s::uuid[]) AND public_id <> thread_id

-- name: get_thread_by_public
SELECT * FROM threads WHERE owner = %(owner)s AND public_id = %(public_id)s

-- name: insert_thread_copy
-- A copy keeps its source's TTL, counted from the copy.
INSERT INTO threads (thread_id, owner, metadata, status, ttl_strategy, ttl_minutes, expires_at)
VALUES (%(thread_id)s, %(owner)s, %(metadata)s, %(status)s, %(ttl_strategy)s,
        %(ttl_minutes)s::float8, now() + %(ttl_minutes)s::float8 * interval '1 minute')
RETURNING *

-- name: get_thread
SELECT * FROM threads WHERE thread_id = %(thread_id)s AND owner = %(owner)s

-- name: lock_thread
-- `get_thread`, locked: the thread row lock serialises admissions (R2) and cancels.
SELECT * FROM threads WHERE thread_id = %(thread_id)s AND owner = %(owner)s FOR UPDATE

-- name: lock_thread_by_id
SELECT thread_id, owner FROM threads WHERE thread_id = %(thread_id)s FOR UPDATE

-- name: patch_thread
-- A patch is activity: it refreshes the expiry (P6); with `set_ttl` it also replaces the TTL.
UPDATE threads SET metadata = metadata || %(metadata)s, updated_at = now(),
       ttl_strategy = CASE WHEN %(set_ttl)s THEN %(ttl_strategy)s ELSE ttl_strategy END,
       ttl_minutes = CASE WHEN %(set_ttl)s THEN %(ttl_minutes)s::float8 ELSE ttl_minutes END,
       expires_at = now() + CASE WHEN %(set_ttl)s THEN %(ttl_minutes)s::float8
                                 ELSE ttl_minutes END * interval '1 minute'
WHERE thread_id = %(thread_id)s AND owner = %(owner)s
RETURNING *

-- name: lock_thread_crons
-- The thread's crons, locked before the thread row: a cron firing (shared/crons/store.py)
-- holds its cron rows and then locks the thread to admit the run, so a delete that locked the
-- thread first and reached the crons through the cascade took the same two locks the other
-- way round and one of the two was aborted as a deadlock victim.
SELECT c.cron_id FROM crons c JOIN threads t ON t.thread_id = c.thread_id
WHERE c.thread_id = %(thread_id)s AND t.owner = %(owner)s
ORDER BY c.cron_id
FOR UPDATE OF c

-- name: delete_thread
DELETE FROM threads WHERE thread_id = %(thread_id)s AND owner = %(owner)s RETURNING thread_id


-- expiry (P6): the sweep's statements (shared/runs/threads_store.py, shared/retention/) -----

-- name: expired_threads
-- Candidates only, no lock: each is then taken in a transaction of its own
-- (`lock_expired_thread`), so a batch never holds more than one thread at a time.
SELECT thread_id::text, owner, ttl_strategy FROM threads
WHERE expires_at <= coalesce(%(at)s::timestamptz, now())
ORDER BY expires_at
LIMIT %(limit)s

-- name: lock_thread_crons_by_id
-- `lock_thread_crons` for a thread of any owner (the sweep's): crons before the thread.
SELECT cron_id FROM crons WHERE thread_id = %(thread_id)s ORDER BY cron_id FOR UPDATE

-- name: lock_expired_thread
-- SKIP LOCKED: a thread another transaction holds (an admission, a second sweeper, a
-- delete) is left for the next sweep rather than waited for. Re-checks the expiry under
-- the lock: an admission that committed since the candidates were read refreshed it.
SELECT thread_id::text, owner, ttl_strategy FROM threads
WHERE thread_id = %(thread_id)s AND expires_at <= coalesce(%(at)s::timestamptz, now())
FOR UPDATE SKIP LOCKED

-- name: thread_has_work
-- Under the thread lock (admissions take it to insert, so no run can appear until we
-- commit): an inflight run, or a webhook delivery still pending, keeps the thread.
SELECT EXISTS (SELECT 1 FROM runs
               WHERE thread_id = %(thread_id)s AND status IN ('pending', 'running'))
    OR EXISTS (SELECT 1 FROM webhook_deliveries
               WHERE thread_id = %(thread_id)s AND state = 'pending') AS busy

-- name: thread_run_ids
SELECT run_id::text FROM runs WHERE thread_id = %(thread_id)s ORDER BY seq

-- name: delete_thread_webhooks
-- The outbox rows of an expired thread (their bodies hold the thread's values); a user's
-- delete keeps them so that a frozen delivery still goes out (migration 0013).
DELETE FROM webhook_deliveries WHERE thread_id = %(thread_id)s

-- name: clear_expiry
-- A `keep_latest` thread once pruned: nothing more to prune until its next activity.
UPDATE threads SET expires_at = NULL WHERE thread_id = %(thread_id)s

-- name: count_threads
SELECT count(*) AS n FROM threads
WHERE owner = %(owner)s AND metadata @> %(metadata)s
  AND (%(status)s::text IS NULL OR status = %(status)s)


-- the thread's run queue (shared/runs/thread_queue.py) ----------------------------------

-- name: inflight_runs
SELECT run_id::text, status, attempt FROM runs
WHERE thread_id = %(thread_id)s AND status IN ('pending', 'running')
ORDER BY seq
LIMIT %(limit)s

-- name: settle_thread
-- `settle_in` in one statement (one round trip): a running run of the thread hands over
-- when it ends; else the next pending run is dispatched if due (a delayed one not yet due
-- keeps the thread busy: the reaper dispatches it once due, R4); else the thread takes its
-- idle status. Its data-modifying parts run whether or not the SELECT reads them.
WITH running AS (
    SELECT 1 FROM runs WHERE thread_id = %(thread_id)s AND status = 'running' LIMIT 1
), nxt AS (
    SELECT run_id, (due_at IS NULL OR due_at <= now()) AS due FROM runs
    WHERE thread_id = %(thread_id)s AND status = 'pending' AND NOT EXISTS (SELECT FROM running)
    ORDER BY seq LIMIT 1
), dispatched AS (
    UPDATE runs SET dispatched_at = now() WHERE run_id = (SELECT run_id FROM nxt WHERE due)
    RETURNING run_id::text
), settled AS (
    UPDATE threads SET status = %(status)s, updated_at = now()
    WHERE thread_id = %(thread_id)s
      AND NOT EXISTS (SELECT FROM running) AND NOT EXISTS (SELECT FROM nxt)
)
SELECT (SELECT run_id FROM dispatched) AS next_run_id


-- admission (R2): one transaction, thread row locked, no IO in between -------------------
-- (shared/runs/admission_store.py)

-- name: insert_run
INSERT INTO runs (run_id, thread_id, assistant_id, graph_id, status, input, command, config,
                  context, metadata, kwargs, multitask_strategy, on_disconnect, on_completion,
                  webhook, dispatched_at, due_at, created_at, updated_at)
VALUES (%(run_id)s, %(thread_id)s, %(assistant_id)s, %(graph_id)s, 'pending', %(input)s,
        %(command)s, %(config)s, %(context)s, %(metadata)s, %(kwargs)s,
        %(multitask_strategy)s, %(on_disconnect)s, %(on_completion)s, %(webhook)s,
        CASE WHEN %(dispatch)s THEN now() END,
        CASE WHEN %(after_s)s > 0 THEN clock_timestamp() + make_interval(secs => %(after_s)s) END,
        -- clock_timestamp(), not now(): taken after the thread lock, so created_at
        -- follows admission (= execution) order, not transaction start order.
        clock_timestamp(), clock_timestamp())
RETURNING *

-- name: mark_thread_busy
-- A run's admission is activity: the expiry is refreshed (P6); a run's end is not, so a
-- thread whose run outlived its TTL goes at the first sweep after the run.
UPDATE threads SET status = 'busy', updated_at = now(),
       expires_at = now() + ttl_minutes * interval '1 minute',
       metadata = metadata || jsonb_build_object('graph_id', %(graph_id)s::text,
                                                 'assistant_id', %(assistant_id)s::text)
WHERE thread_id = %(thread_id)s

-- name: interrupt_pending
UPDATE runs SET status = 'interrupted', ended_at = now(), updated_at = now(),
       cancel_action = %(action)s
WHERE run_id = %(run_id)s AND status = 'pending'

-- name: request_cancel_running
UPDATE runs SET cancel_action = %(action)s, updated_at = now()
WHERE run_id = %(run_id)s AND status = 'running' AND cancel_action IS NULL

-- name: request_rollback_pending
-- A pending run that already ran (requeued) may have written checkpoints: it stays
-- pending, and the attempt that claims it restores the pre-run state instead of running.
UPDATE runs SET cancel_action = 'rollback', updated_at = now()
WHERE run_id = %(run_id)s AND status = 'pending' AND cancel_action IS NULL

-- name: lock_run
-- `get_run`, its row locked by an explicit cancel (the thread row is locked first).
SELECT r.* FROM runs r JOIN threads t USING (thread_id)
WHERE r.run_id = %(run_id)s AND r.thread_id = %(thread_id)s AND t.owner = %(owner)s
FOR NO KEY UPDATE OF r


-- runs (shared/runs/run_reads.py) --------------------------------------------------------

-- name: get_run
SELECT r.* FROM runs r JOIN threads t USING (thread_id)
WHERE r.run_id = %(run_id)s AND r.thread_id = %(thread_id)s AND t.owner = %(owner)s

-- name: get_run_by_id
SELECT r.*, t.owner AS user_id, t.public_id AS thread_public_id
FROM runs r JOIN threads t USING (thread_id)
WHERE r.run_id = %(run_id)s

-- name: run_status
SELECT status FROM runs WHERE run_id = %(run_id)s

-- name: unstarted_end
SELECT status FROM runs
WHERE run_id = %(run_id)s AND started_at IS NULL AND status NOT IN ('pending', 'running')

-- name: run_owner
SELECT t.owner FROM runs r JOIN threads t USING (thread_id)
WHERE r.run_id = %(run_id)s AND r.status = 'pending'

-- name: waiting_owners
SELECT DISTINCT t.owner FROM runs r JOIN threads t USING (thread_id)
WHERE r.status = 'pending' AND t.owner <> %(owner)s
  AND (r.due_at IS NULL OR r.due_at <= now())
  AND NOT EXISTS (
      SELECT 1 FROM runs o
      WHERE o.thread_id = r.thread_id AND o.run_id <> r.run_id
        AND (o.status = 'running' OR (o.status = 'pending' AND o.seq < r.seq)))
LIMIT %(limit)s

-- name: owners_of_pending
-- Who waits among these queued runs (workers/fairness.py): the users other than
-- %(owner)s with one of them still pending.
SELECT DISTINCT t.owner FROM runs r JOIN threads t USING (thread_id)
WHERE r.run_id = ANY(%(run_ids)s::uuid[]) AND r.status = 'pending' AND t.owner <> %(owner)s

-- name: inflight_among
SELECT run_id::text FROM runs
WHERE run_id = ANY(%(run_ids)s::uuid[]) AND status IN ('pending', 'running')

-- name: list_runs
SELECT r.* FROM runs r JOIN threads t USING (thread_id)
WHERE r.thread_id = %(thread_id)s AND t.owner = %(owner)s
  AND (%(status)s::text IS NULL OR r.status = %(status)s)
ORDER BY r.seq DESC
LIMIT %(limit)s OFFSET %(offset)s

-- name: delete_run
DELETE FROM runs WHERE run_id = %(run_id)s AND status NOT IN ('pending', 'running')
RETURNING run_id

-- name: inflight_of_owner
-- Newest first: cancelling a thread's queue from its tail never dispatches a run that is
-- about to be cancelled too.
SELECT r.* FROM runs r JOIN threads t USING (thread_id)
WHERE t.owner = %(owner)s AND r.status = ANY(%(statuses)s)
  AND (%(thread_id)s::uuid IS NULL OR r.thread_id = %(thread_id)s::uuid)
  AND (%(run_ids)s::uuid[] IS NULL OR r.run_id = ANY(%(run_ids)s::uuid[]))
ORDER BY r.seq DESC


-- thread followers (GET /threads/{id}/stream): the thread's runs in admission order -------
-- `seq` is taken under the thread lock (admission), so on one thread it is commit order.

-- name: follow_start
SELECT (SELECT min(seq) FROM runs WHERE thread_id = %(thread_id)s
          AND status IN ('pending', 'running')) AS inflight,
       (SELECT max(seq) FROM runs WHERE thread_id = %(thread_id)s) AS newest

-- name: runs_after
SELECT r.run_id, r.seq, r.status, r.started
FROM threads t
LEFT JOIN LATERAL (
    SELECT run_id::text, seq, status, attempt > 0 AS started FROM runs
    WHERE thread_id = t.thread_id AND seq > %(seq)s ORDER BY seq LIMIT %(limit)s
) r ON true
WHERE t.thread_id = %(thread_id)s

-- name: run_ref
SELECT run_id::text, seq, status, attempt > 0 AS started FROM runs
WHERE run_id = %(run_id)s AND thread_id = %(thread_id)s


-- temporary threads of runs without a thread (shared/runs/temporary_store.py) ------------

-- name: temporary_thread_finished
-- Read after the thread row is locked, in its own statement: admissions hold that lock
-- while they insert, so this sees every run that will ever be on the thread until we commit.
-- A run's webhook body is read from the thread (its final values): the thread waits until
-- the delivery has frozen it (the recovery pass deletes it then).
SELECT EXISTS (SELECT 1 FROM runs WHERE thread_id = %(thread_id)s AND on_completion = 'delete')
   AND NOT EXISTS (SELECT 1 FROM runs
                   WHERE thread_id = %(thread_id)s AND status IN ('pending', 'running'))
   AND NOT EXISTS (SELECT 1 FROM webhook_deliveries
                   WHERE thread_id = %(thread_id)s AND state = 'pending' AND body IS NULL)
   AS finished

-- name: delete_thread_by_id
DELETE FROM threads WHERE thread_id = %(thread_id)s

-- name: finished_temporary_threads
SELECT DISTINCT r.thread_id::text AS thread_id FROM runs r
WHERE r.on_completion = 'delete' AND r.status NOT IN ('pending', 'running')
  AND r.ended_at < now() - make_interval(secs => %(grace_s)s)
  AND NOT EXISTS (SELECT 1 FROM runs o
                  WHERE o.thread_id = r.thread_id AND o.status IN ('pending', 'running'))
  AND NOT EXISTS (SELECT 1 FROM webhook_deliveries w
                  WHERE w.thread_id = r.thread_id AND w.state = 'pending' AND w.body IS NULL)
LIMIT %(limit)s


-- claim and finish (L1, L2) (shared/runs/claims.py) --------------------------------------

-- name: claim
-- Only the head of its thread's queue, once due. `claims.CLAIM_LOGGED_SQL` wraps it with
-- its `claimed` lifecycle event (`with_event`): no trailing semicolon here.
UPDATE runs r
SET status = 'running', owner = %(owner)s, owner_epoch = r.owner_epoch + 1,
    attempt = r.attempt + 1, started_at = coalesce(r.started_at, now()), updated_at = now()
WHERE r.run_id = %(run_id)s AND r.status = 'pending'
  AND (r.due_at IS NULL OR r.due_at <= now())
  AND NOT EXISTS (
      SELECT 1 FROM runs o
      WHERE o.thread_id = r.thread_id AND o.run_id <> r.run_id
        AND (o.status = 'running' OR (o.status = 'pending' AND o.seq < r.seq)))
RETURNING r.*, (SELECT t.owner FROM threads t WHERE t.thread_id = r.thread_id) AS user_id,
    -- the worker writes it into the run's events (workers/public_ids.py)
    (SELECT t.public_id FROM threads t WHERE t.thread_id = r.thread_id) AS thread_public_id

-- name: set_pre_run_checkpoint
UPDATE runs SET pre_run_checkpoint_id = %(checkpoint_id)s, pre_run_writes = %(writes)s
WHERE run_id = %(run_id)s AND owner_epoch = %(epoch)s AND status = 'running'
  AND pre_run_checkpoint_id IS NULL

-- name: finish
UPDATE runs SET status = %(status)s, error = %(error)s, ended_at = now(), updated_at = now(),
       usage = coalesce(%(usage)s, usage)
WHERE run_id = %(run_id)s AND owner_epoch = %(epoch)s AND status = 'running'
RETURNING thread_id

-- name: savepoint_isolated
SAVEPOINT isolated

-- name: rollback_to_isolated
ROLLBACK TO SAVEPOINT isolated

-- name: list_run_events
SELECT seq, category, type, payload, created_at FROM run_events
WHERE run_id = %(run_id)s ORDER BY seq


-- reaper (R4) (shared/runs/reaper_queries.py) --------------------------------------------

-- name: stale_pending_heads
UPDATE runs r SET dispatched_at = now()
WHERE r.status = 'pending'
  AND (r.due_at IS NULL OR r.due_at <= now())
  AND (r.dispatched_at IS NULL OR r.dispatched_at < now() - make_interval(secs => %(stale_s)s))
  AND NOT EXISTS (
      SELECT 1 FROM runs o
      WHERE o.thread_id = r.thread_id AND o.run_id <> r.run_id
        AND (o.status = 'running' OR (o.status = 'pending' AND o.seq < r.seq)))
RETURNING r.run_id::text

-- name: running_runs
SELECT run_id::text, thread_id::text, owner, owner_epoch, attempt, cancel_action FROM runs
WHERE status = 'running' AND updated_at < now() - make_interval(secs => %(min_age_s)s)

-- name: share_thread_of_run
-- The files fence, first statement: the run's thread row, shared. A thread's delete (a
-- user's, an expiry, an assistant's delete_threads) locks that row FOR UPDATE before it
-- removes the thread's files, so a fenced write and a delete take turns: the write lands
-- before the delete removes the folder, or it finds the thread gone.
-- A writer frozen inside the transaction (SIGSTOP) is disconnected after the
-- transaction-local idle timeout, which frees the rows.
SELECT t.thread_id
FROM runs r JOIN threads t ON t.thread_id = r.thread_id,
     (SELECT set_config('idle_in_transaction_session_timeout', %(idle)s, true)) AS s
WHERE r.run_id = %(run_id)s::uuid
FOR SHARE OF t

-- name: share_running_run
-- The files fence, second statement: the attempt still owns its run (L2), held shared so
-- a re-claim, requeue or failure waits for the write.
SELECT 1 FROM runs
WHERE run_id = %(run_id)s::uuid AND owner_epoch = %(epoch)s AND status = 'running'
FOR SHARE

-- name: fail_expired
UPDATE runs SET status = 'error', error = %(error)s, ended_at = now(), updated_at = now(),
       owner = %(owner)s, owner_epoch = owner_epoch + 1
WHERE run_id = %(run_id)s AND owner_epoch = %(epoch)s AND status = 'running'
RETURNING thread_id, owner_epoch, config,
          (SELECT t.owner FROM threads t WHERE t.thread_id = runs.thread_id) AS user_id

-- name: requeue_expired
UPDATE runs SET status = 'pending', owner = NULL, dispatched_at = now(), updated_at = now()
WHERE run_id = %(run_id)s AND status = 'running' AND owner_epoch = %(epoch)s
RETURNING thread_id

-- name: attempt_cause
-- What the given attempt of the run failed with when it could not end the run itself (its
-- `attempt_failed` lifecycle event, workers/executor.py), for the reaper's final error. The
-- primary key (run_id, seq) read backwards stops at the attempt's latest one.
SELECT payload FROM run_events
WHERE run_id = %(run_id)s AND category = 'lifecycle' AND type = 'attempt_failed'
  AND payload ->> 'attempt' = %(attempt)s::text
ORDER BY seq DESC
LIMIT 1


-- shared by the parts of RunStore (shared/runs/store_base.py) ----------------------------

-- name: set_lock_timeout
-- Transaction-local (`true`): the setting ends with the caller's transaction.
SELECT set_config('lock_timeout', %s, true)
