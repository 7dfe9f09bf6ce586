-- Portable SQL (SQLite now, Postgres later): BIGINT unix milliseconds for times, TEXT for JSON
-- and for API-key hashes (lowercase hex of the SHA-256).

CREATE TABLE tenants (
    id                    TEXT PRIMARY KEY,
    name                  TEXT NOT NULL,
    plan                  TEXT NOT NULL,
    max_sessions          BIGINT,
    daily_session_minutes BIGINT,
    created_at_ms         BIGINT NOT NULL
);

CREATE TABLE api_keys (
    key_hash      TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    label         TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL
);

CREATE INDEX api_keys_label ON api_keys (label);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

CREATE TABLE sessions (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL REFERENCES tenants (id),
    sandbox_id    TEXT NOT NULL,
    runtime       TEXT NOT NULL,
    language      TEXT NOT NULL,
    image         TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('starting', 'running', 'paused', 'stopped')),
    limits_json   TEXT NOT NULL,
    network_json  TEXT NOT NULL,
    metadata_json TEXT NOT NULL,
    env_json      TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    ended_at_ms   BIGINT,
    end_reason    TEXT
);

CREATE INDEX sessions_tenant_state ON sessions (tenant_id, state);
CREATE INDEX sessions_tenant_created ON sessions (tenant_id, created_at_ms);
CREATE INDEX sessions_expires ON sessions (expires_at_ms);
