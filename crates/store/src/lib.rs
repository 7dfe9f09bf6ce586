//! The daemon's persistent state: tenants (plan and quotas), API keys (only their SHA-256 is
//! stored) and sessions.
//!
//! Two backends, one SQL: SQLite embedded by default (one file in the data dir), or PostgreSQL
//! (`[store] url = "postgres://..."`), which several daemons may share. Every statement is
//! written once and runs on both; `db.rs` is the only place that tells them apart.
//!
//! # Writing (or porting) a module
//!
//! - Statements go through `db::query`, not `sqlx::query`: same `&str`, `.bind(..)`,
//!   `.execute/.fetch_all/.fetch_optional/.fetch_one(&self.pool)` (or `(&mut tx)` inside
//!   `let mut tx = self.pool.begin().await?; ... tx.commit().await?`). Rows are `db::DbRow`;
//!   read columns with `get(row, "col")`. Porting a SQLite-only module is renaming
//!   `sqlx::query(` to `query(`, `SqliteRow` to `DbRow` and `&mut *tx` to `&mut tx`.
//! - SQL: `$N` placeholders, `ON CONFLICT ... DO UPDATE/NOTHING` upserts, `RETURNING` (both
//!   have it), no SQLite- or Postgres-only functions (`COALESCE`, `CAST(.. AS BIGINT)` are
//!   fine; `SUM` of a `BIGINT` is `NUMERIC` on Postgres: `CAST(COALESCE(SUM(x), 0) AS
//!   BIGINT)`), `LIKE` only on values whose case cannot differ (SQLite's `LIKE` ignores ASCII
//!   case, Postgres's does not). `ORDER BY` on text sorts by the database's collation on
//!   Postgres (create it with `LC_COLLATE=C` for SQLite's byte order).
//! - Types: times as `BIGINT` unix **milliseconds** (exact round trips at ms precision; finer
//!   is truncated), integers as `BIGINT` decoded as `i64` (Postgres will not decode an
//!   `INTEGER` into `i64`; `INTEGER` in released files is rewritten), booleans as `BOOLEAN`,
//!   JSON as `TEXT`, key hashes as lowercase hex `TEXT`, bytes as `BLOB` in released files
//!   (rewritten to `BYTEA`); a new migration that needs bytes should rather store hex or
//!   base64 `TEXT`.
//! - Migrations live in `migrations/`, are embedded at compile time and run on both
//!   backends. Released files are never edited (sqlx records each file's checksum and refuses
//!   a database whose files changed; `db::tests::released_migrations_are_unchanged` guards
//!   this): the SQLite-only spellings they hold are translated for Postgres (`db::to_postgres`),
//!   new ones should need no translation.
//! - Read-modify-write across daemons (quotas, counters): inside one transaction, take the
//!   row lock first with a write (`UPDATE tenants SET id = id WHERE id = $1`): Postgres locks
//!   the row until commit, SQLite takes its one writer lock; then read and write.
//! - Tests: `async fn name(db: TestDb)` listed in `on_both_backends!(..)` runs on SQLite and
//!   on a fresh Postgres database (see `testing.rs`).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use koder_api_types::{ErrorCode, Limits, Network, SessionState};
use sqlx::error::ErrorKind;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use db::{query, DbRow, Pool};

mod builds;
mod cluster;
mod db;
mod e2b_secrets;
mod nodes;
mod retention;
mod secret_bindings;
mod secrets;
mod session_events;
mod shared_images;
mod state;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
mod volumes;
mod webhooks;

pub use builds::BuildRecord;
pub use db::Backend;
pub use e2b_secrets::E2bSecretRecord;
pub use nodes::{NodeInfo, NodeLoad, NodeRecord, NodeState};
pub use retention::{Cutoffs, Pruned};
pub use secret_bindings::HeaderRules;
pub use secrets::SecretRecord;
pub use session_events::SessionEventRecord;
pub use shared_images::{SharedImage, SharedName};
pub use state::{DurablePause, LayerRecord, SessionDurable, SnapshotRecord};
pub use volumes::{NamedVolumeMount, Quota, VolumeMountRecord, VolumeRecord};
pub use webhooks::{Attempt, DeliveryRecord, DeliveryState, NewEvent, WebhookRecord};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// How long a writer waits for SQLite's lock before failing with "database is locked".
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections of a file-backed pool (WAL lets readers run beside the one writer).
const FILE_POOL_CONNECTIONS: u32 = 4;
/// Connections of a Postgres pool (the server serves them concurrently).
const PG_POOL_CONNECTIONS: u32 = 8;
/// How long a query waits for a free Postgres connection.
const PG_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    /// A row with this key exists already, or the change is not allowed from the row's state.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The referenced tenant does not exist.
    #[error("unknown tenant {0:?}")]
    UnknownTenant(String),
    /// A value the store cannot represent (e.g. a quota above `i64::MAX`).
    #[error("invalid value: {0}")]
    Invalid(String),
    /// A row that cannot be decoded (bad JSON, unknown state, out-of-range number...).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    #[error("database error: {0}")]
    Db(#[source] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("cannot create {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl StoreError {
    /// The API code this error maps to.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::NotFound | StoreError::UnknownTenant(_) => ErrorCode::NotFound,
            StoreError::Conflict(_) => ErrorCode::Conflict,
            StoreError::Invalid(_) => ErrorCode::InvalidArgument,
            StoreError::Corrupt(_)
            | StoreError::Db(_)
            | StoreError::Migrate(_)
            | StoreError::Io { .. } => ErrorCode::Internal,
        }
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::RowNotFound => StoreError::NotFound,
            sqlx::Error::ColumnDecode { .. }
            | sqlx::Error::ColumnNotFound(_)
            | sqlx::Error::ColumnIndexOutOfBounds { .. }
            | sqlx::Error::Decode(_) => StoreError::Corrupt(e.to_string()),
            e => StoreError::Db(e),
        }
    }
}

fn db_kind(e: &sqlx::Error) -> Option<ErrorKind> {
    match e {
        sqlx::Error::Database(db) => Some(db.kind()),
        _ => None,
    }
}

/// One network attempt of a sandbox (an outgoing connection or a name lookup).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// Assigned by the store (0 when inserting).
    pub id: i64,
    pub at: DateTime<Utc>,
    pub tenant_id: String,
    pub session_id: String,
    /// `tcp` or `dns`.
    pub proto: String,
    pub dest: String,
    pub port: u16,
    /// SNI, HTTP Host or the looked-up name.
    pub name: Option<String>,
    pub allowed: bool,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub id: String,
    pub name: String,
    /// e.g. "dev", "free", "pro", "none".
    pub plan: String,
    /// Live sessions at once; `None` = unlimited.
    pub max_sessions: Option<u32>,
    /// Session wall-clock minutes per day; `None` = unlimited.
    pub daily_session_minutes: Option<u64>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    /// SHA-256 of the key.
    pub key_hash: [u8; 32],
    pub tenant_id: String,
    /// Where the key came from (e.g. "cli" for `--api-key`), for `delete_api_keys_not_in`.
    pub label: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    pub id: String,
    pub tenant_id: String,
    /// The runtime's id of the sandbox.
    pub sandbox_id: String,
    pub runtime: String,
    pub language: String,
    pub image: String,
    /// The build of `image` its sandbox runs on (`None` for `host` and for sessions recorded
    /// before builds were kept).
    pub image_digest: Option<String>,
    pub state: SessionState,
    pub limits: Limits,
    pub network: Network,
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub end_reason: Option<String>,
    /// The node holding its sandbox; `None` for sessions recorded before nodes existed (and
    /// by a manager that is no node), which belong to whichever daemon reconciles them.
    pub node_id: Option<String>,
    /// Stopped because its node was lost, not yet acknowledged by a delete (shown as `lost`).
    pub lost: bool,
}

/// Handle on the database; cheap to clone (a connection pool).
#[derive(Debug, Clone)]
pub struct Store {
    pool: Pool,
}

const SESSION_COLUMNS: &str = "id, tenant_id, sandbox_id, runtime, language, image, state, \
     limits_json, network_json, metadata_json, env_json, created_at_ms, expires_at_ms, \
     ended_at_ms, end_reason, node_id, lost, image_digest";

/// The condition "the session is `node`'s", on parameters `$first` and `$first + 1` (both
/// bound to the node, an `Option<&str>`): `None` means every node's (a manager that is no
/// node owns them all); a node owns its sessions and those recorded before nodes existed.
fn of_node(first: usize) -> String {
    format!(
        "(CAST(${first} AS TEXT) IS NULL OR node_id = ${} OR node_id IS NULL)",
        first + 1
    )
}

const TENANT_COLUMNS: &str = "id, name, plan, max_sessions, daily_session_minutes, created_at_ms";

const API_KEY_COLUMNS: &str = "key_hash, tenant_id, label, created_at_ms";

const STOPPED: &str = "stopped";

impl Store {
    /// Opens (creating it and its parent directory if missing) the SQLite database at `path`:
    /// WAL journal, busy timeout, foreign keys on; then applies pending migrations.
    pub async fn open_sqlite(path: &Path) -> Result<Store, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|source| StoreError::Io {
                    path: parent.display().to_string(),
                    source,
                })?;
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(FILE_POOL_CONNECTIONS)
            .connect_with(options)
            .await?;
        Self::migrated(Pool::Sqlite(pool)).await
    }

    /// A private in-memory database (for tests). One connection that is never recycled, so the
    /// data lives as long as the `Store` and its clones.
    pub async fn open_in_memory() -> Result<Store, StoreError> {
        let options = SqliteConnectOptions::new()
            .in_memory(true)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await?;
        Self::migrated(Pool::Sqlite(pool)).await
    }

    /// Opens the database a `[store] url` names: `postgres://` or `postgresql://` (see
    /// [`Store::open_postgres`]) or `sqlite://<path>` (see [`Store::open_sqlite`]).
    pub async fn open_url(url: &str) -> Result<Store, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Self::open_postgres(url).await;
        }
        match url.strip_prefix("sqlite://") {
            Some(path) if !path.is_empty() => Self::open_sqlite(Path::new(path)).await,
            _ => Err(StoreError::Invalid(
                "a store url starts with postgres://, postgresql:// or sqlite://<path>".into(),
            )),
        }
    }

    /// Connects to the PostgreSQL database at `url` (which must exist) and applies pending
    /// migrations; several daemons may share it.
    pub async fn open_postgres(url: &str) -> Result<Store, StoreError> {
        let options: PgConnectOptions = url
            .parse()
            .map_err(|e| StoreError::Invalid(format!("postgres url: {e}")))?;
        let pool = PgPoolOptions::new()
            .max_connections(PG_POOL_CONNECTIONS)
            .acquire_timeout(PG_ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await?;
        Self::migrated(Pool::Postgres(pool)).await
    }

    async fn migrated(pool: Pool) -> Result<Store, StoreError> {
        pool.migrate(&MIGRATOR).await?;
        Ok(Store { pool })
    }

    /// Which database this store is on.
    pub fn backend(&self) -> Backend {
        self.pool.backend()
    }

    /// Waits for checked-out connections and closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    // ---- tenants ----

    /// Inserts the tenant or updates its name, plan and quotas. `created_at` is kept from the
    /// first insert.
    pub async fn upsert_tenant(&self, t: &Tenant) -> Result<(), StoreError> {
        let minutes = t
            .daily_session_minutes
            .map(|m| {
                i64::try_from(m).map_err(|_| {
                    StoreError::Invalid(format!("daily_session_minutes {m} is too large"))
                })
            })
            .transpose()?;
        query(
            "INSERT INTO tenants (id, name, plan, max_sessions, daily_session_minutes, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (id) DO UPDATE SET name = excluded.name, plan = excluded.plan, \
             max_sessions = excluded.max_sessions, \
             daily_session_minutes = excluded.daily_session_minutes",
        )
        .bind(&t.id)
        .bind(&t.name)
        .bind(&t.plan)
        .bind(t.max_sessions.map(i64::from))
        .bind(minutes)
        .bind(to_ms(t.created_at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn get_tenant(&self, id: &str) -> Result<Option<Tenant>, StoreError> {
        let row = query(&format!(
            "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(tenant_from_row).transpose()
    }

    /// All tenants, by id.
    pub async fn list_tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        let rows = query(&format!("SELECT {TENANT_COLUMNS} FROM tenants ORDER BY id"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(tenant_from_row).collect()
    }

    // ---- API keys ----

    /// Records the key (by its SHA-256). Idempotent: an existing hash keeps its `created_at` and
    /// takes the given tenant and label. `UnknownTenant` if the tenant does not exist.
    pub async fn put_api_key(
        &self,
        key_hash: &[u8; 32],
        tenant_id: &str,
        label: &str,
    ) -> Result<(), StoreError> {
        query(
            "INSERT INTO api_keys (key_hash, tenant_id, label, created_at_ms) \
             VALUES ($1, $2, $3, $4) \
             ON CONFLICT (key_hash) DO UPDATE SET tenant_id = excluded.tenant_id, \
             label = excluded.label",
        )
        .bind(hex::encode(key_hash))
        .bind(tenant_id)
        .bind(label)
        .bind(to_ms(Utc::now()))
        .execute(&self.pool)
        .await
        .map_err(|e| match db_kind(&e) {
            Some(ErrorKind::ForeignKeyViolation) => StoreError::UnknownTenant(tenant_id.into()),
            _ => e.into(),
        })?;
        Ok(())
    }

    /// All keys, oldest first.
    pub async fn api_keys(&self) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let rows = query(&format!(
            "SELECT {API_KEY_COLUMNS} FROM api_keys ORDER BY created_at_ms, key_hash"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(api_key_from_row).collect()
    }

    /// The key with this hash, if any.
    pub async fn get_api_key(
        &self,
        key_hash: &[u8; 32],
    ) -> Result<Option<ApiKeyRecord>, StoreError> {
        let row = query(&format!(
            "SELECT {API_KEY_COLUMNS} FROM api_keys WHERE key_hash = $1"
        ))
        .bind(hex::encode(key_hash))
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(api_key_from_row).transpose()
    }

    /// Removes one key; false if there was none.
    pub async fn delete_api_key(&self, key_hash: &[u8; 32]) -> Result<bool, StoreError> {
        let done = query("DELETE FROM api_keys WHERE key_hash = $1")
            .bind(hex::encode(key_hash))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Drops the keys carrying `label` whose hash is not in `keep` (so removing an `--api-key`
    /// flag revokes that key). Returns how many were dropped.
    pub async fn delete_api_keys_not_in(
        &self,
        label: &str,
        keep: &[[u8; 32]],
    ) -> Result<u64, StoreError> {
        let keep: HashSet<String> = keep.iter().map(hex::encode).collect();
        let mut tx = self.pool.begin().await?;
        let rows = query("SELECT key_hash FROM api_keys WHERE label = $1")
            .bind(label)
            .fetch_all(&mut tx)
            .await?;
        let mut dropped = 0;
        for row in &rows {
            let hash: String = get(row, "key_hash")?;
            if keep.contains(&hash) {
                continue;
            }
            dropped += query("DELETE FROM api_keys WHERE key_hash = $1 AND label = $2")
                .bind(&hash)
                .bind(label)
                .execute(&mut tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(dropped)
    }

    // ---- sessions ----

    /// Records one network attempt.
    pub async fn insert_audit(&self, a: &AuditRecord) -> Result<(), StoreError> {
        query(
            "INSERT INTO network_audit (at_ms, tenant_id, session_id, proto, dest, port, name, allowed, reason) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(to_ms(a.at))
        .bind(&a.tenant_id)
        .bind(&a.session_id)
        .bind(&a.proto)
        .bind(&a.dest)
        .bind(i64::from(a.port))
        .bind(a.name.as_deref())
        .bind(a.allowed)
        .bind(&a.reason)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// A tenant's audit entries, newest first, optionally for one session and/or one verdict,
    /// older than `before_id` (paging), at most `limit`.
    pub async fn audit(
        &self,
        tenant_id: &str,
        session_id: Option<&str>,
        allowed: Option<bool>,
        before_id: Option<i64>,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let rows = query(
            "SELECT id, at_ms, tenant_id, session_id, proto, dest, port, name, allowed, reason FROM network_audit \
             WHERE tenant_id = $1 AND ($2 IS NULL OR session_id = $2) AND ($3 IS NULL OR allowed = $3) \
             AND ($4 IS NULL OR id < $4) ORDER BY id DESC LIMIT $5",
        )
        .bind(tenant_id)
        .bind(session_id)
        .bind(allowed)
        .bind(before_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let port: i64 = get(r, "port")?;
                Ok(AuditRecord {
                    id: get(r, "id")?,
                    at: from_ms(get(r, "at_ms")?, "audit time")?,
                    tenant_id: get(r, "tenant_id")?,
                    session_id: get(r, "session_id")?,
                    proto: get(r, "proto")?,
                    dest: get(r, "dest")?,
                    port: u16::try_from(port)
                        .map_err(|_| StoreError::Corrupt(format!("audit port {port}")))?,
                    name: get(r, "name")?,
                    allowed: get(r, "allowed")?,
                    reason: get(r, "reason")?,
                })
            })
            .collect()
    }

    /// `Conflict` if a session with this id exists, `UnknownTenant` if the tenant does not.
    pub async fn insert_session(&self, s: &SessionRecord) -> Result<(), StoreError> {
        query(&format!(
            "INSERT INTO sessions ({SESSION_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
             $18)"
        ))
        .bind(&s.id)
        .bind(&s.tenant_id)
        .bind(&s.sandbox_id)
        .bind(&s.runtime)
        .bind(&s.language)
        .bind(&s.image)
        .bind(s.state.as_str())
        .bind(to_json(&s.limits)?)
        .bind(to_json(&s.network)?)
        .bind(to_json(&s.metadata)?)
        .bind(to_json(&s.env)?)
        .bind(to_ms(s.created_at))
        .bind(to_ms(s.expires_at))
        .bind(s.ended_at.map(to_ms))
        .bind(s.end_reason.as_deref())
        .bind(s.node_id.as_deref())
        .bind(i64::from(s.lost))
        .bind(s.image_digest.as_deref())
        .execute(&self.pool)
        .await
        .map_err(|e| match db_kind(&e) {
            Some(ErrorKind::UniqueViolation) => {
                StoreError::Conflict(format!("session {} exists", s.id))
            }
            Some(ErrorKind::ForeignKeyViolation) => StoreError::UnknownTenant(s.tenant_id.clone()),
            _ => e.into(),
        })?;
        Ok(())
    }

    pub async fn get_session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let row = query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    /// This tenant's sessions, newest first; stopped ones only if `include_stopped`.
    pub async fn list_sessions(
        &self,
        tenant_id: &str,
        include_stopped: bool,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        // Lost sessions stay listed until deleted.
        let filter = if include_stopped {
            ""
        } else {
            " AND (state <> 'stopped' OR lost <> 0)"
        };
        let rows = query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant_id = $1{filter} \
             ORDER BY created_at_ms DESC, id DESC"
        ))
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(session_from_row).collect()
    }

    /// Every tenant's sessions that are not stopped, oldest first.
    pub async fn live_sessions(&self) -> Result<Vec<SessionRecord>, StoreError> {
        let rows = query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE state <> 'stopped' \
             ORDER BY created_at_ms, id"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(session_from_row).collect()
    }

    /// The sessions recorded on exactly `node` that are not stopped, oldest first (a lost
    /// node's, for whoever takes over).
    pub async fn live_sessions_on_node(
        &self,
        node: &str,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let rows = query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE state <> 'stopped' AND node_id = $1 \
             ORDER BY created_at_ms, id"
        ))
        .bind(node)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(session_from_row).collect()
    }

    pub async fn count_live_sessions(&self, tenant_id: &str) -> Result<u64, StoreError> {
        let row =
            query("SELECT COUNT(*) AS n FROM sessions WHERE tenant_id = $1 AND state <> 'stopped'")
                .bind(tenant_id)
                .fetch_one(&self.pool)
                .await?;
        let n: i64 = get(&row, "n")?;
        u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("negative count {n}")))
    }

    /// Sets the state; stopping sets `ended_at` to now (kept if already set). See
    /// [`Store::set_session_state_at`].
    pub async fn set_session_state(
        &self,
        id: &str,
        state: SessionState,
        end_reason: Option<&str>,
    ) -> Result<(), StoreError> {
        self.set_session_state_at(id, state, end_reason, Utc::now())
            .await
    }

    /// Sets the state, with `at` as the stop time when `state` is `Stopped` (an existing
    /// `ended_at` is kept, so stopping twice does not move it). `end_reason`, when given, replaces
    /// the stored one. `NotFound` if there is no such session; `Conflict` when moving a stopped
    /// session to a live state (stopped is final).
    pub async fn set_session_state_at(
        &self,
        id: &str,
        state: SessionState,
        end_reason: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if state == SessionState::Lost {
            return Err(StoreError::Invalid(
                "a lost session is recorded with Store::lose_session".into(),
            ));
        }
        let stopping = state == SessionState::Stopped;
        let done = query(
            "UPDATE sessions SET state = $2, ended_at_ms = COALESCE(ended_at_ms, $3), \
             end_reason = COALESCE($4, end_reason) \
             WHERE id = $1 AND (state <> 'stopped' OR $5 = 'stopped')",
        )
        .bind(id)
        .bind(state.as_str())
        .bind(stopping.then(|| to_ms(at)))
        .bind(end_reason)
        .bind(state.as_str())
        .execute(&self.pool)
        .await?;
        if done.rows_affected() > 0 {
            return Ok(());
        }
        let exists = query("SELECT state FROM sessions WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        match exists {
            None => Err(StoreError::NotFound),
            Some(_) => Err(StoreError::Conflict(format!(
                "session {id} is stopped; it cannot become {}",
                state.as_str()
            ))),
        }
    }

    /// `NotFound` if there is no such session.
    pub async fn set_session_expiry(
        &self,
        id: &str,
        expires_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let done = query("UPDATE sessions SET expires_at_ms = $2 WHERE id = $1")
            .bind(id)
            .bind(to_ms(expires_at))
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    /// Live sessions `node` owns (`None`: every node's; else its own and those recorded
    /// before nodes existed) whose `expires_at <= now`, soonest-expired first.
    pub async fn expired_sessions(
        &self,
        now: DateTime<Utc>,
        node: Option<&str>,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let rows = query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions \
             WHERE state <> 'stopped' AND expires_at_ms <= $1 AND {} \
             ORDER BY expires_at_ms, id",
            of_node(2)
        ))
        .bind(to_ms(now))
        .bind(node)
        .bind(node)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(session_from_row).collect()
    }

    /// When the first of the sessions [`Store::expired_sessions`] looks at expires (past or
    /// future); `None` when `node` has none not stopped.
    pub async fn next_expiry(
        &self,
        node: Option<&str>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let row = query(&format!(
            "SELECT MIN(expires_at_ms) AS next FROM sessions WHERE state <> 'stopped' AND {}",
            of_node(1)
        ))
        .bind(node)
        .bind(node)
        .fetch_one(&self.pool)
        .await?;
        get::<Option<i64>>(&row, "next")?
            .map(|ms| from_ms(ms, "next expiry"))
            .transpose()
    }

    /// The sessions `node` owns (as for [`Store::expired_sessions`]) that are not stopped,
    /// oldest first.
    pub async fn live_sessions_of(
        &self,
        node: Option<&str>,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let rows = query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE state <> 'stopped' AND {} \
             ORDER BY created_at_ms, id",
            of_node(1)
        ))
        .bind(node)
        .bind(node)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(session_from_row).collect()
    }

    /// Wall-clock seconds (rounded down) of this tenant's sessions inside `[since, now]`: a live
    /// session counts from `max(created_at, since)` up to `now`, a stopped one up to `ended_at`
    /// (or `expires_at` if it was stored stopped without an end time). For the daily
    /// session-minutes quota.
    pub async fn session_seconds_since(
        &self,
        tenant_id: &str,
        since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let (since_ms, now_ms) = (to_ms(since), to_ms(now));
        if since_ms >= now_ms {
            return Ok(0);
        }
        let rows = query(
            "SELECT id, state, created_at_ms, expires_at_ms, ended_at_ms FROM sessions \
             WHERE tenant_id = $1 AND created_at_ms < $2 \
             AND (state <> 'stopped' OR COALESCE(ended_at_ms, expires_at_ms) > $3)",
        )
        .bind(tenant_id)
        .bind(now_ms)
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?;
        let pauses = self.tenant_pauses(tenant_id, since_ms).await?;
        let mut total_ms: u64 = 0;
        for row in &rows {
            let id: String = get(row, "id")?;
            let state: String = get(row, "state")?;
            let created: i64 = get(row, "created_at_ms")?;
            let end = if state == STOPPED {
                let ended: Option<i64> = get(row, "ended_at_ms")?;
                match ended {
                    Some(e) => e,
                    None => get(row, "expires_at_ms")?,
                }
            } else {
                now_ms
            };
            let (from, to) = (created.max(since_ms), end.min(now_ms));
            let paused: i64 = pauses
                .iter()
                .filter(|(s, _, _)| *s == id)
                .map(|(_, p_from, p_to)| overlap((from, to), (*p_from, p_to.unwrap_or(to))))
                .sum();
            let span = to.saturating_sub(from).saturating_sub(paused);
            total_ms = total_ms.saturating_add(u64::try_from(span).unwrap_or(0));
        }
        Ok(total_ms / 1000)
    }

    /// Pauses to disk of the tenant's sessions still open or ended after `since_ms`:
    /// (session, from, to).
    async fn tenant_pauses(
        &self,
        tenant_id: &str,
        since_ms: i64,
    ) -> Result<Vec<(String, i64, Option<i64>)>, StoreError> {
        let rows = query(
            "SELECT p.session_id, p.from_ms, p.to_ms FROM session_pauses p \
             JOIN sessions s ON s.id = p.session_id \
             WHERE s.tenant_id = $1 AND (p.to_ms IS NULL OR p.to_ms > $2)",
        )
        .bind(tenant_id)
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((get(r, "session_id")?, get(r, "from_ms")?, get(r, "to_ms")?)))
            .collect()
    }

    /// The session was paused holding no sandbox (to disk, or its VM saved to a file) at `at`
    /// (a no-op if a pause is open already).
    pub async fn begin_disk_pause(&self, id: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        query(
            "INSERT INTO session_pauses (session_id, from_ms) SELECT $1, $2 \
             WHERE NOT EXISTS (SELECT 1 FROM session_pauses WHERE session_id = $1 AND to_ms IS NULL)",
        )
        .bind(id)
        .bind(to_ms(at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The session's open pause (if any) ended at `at`: it resumed or stopped.
    pub async fn end_disk_pause(&self, id: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        query("UPDATE session_pauses SET to_ms = $2 WHERE session_id = $1 AND to_ms IS NULL")
            .bind(id)
            .bind(to_ms(at))
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// Takes the tenant's lock for the rest of `tx`: a write to its row (changing nothing), so on
/// Postgres the row stays locked until commit and on SQLite the transaction holds the one
/// writer lock. Read-modify-write of a tenant's totals (quotas) done after this is serial
/// across daemons: a second transaction waits here, then reads what the first committed
/// (Postgres reads each statement afresh under `READ COMMITTED`). `UnknownTenant` if there is
/// no such tenant.
pub(crate) async fn lock_tenant(tx: &mut db::Tx, tenant_id: &str) -> Result<(), StoreError> {
    let done = query("UPDATE tenants SET name = name WHERE id = $1")
        .bind(tenant_id)
        .execute(tx)
        .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::UnknownTenant(tenant_id.into()));
    }
    Ok(())
}

// ---- encoding ----

/// Milliseconds two half-open intervals share.
fn overlap(a: (i64, i64), b: (i64, i64)) -> i64 {
    (a.1.min(b.1) - a.0.max(b.0)).max(0)
}

fn to_ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn from_ms(ms: i64, what: &str) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Corrupt(format!("{what}: time {ms} ms out of range")))
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Invalid(format!("cannot encode JSON: {e}")))
}

fn from_json<T: serde::de::DeserializeOwned>(s: &str, what: &str) -> Result<T, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

/// A column, any decoding failure reported as `Corrupt` naming the column.
fn get<T: db::Value>(row: &DbRow, col: &str) -> Result<T, StoreError> {
    row.get(col)
}

fn tenant_from_row(row: &DbRow) -> Result<Tenant, StoreError> {
    let id: String = get(row, "id")?;
    let what = |col: &str| format!("tenant {id:?} {col}");
    let max_sessions = get::<Option<i64>>(row, "max_sessions")?
        .map(|n| {
            u32::try_from(n)
                .map_err(|_| StoreError::Corrupt(format!("{}: {n}", what("max_sessions"))))
        })
        .transpose()?;
    let daily_session_minutes = get::<Option<i64>>(row, "daily_session_minutes")?
        .map(|n| {
            u64::try_from(n)
                .map_err(|_| StoreError::Corrupt(format!("{}: {n}", what("daily_session_minutes"))))
        })
        .transpose()?;
    Ok(Tenant {
        name: get(row, "name")?,
        plan: get(row, "plan")?,
        max_sessions,
        daily_session_minutes,
        created_at: from_ms(get(row, "created_at_ms")?, &what("created_at"))?,
        id,
    })
}

fn api_key_from_row(row: &DbRow) -> Result<ApiKeyRecord, StoreError> {
    let hex_hash: String = get(row, "key_hash")?;
    let mut key_hash = [0u8; 32];
    hex::decode_to_slice(&hex_hash, &mut key_hash)
        .map_err(|e| StoreError::Corrupt(format!("api key hash {hex_hash:?}: {e}")))?;
    Ok(ApiKeyRecord {
        key_hash,
        tenant_id: get(row, "tenant_id")?,
        label: get(row, "label")?,
        created_at: from_ms(get(row, "created_at_ms")?, "api key created_at")?,
    })
}

fn session_from_row(row: &DbRow) -> Result<SessionRecord, StoreError> {
    let id: String = get(row, "id")?;
    let what = |col: &str| format!("session {id:?} {col}");
    let state_text: String = get(row, "state")?;
    let state = SessionState::parse(&state_text)
        .ok_or_else(|| StoreError::Corrupt(format!("{}: {state_text:?}", what("state"))))?;
    let ended_at = get::<Option<i64>>(row, "ended_at_ms")?
        .map(|ms| from_ms(ms, &what("ended_at")))
        .transpose()?;
    Ok(SessionRecord {
        tenant_id: get(row, "tenant_id")?,
        sandbox_id: get(row, "sandbox_id")?,
        runtime: get(row, "runtime")?,
        language: get(row, "language")?,
        image: get(row, "image")?,
        image_digest: get(row, "image_digest")?,
        state,
        limits: from_json(&get::<String>(row, "limits_json")?, &what("limits"))?,
        network: from_json(&get::<String>(row, "network_json")?, &what("network"))?,
        metadata: from_json(&get::<String>(row, "metadata_json")?, &what("metadata"))?,
        env: from_json(&get::<String>(row, "env_json")?, &what("env"))?,
        created_at: from_ms(get(row, "created_at_ms")?, &what("created_at"))?,
        expires_at: from_ms(get(row, "expires_at_ms")?, &what("expires_at"))?,
        ended_at,
        end_reason: get(row, "end_reason")?,
        node_id: get(row, "node_id")?,
        lost: get::<i64>(row, "lost")? != 0,
        id,
    })
}
