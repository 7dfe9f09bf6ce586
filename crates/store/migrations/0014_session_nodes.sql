-- The node whose runtime holds a session's sandbox: start-up reconciliation, the reaper and a
-- lost node's take-over act only on the sessions of one node, so daemons can share a store.
-- NULL for sessions recorded before nodes existed (a single daemon's: its own).
ALTER TABLE sessions ADD COLUMN node_id TEXT;
CREATE INDEX sessions_node_state ON sessions (node_id, state);
