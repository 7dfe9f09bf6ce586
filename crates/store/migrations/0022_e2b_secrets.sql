-- E2B's secrets API (`/secrets`): a tenant's secrets by E2B's id and lower-cased name, each
-- value sealed (AEAD) by the daemon before it gets here, as the native secrets' are; the
-- current version and the metadata E2B shows. Apart from `secrets`: E2B's names, versions and
-- metadata are not the native API's, and neither face lists the other's.
CREATE TABLE e2b_secrets (
    tenant_id     TEXT   NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    secret_id     TEXT   NOT NULL,
    name          TEXT   NOT NULL,
    sealed        BLOB   NOT NULL,
    version       BIGINT NOT NULL,
    metadata_json TEXT   NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, secret_id),
    UNIQUE (tenant_id, name)
);
