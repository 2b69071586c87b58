-- Thread ids are per owner (A4): a thread has a public id, the one its owner sees and
-- sends, and a storage id, `thread_id`, the global key every table, the checkpointer,
-- Redis and the workspaces use. A server-made thread has one id for both; a thread whose
-- id the client chose is stored under uuid5(namespace of its owner, public id)
-- (shared/runs/thread_ids.py), so one user's choice never meets another user's thread:
-- no 409 that tells a thread exists, no id squatted ahead of its owner.
ALTER TABLE threads ADD COLUMN IF NOT EXISTS public_id uuid;
UPDATE threads SET public_id = thread_id WHERE public_id IS NULL;
ALTER TABLE threads ALTER COLUMN public_id SET NOT NULL;
-- Every lookup by a client's id: WHERE owner = %s AND public_id = %s.
CREATE UNIQUE INDEX IF NOT EXISTS threads_owner_public_id ON threads (owner, public_id);

-- An insert that names no public id (a server-made thread, a copy) gets its storage id.
CREATE OR REPLACE FUNCTION threads_default_public_id() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.public_id := coalesce(NEW.public_id, NEW.thread_id);
    RETURN NEW;
END
$$;
DROP TRIGGER IF EXISTS threads_default_public_id ON threads;
CREATE TRIGGER threads_default_public_id BEFORE INSERT ON threads
FOR EACH ROW EXECUTE FUNCTION threads_default_public_id();
