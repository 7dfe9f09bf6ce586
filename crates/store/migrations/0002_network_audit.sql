-- Every outgoing connection attempt and name lookup of sandboxes with network access.
CREATE TABLE network_audit (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms       BIGINT  NOT NULL,
    tenant_id   TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    proto       TEXT    NOT NULL,
    dest        TEXT    NOT NULL,
    port        INTEGER NOT NULL,
    name        TEXT,
    allowed     BOOLEAN NOT NULL,
    reason      TEXT    NOT NULL
);
CREATE INDEX network_audit_tenant ON network_audit (tenant_id, id);
CREATE INDEX network_audit_session ON network_audit (session_id, id);
