-- Warm sandboxes each node had ready at its last heartbeat, by pool lane
-- (JSON object "runtime/language/image" -> count): placement sends a create where one waits.
ALTER TABLE nodes ADD COLUMN warm_json TEXT NOT NULL DEFAULT '{}';
