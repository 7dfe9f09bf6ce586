-- What happened to a session, one row per lifecycle event the manager emitted (the events
-- webhooks deliver: created, paused, resumed, stopped, exec verdicts), kept with the session's
-- record so its log outlives the sandbox (the native events list, E2B's sandbox logs). `seq`
-- orders a session's events; the daemon keeps the newest few hundred of each.
CREATE TABLE session_events (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq        BIGINT NOT NULL,
    event_id   TEXT NOT NULL,
    kind       TEXT NOT NULL,
    at_ms      BIGINT NOT NULL,
    data_json  TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
