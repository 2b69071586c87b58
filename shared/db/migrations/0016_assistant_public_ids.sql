-- Assistant ids are per owner (A4), as thread ids are (0014): an assistant has a public id,
-- the one its owner sees and sends (and runs and crons record), and a storage id,
-- `assistant_id`, the key its versions use. A server-made or system assistant has one id
-- for both; an assistant whose id the client chose is stored under uuid5(namespace of its
-- owner, public id) (shared/assistants/model.py), so one user's choice never meets another
-- user's assistant: no 409 that tells an assistant exists, no id squatted ahead of its owner.
ALTER TABLE assistants ADD COLUMN IF NOT EXISTS public_id uuid;
UPDATE assistants SET public_id = assistant_id WHERE public_id IS NULL;
ALTER TABLE assistants ALTER COLUMN public_id SET NOT NULL;
-- Every lookup by a client's id: WHERE public_id = %s AND (owner = %s OR owner IS NULL).
CREATE UNIQUE INDEX IF NOT EXISTS assistants_owner_public_id ON assistants (owner, public_id);

-- An insert that names no public id gets its storage id.
CREATE OR REPLACE FUNCTION assistants_default_public_id() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.public_id := coalesce(NEW.public_id, NEW.assistant_id);
    RETURN NEW;
END
$$;
DROP TRIGGER IF EXISTS assistants_default_public_id ON assistants;
CREATE TRIGGER assistants_default_public_id BEFORE INSERT ON assistants
FOR EACH ROW EXECUTE FUNCTION assistants_default_public_id();
