-- How many threads and assistants each owner has, for the per-user quotas
-- (`max_threads_per_user`, `max_assistants_per_user`). Counting the owner's rows at each create
-- read up to the quota's index entries (10,000 for threads) for every new thread and every
-- stateless run, so a user's thread creation cost grew with their threads. The quota now
-- sums at most 16 rows of this table.
--
-- Kept by statement triggers on the counted tables, so every insert and delete counts,
-- whichever code path made it (API, admission, copies, the expiry sweep, cascades). Each
-- transaction adds its changes to one of 16 shard rows per owner, picked by its transaction
-- id: concurrent creators of one owner (one API key at C=50, or every project user under
-- `auth.path`, who share one owner) mostly update different rows, and a transaction never
-- holds two shards of one owner, so two of them cannot deadlock on the counts. A shard's `n`
-- may go below zero (a thread made in one shard and deleted in another); the sum is exact.
CREATE TABLE owner_counts (
    kind   text     NOT NULL,
    owner  text     NOT NULL,
    shard  smallint NOT NULL,
    n      bigint   NOT NULL,
    PRIMARY KEY (kind, owner, shard)
);

-- Adds the owners' counts of `changed` (a trigger's transition table of `kind` rows: +1 each
-- after an insert, -1 after a delete), in owner order, so a statement that changes several
-- owners' rows locks their shard rows in the order every other one does.
CREATE OR REPLACE FUNCTION owner_counts_apply() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    sign bigint := CASE TG_OP WHEN 'INSERT' THEN 1 ELSE -1 END;
BEGIN
    INSERT INTO owner_counts AS c (kind, owner, shard, n)
    SELECT TG_ARGV[0], owner, (txid_current() % 16)::smallint, sign * count(*)
    FROM changed WHERE owner IS NOT NULL
    GROUP BY owner ORDER BY owner
    ON CONFLICT (kind, owner, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION owner_counts_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM owner_counts WHERE kind = TG_ARGV[0];
    RETURN NULL;
END
$$;

-- Creating the triggers locks each table against writes until this migration commits, so
-- the counts taken below are exact: no row is written between the count and the trigger.
CREATE TRIGGER threads_count_insert AFTER INSERT ON threads
REFERENCING NEW TABLE AS changed FOR EACH STATEMENT
EXECUTE FUNCTION owner_counts_apply('threads');
CREATE TRIGGER threads_count_delete AFTER DELETE ON threads
REFERENCING OLD TABLE AS changed FOR EACH STATEMENT
EXECUTE FUNCTION owner_counts_apply('threads');
CREATE TRIGGER threads_count_truncate AFTER TRUNCATE ON threads
FOR EACH STATEMENT EXECUTE FUNCTION owner_counts_truncate('threads');

CREATE TRIGGER assistants_count_insert AFTER INSERT ON assistants
REFERENCING NEW TABLE AS changed FOR EACH STATEMENT
EXECUTE FUNCTION owner_counts_apply('assistants');
CREATE TRIGGER assistants_count_delete AFTER DELETE ON assistants
REFERENCING OLD TABLE AS changed FOR EACH STATEMENT
EXECUTE FUNCTION owner_counts_apply('assistants');
CREATE TRIGGER assistants_count_truncate AFTER TRUNCATE ON assistants
FOR EACH STATEMENT EXECUTE FUNCTION owner_counts_truncate('assistants');

INSERT INTO owner_counts (kind, owner, shard, n)
SELECT 'threads', owner, 0, count(*) FROM threads GROUP BY owner;
INSERT INTO owner_counts (kind, owner, shard, n)
SELECT 'assistants', owner, 0, count(*) FROM assistants WHERE owner IS NOT NULL GROUP BY owner;
