-- E2B's header rules of a session (`network.rules`: host pattern -> headers, values holding
-- `${e2b.secrets.<name>}` placeholders, never a value), to apply again once the session runs on
-- a new sandbox (resume from disk, restore, fork, a restart).
CREATE TABLE session_header_rules (
    session_id TEXT NOT NULL PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    rules_json TEXT NOT NULL
);
