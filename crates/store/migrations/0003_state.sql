-- State that outlives a sandbox. A layer is one captured writable layer (a tar stream in the
-- blob store); snapshots and sessions list the layers they are built from, bottom first. A layer
-- goes once nothing lists it.
CREATE TABLE layers (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL REFERENCES tenants (id),
    blob_key      TEXT NOT NULL,
    size_bytes    BIGINT NOT NULL,
    sha256        TEXT NOT NULL,
    entries       BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL
);
CREATE INDEX layers_tenant ON layers (tenant_id);

CREATE TABLE snapshots (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL REFERENCES tenants (id),
    name          TEXT,
    session_id    TEXT,
    runtime       TEXT NOT NULL,
    language      TEXT NOT NULL,
    image         TEXT NOT NULL,
    layers_json   TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
CREATE INDEX snapshots_tenant ON snapshots (tenant_id, created_at_ms);
CREATE INDEX snapshots_expires ON snapshots (expires_at_ms);

-- The layers a session's sandbox starts from, how it is paused, and its lifecycle rules.
ALTER TABLE sessions ADD COLUMN layers_json TEXT NOT NULL DEFAULT '[]';
ALTER TABLE sessions ADD COLUMN pause_kind TEXT;
ALTER TABLE sessions ADD COLUMN lifecycle_json TEXT NOT NULL DEFAULT '{}';
