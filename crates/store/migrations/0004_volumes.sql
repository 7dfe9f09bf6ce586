-- Volumes: named, tenant-scoped directories that outlive sessions. A mount row says a session
-- (running or paused) has the volume at a path; a volume has at most one read-write mount.
-- A mount is claimed before its session row exists (the sandbox needs it to start), so it
-- names the session without a foreign key; the daemon drops claims of sessions that are gone.
CREATE TABLE volumes (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL REFERENCES tenants (id),
    name          TEXT NOT NULL,
    size_mib      BIGINT NOT NULL,
    backend       TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE volume_mounts (
    volume_id  TEXT NOT NULL REFERENCES volumes (id),
    session_id TEXT NOT NULL,
    path       TEXT NOT NULL,
    read_only  BOOLEAN NOT NULL,
    position   BIGINT NOT NULL,
    PRIMARY KEY (volume_id, session_id)
);
CREATE UNIQUE INDEX volume_mounts_one_writer ON volume_mounts (volume_id) WHERE NOT read_only;
CREATE INDEX volume_mounts_session ON volume_mounts (session_id);
