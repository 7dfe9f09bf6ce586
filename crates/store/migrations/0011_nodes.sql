-- The daemons sharing this store. Each registers at start and heartbeats; one whose heartbeat
-- stopped longer than the timeout is marked lost by any other. Capacity and load are columns
-- (not JSON) so that placement can compare nodes in SQL.
CREATE TABLE nodes (
    id                 TEXT PRIMARY KEY,
    -- Base URL other nodes reach this one at (node-to-node forwarding).
    address            TEXT NOT NULL,
    -- JSON array of the runtimes it offers ("jail", "microvm").
    runtimes_json      TEXT NOT NULL,
    -- Sandboxes it can hold at once, and holds now.
    capacity_sandboxes BIGINT NOT NULL,
    load_sandboxes     BIGINT NOT NULL,
    -- 'up', 'lost' (its heartbeat stopped) or 'left' (it shut down cleanly).
    state              TEXT NOT NULL CHECK (state IN ('up', 'lost', 'left')),
    started_at_ms      BIGINT NOT NULL,
    heartbeat_at_ms    BIGINT NOT NULL,
    -- When it was marked lost or left; NULL while up.
    down_at_ms         BIGINT
);
CREATE INDEX nodes_state_heartbeat ON nodes (state, heartbeat_at_ms);
