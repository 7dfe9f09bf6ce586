-- When sessions were paused to disk: such a session holds no sandbox, so its time does not
-- count against the tenant's daily session minutes. An open pause has no end yet.
CREATE TABLE session_pauses (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    from_ms    BIGINT NOT NULL,
    to_ms      BIGINT
);
CREATE INDEX session_pauses_session ON session_pauses (session_id);
