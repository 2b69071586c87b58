-- How many runs have each status, for the ops view and the `threadrun_runs` gauge, without
-- counting the runs table: `SELECT status, count(*) FROM runs GROUP BY status` read every run
-- on each ops page refresh (every 3 s) and each metrics scrape (62 ms at 200,000 runs).
--
-- The table holds signed deltas, inserted by triggers on `runs` (+1 for a new run's status,
-- -1 and +1 when a run's status changes, -1 for a deleted run), and nothing else: an insert
-- takes no lock that another transaction waits for, so counting adds no contention and no
-- deadlock to the run's own transactions. A status's count is the sum of its rows. The
-- reaper's leader folds the rows into one per status now and then (`compact_run_counts`),
-- so a read sums the few rows written since.
CREATE TABLE run_status_counts (
    status  text   NOT NULL,
    n       bigint NOT NULL
);

CREATE OR REPLACE FUNCTION run_status_counts_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO run_status_counts (status, n)
        SELECT status, count(*) FROM changed GROUP BY status;
    ELSE
        INSERT INTO run_status_counts (status, n)
        SELECT status, -count(*) FROM changed GROUP BY status;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION run_status_counts_moved() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_status_counts (status, n) VALUES (OLD.status, -1), (NEW.status, 1);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION run_status_counts_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM run_status_counts;
    RETURN NULL;
END
$$;

-- Creating the triggers locks `runs` against writes until this migration commits, so the
-- counts taken below are exact.
CREATE TRIGGER runs_count_insert AFTER INSERT ON runs
REFERENCING NEW TABLE AS changed FOR EACH STATEMENT
EXECUTE FUNCTION run_status_counts_rows();
CREATE TRIGGER runs_count_delete AFTER DELETE ON runs
REFERENCING OLD TABLE AS changed FOR EACH STATEMENT
EXECUTE FUNCTION run_status_counts_rows();
-- Per row, and only for a row whose status changed: the run's other updates (its
-- heartbeat, its dispatch) cost nothing.
CREATE TRIGGER runs_count_status AFTER UPDATE OF status ON runs
FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION run_status_counts_moved();
CREATE TRIGGER runs_count_truncate AFTER TRUNCATE ON runs
FOR EACH STATEMENT EXECUTE FUNCTION run_status_counts_truncate();

INSERT INTO run_status_counts (status, n) SELECT status, count(*) FROM runs GROUP BY status;

-- The ops view's window reads (`ENDED_SQL`, `FAILURES_SQL`) get their indexes from the
-- migration step afterwards, built concurrently (`shared.db.migrate.CONCURRENT_INDEXES`): a
-- build here would block every write of `runs` until it ended.
