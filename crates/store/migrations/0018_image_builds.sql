-- Image builds, so their status and log outlive the daemon that ran them. `status_json` is the
-- build's status as the API shows it; `log` its whole log once it ended (NULL while it runs).
-- A build still queued or running when its daemon stopped is marked failed at the next start.
CREATE TABLE image_builds (
    id            TEXT PRIMARY KEY,
    node_id       TEXT,
    finished      BOOLEAN NOT NULL,
    status_json   TEXT NOT NULL,
    log           TEXT,
    created_at_ms BIGINT NOT NULL
);
CREATE INDEX image_builds_age ON image_builds (finished, created_at_ms);
