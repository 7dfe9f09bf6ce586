-- The build (digest) of its image a session runs on and a snapshot was taken on. A session
-- resumed, restored or forked, and one made from a snapshot, run on that very build while the
-- image store holds it, even once its name points at a newer build, and the store keeps a
-- build while a session or snapshot names it. NULL for the `host` image and for rows recorded
-- before this column (those follow their image's name, as they always did).
ALTER TABLE sessions ADD COLUMN image_digest TEXT;
ALTER TABLE snapshots ADD COLUMN image_digest TEXT;
