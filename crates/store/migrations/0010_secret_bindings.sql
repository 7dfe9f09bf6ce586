-- Which of the tenant's secrets a session was given, and the placeholder its environment holds
-- for each: what the daemon needs to inject them again once the session runs on a new sandbox
-- (resume from disk, restore, fork, a restart). No value here: it is read from `secrets` then.
CREATE TABLE session_secrets (
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    placeholder TEXT NOT NULL,
    PRIMARY KEY (session_id, name)
);
