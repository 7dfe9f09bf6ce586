-- A session whose node was lost (its heartbeat stopped) ends as `stopped` with this flag set:
-- it shows as `lost` and stays listed until its tenant deletes it, which clears the flag.
ALTER TABLE sessions ADD COLUMN lost BIGINT NOT NULL DEFAULT 0;
