-- Per-tenant webhook endpoints and the durable queue of their deliveries. The secret is kept
-- as given: the daemon signs every delivery with it.
CREATE TABLE webhooks (
    id            TEXT PRIMARY KEY,
    tenant_id     TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    url           TEXT NOT NULL,
    -- JSON array of event types; empty: every type.
    events_json   TEXT NOT NULL,
    secret        TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL
);
CREATE INDEX webhooks_tenant ON webhooks (tenant_id, created_at_ms);

-- One row per (event, endpoint). `pending` rows are the queue; `delivered` and `failed`
-- (attempts exhausted) are the delivery log.
CREATE TABLE webhook_deliveries (
    id              TEXT PRIMARY KEY,
    webhook_id      TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    event_id        TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    body            TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_ms BIGINT NOT NULL,
    last_status     INTEGER,
    last_error      TEXT,
    created_at_ms   BIGINT NOT NULL,
    updated_at_ms   BIGINT NOT NULL,
    UNIQUE (webhook_id, event_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt_ms);
CREATE INDEX webhook_deliveries_log ON webhook_deliveries (webhook_id, created_at_ms);
