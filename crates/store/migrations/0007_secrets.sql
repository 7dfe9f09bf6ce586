-- Tenant secrets injected by the egress proxy: the value is sealed (AEAD) by the daemon
-- before it gets here; the store never sees it in the clear.
CREATE TABLE secrets (
    tenant_id     TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name          TEXT    NOT NULL,
    sealed        BLOB    NOT NULL,
    hosts_json    TEXT    NOT NULL,
    created_at_ms BIGINT  NOT NULL,
    PRIMARY KEY (tenant_id, name)
);
