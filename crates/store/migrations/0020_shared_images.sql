-- Images shared by the nodes of a cluster (`[cluster] secret_file`): each named image a node
-- makes (an import, a build, an E2B template) is archived to the blob store once per build
-- (`shared_images`, by digest) and its name recorded (`shared_image_names`), so a node that
-- lacks it fetches it when a session names it. A deleted name keeps its row with no digest,
-- so a node holding a copy of the name drops it when it next resolves the name.
CREATE TABLE shared_images (
    digest        TEXT PRIMARY KEY,
    manifest_json TEXT NOT NULL,
    blob_size     BIGINT NOT NULL,
    blob_sha256   TEXT NOT NULL,
    node_id       TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL
);
CREATE TABLE shared_image_names (
    name          TEXT PRIMARY KEY,
    digest        TEXT,
    updated_at_ms BIGINT NOT NULL
);
