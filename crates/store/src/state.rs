//! Layers, snapshots and the durable half of sessions (their layers, pause kind, lifecycle).
//!
//! Write order keeps a crash harmless: a layer's blob is complete before its row exists, and a
//! snapshot row is written only after all its layer rows; a blob without a row, or a row nothing
//! references, is garbage the owner sweeps (`all_layers` less `referenced_layers`).

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use koder_api_types::Lifecycle;

use crate::db::{query, DbRow};
use crate::{db_kind, from_json, from_ms, get, to_json, to_ms, Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerRecord {
    pub id: String,
    pub tenant_id: String,
    pub blob_key: String,
    pub size_bytes: u64,
    pub sha256: String,
    pub entries: u64,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    pub id: String,
    pub tenant_id: String,
    pub name: Option<String>,
    pub session_id: Option<String>,
    pub runtime: String,
    pub language: String,
    pub image: String,
    /// The build of `image` the session ran on (see [`crate::SessionRecord::image_digest`]).
    pub image_digest: Option<String>,
    /// Layer ids, bottom first.
    pub layers: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// What a session keeps beyond its sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionDurable {
    /// Layer ids its sandbox starts from, bottom first.
    pub layers: Vec<String>,
    /// How it is paused, while it is paused in a way that outlives the daemon (a jail's
    /// freezer pause is not recorded: it ends with the daemon).
    pub pause: Option<DurablePause>,
    pub lifecycle: Lifecycle,
}

/// How a paused session that holds no sandbox is kept. Either way nothing runs for it, so its
/// time is not session time, and it lives for the snapshot retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurablePause {
    /// Its filesystem is its layers; resume boots a fresh sandbox on them.
    Disk,
    /// Its whole VM (memory, processes, disks) is saved by the runtime under the session's
    /// sandbox id; resume starts it from there, every process as it was.
    VmMemory,
}

impl DurablePause {
    /// The `sessions.pause_kind` value ("disk" is what earlier versions wrote).
    pub fn as_str(self) -> &'static str {
        match self {
            DurablePause::Disk => "disk",
            DurablePause::VmMemory => "vm_memory",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "disk" => Some(DurablePause::Disk),
            "vm_memory" => Some(DurablePause::VmMemory),
            _ => None,
        }
    }
}

const SNAPSHOT_COLUMNS: &str = "id, tenant_id, name, session_id, runtime, language, image, \
     layers_json, created_at_ms, expires_at_ms, image_digest";
const LAYER_COLUMNS: &str = "id, tenant_id, blob_key, size_bytes, sha256, entries, created_at_ms";

impl Store {
    pub async fn insert_layer(&self, l: &LayerRecord) -> Result<(), StoreError> {
        query(&format!(
            "INSERT INTO layers ({LAYER_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"
        ))
        .bind(&l.id)
        .bind(&l.tenant_id)
        .bind(&l.blob_key)
        .bind(to_i64(l.size_bytes)?)
        .bind(&l.sha256)
        .bind(to_i64(l.entries)?)
        .bind(to_ms(l.created_at))
        .execute(&self.pool)
        .await
        .map_err(|e| insert_error(e, "layer", &l.id, &l.tenant_id))?;
        Ok(())
    }

    /// The layers with these ids of this tenant, in the order asked; `NotFound` if one is
    /// missing or another tenant's.
    pub async fn layers(
        &self,
        tenant_id: &str,
        ids: &[String],
    ) -> Result<Vec<LayerRecord>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let row = query(&format!(
                "SELECT {LAYER_COLUMNS} FROM layers WHERE id = $1 AND tenant_id = $2"
            ))
            .bind(id)
            .bind(tenant_id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or(StoreError::NotFound)?;
            out.push(layer_from_row(&row)?);
        }
        Ok(out)
    }

    /// Every layer of every tenant (for the blob sweep after a crash).
    pub async fn all_layers(&self) -> Result<Vec<LayerRecord>, StoreError> {
        let rows = query(&format!("SELECT {LAYER_COLUMNS} FROM layers"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(layer_from_row).collect()
    }

    /// Stored bytes of this tenant's layers (the snapshot-storage quota counts these).
    pub async fn tenant_layer_bytes(&self, tenant_id: &str) -> Result<u64, StoreError> {
        let row = query(
            // Postgres sums BIGINTs to NUMERIC: cast back.
            "SELECT CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) AS n FROM layers \
             WHERE tenant_id = $1",
        )
        .bind(tenant_id)
        .fetch_one(&self.pool)
        .await?;
        let n: i64 = get(&row, "n")?;
        u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("negative layer bytes {n}")))
    }

    /// The ids of every layer a snapshot or a session not stopped lists (stored or not). Kept
    /// simple and portable (no JSON functions in SQL): the references are gathered here. A
    /// collector reads its candidates ([`Store::all_layers`]) *before* these: a layer is
    /// recorded before anything refers to it, so one recorded meanwhile is no candidate, and
    /// a reference written meanwhile to a candidate is seen.
    pub async fn referenced_layers(&self) -> Result<HashSet<String>, StoreError> {
        let mut used: HashSet<String> = HashSet::new();
        for row in query("SELECT layers_json FROM snapshots")
            .fetch_all(&self.pool)
            .await?
        {
            used.extend(from_json::<Vec<String>>(
                &get::<String>(&row, "layers_json")?,
                "snapshot layers",
            )?);
        }
        for row in query("SELECT layers_json FROM sessions WHERE state <> 'stopped'")
            .fetch_all(&self.pool)
            .await?
        {
            used.extend(from_json::<Vec<String>>(
                &get::<String>(&row, "layers_json")?,
                "session layers",
            )?);
        }
        Ok(used)
    }

    /// The image builds something may still start a sandbox on: those of unstopped sessions
    /// (running, or paused to be resumed) and of snapshots not expired at `now`. An image
    /// store keeps these even once no name points at them.
    pub async fn kept_image_digests(
        &self,
        now: DateTime<Utc>,
    ) -> Result<HashSet<String>, StoreError> {
        let rows = query(
            "SELECT image_digest FROM sessions \
             WHERE state <> 'stopped' AND image_digest IS NOT NULL \
             UNION SELECT image_digest FROM snapshots \
             WHERE expires_at_ms > $1 AND image_digest IS NOT NULL",
        )
        .bind(to_ms(now))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| get(r, "image_digest")).collect()
    }

    /// Ids of the snapshots of any tenant, not expired at `now`, taken on the image build
    /// `digest`.
    pub async fn snapshots_on_image(
        &self,
        digest: &str,
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, StoreError> {
        let rows = query(
            "SELECT id FROM snapshots WHERE image_digest = $1 AND expires_at_ms > $2 \
             ORDER BY created_at_ms, id",
        )
        .bind(digest)
        .bind(to_ms(now))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| get(r, "id")).collect()
    }

    /// Records the image build a session's sandbox now runs on (a restore onto a snapshot
    /// taken on another build of its image). `NotFound` if there is no such session.
    pub async fn set_session_image_digest(
        &self,
        id: &str,
        digest: Option<&str>,
    ) -> Result<(), StoreError> {
        let done = query("UPDATE sessions SET image_digest = $2 WHERE id = $1")
            .bind(id)
            .bind(digest)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    pub async fn delete_layer(&self, id: &str) -> Result<(), StoreError> {
        query("DELETE FROM layers WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// `UnknownTenant` if the tenant does not exist; every listed layer must exist already.
    pub async fn insert_snapshot(&self, s: &SnapshotRecord) -> Result<(), StoreError> {
        query(&format!(
            "INSERT INTO snapshots ({SNAPSHOT_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
        ))
        .bind(&s.id)
        .bind(&s.tenant_id)
        .bind(s.name.as_deref())
        .bind(s.session_id.as_deref())
        .bind(&s.runtime)
        .bind(&s.language)
        .bind(&s.image)
        .bind(to_json(&s.layers)?)
        .bind(to_ms(s.created_at))
        .bind(to_ms(s.expires_at))
        .bind(s.image_digest.as_deref())
        .execute(&self.pool)
        .await
        .map_err(|e| insert_error(e, "snapshot", &s.id, &s.tenant_id))?;
        Ok(())
    }

    pub async fn get_snapshot(&self, id: &str) -> Result<Option<SnapshotRecord>, StoreError> {
        let row = query(&format!(
            "SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(snapshot_from_row).transpose()
    }

    /// This tenant's snapshots, newest first.
    pub async fn list_snapshots(&self, tenant_id: &str) -> Result<Vec<SnapshotRecord>, StoreError> {
        let rows = query(&format!(
            "SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE tenant_id = $1 \
             ORDER BY created_at_ms DESC, id DESC"
        ))
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(snapshot_from_row).collect()
    }

    /// Snapshots whose `expires_at <= now`.
    pub async fn expired_snapshots(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Vec<SnapshotRecord>, StoreError> {
        let rows = query(&format!(
            "SELECT {SNAPSHOT_COLUMNS} FROM snapshots WHERE expires_at_ms <= $1 \
             ORDER BY expires_at_ms, id"
        ))
        .bind(to_ms(now))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(snapshot_from_row).collect()
    }

    /// Whether it existed.
    pub async fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        let done = query("DELETE FROM snapshots WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// The session's sandbox was replaced (a restore, a resume from disk). `NotFound` if
    /// there is no such session.
    pub async fn set_session_sandbox(&self, id: &str, sandbox_id: &str) -> Result<(), StoreError> {
        let done = query("UPDATE sessions SET sandbox_id = $2 WHERE id = $1")
            .bind(id)
            .bind(sandbox_id)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    /// `NotFound` if there is no such session.
    pub async fn session_durable(&self, id: &str) -> Result<SessionDurable, StoreError> {
        let row =
            query("SELECT layers_json, pause_kind, lifecycle_json FROM sessions WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?
                .ok_or(StoreError::NotFound)?;
        let what = |col: &str| format!("session {id:?} {col}");
        let pause = get::<Option<String>>(&row, "pause_kind")?
            .map(|k| {
                DurablePause::parse(&k)
                    .ok_or_else(|| StoreError::Corrupt(format!("{}: {k:?}", what("pause_kind"))))
            })
            .transpose()?;
        Ok(SessionDurable {
            layers: from_json(&get::<String>(&row, "layers_json")?, &what("layers"))?,
            pause,
            lifecycle: from_json(&get::<String>(&row, "lifecycle_json")?, &what("lifecycle"))?,
        })
    }

    /// `NotFound` if there is no such session.
    pub async fn set_session_durable(
        &self,
        id: &str,
        d: &SessionDurable,
    ) -> Result<(), StoreError> {
        let done = query(
            "UPDATE sessions SET layers_json = $2, pause_kind = $3, lifecycle_json = $4 \
             WHERE id = $1",
        )
        .bind(id)
        .bind(to_json(&d.layers)?)
        .bind(d.pause.map(DurablePause::as_str))
        .bind(to_json(&d.lifecycle)?)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }
}

fn to_i64(n: u64) -> Result<i64, StoreError> {
    i64::try_from(n).map_err(|_| StoreError::Invalid(format!("{n} does not fit the store")))
}

fn to_u64(n: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("{what}: {n}")))
}

fn insert_error(e: sqlx::Error, kind: &str, id: &str, tenant: &str) -> StoreError {
    match db_kind(&e) {
        Some(sqlx::error::ErrorKind::UniqueViolation) => {
            StoreError::Conflict(format!("{kind} {id} exists"))
        }
        Some(sqlx::error::ErrorKind::ForeignKeyViolation) => {
            StoreError::UnknownTenant(tenant.to_string())
        }
        _ => e.into(),
    }
}

fn layer_from_row(row: &DbRow) -> Result<LayerRecord, StoreError> {
    let id: String = get(row, "id")?;
    let what = |col: &str| format!("layer {id:?} {col}");
    Ok(LayerRecord {
        tenant_id: get(row, "tenant_id")?,
        blob_key: get(row, "blob_key")?,
        size_bytes: to_u64(get(row, "size_bytes")?, &what("size_bytes"))?,
        sha256: get(row, "sha256")?,
        entries: to_u64(get(row, "entries")?, &what("entries"))?,
        created_at: from_ms(get(row, "created_at_ms")?, &what("created_at"))?,
        id,
    })
}

fn snapshot_from_row(row: &DbRow) -> Result<SnapshotRecord, StoreError> {
    let id: String = get(row, "id")?;
    let what = |col: &str| format!("snapshot {id:?} {col}");
    Ok(SnapshotRecord {
        tenant_id: get(row, "tenant_id")?,
        name: get(row, "name")?,
        session_id: get(row, "session_id")?,
        runtime: get(row, "runtime")?,
        language: get(row, "language")?,
        image: get(row, "image")?,
        image_digest: get(row, "image_digest")?,
        layers: from_json(&get::<String>(row, "layers_json")?, &what("layers"))?,
        created_at: from_ms(get(row, "created_at_ms")?, &what("created_at"))?,
        expires_at: from_ms(get(row, "expires_at_ms")?, &what("expires_at"))?,
        id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{on_both_backends, TestDb};
    use crate::tests::{session, store_with, t};
    use crate::SessionRecord;
    use koder_api_types::{OnTimeout, SessionState};

    fn layer(id: &str, tenant: &str, size: u64) -> LayerRecord {
        LayerRecord {
            id: id.into(),
            tenant_id: tenant.into(),
            blob_key: format!("layers/{id}"),
            size_bytes: size,
            sha256: "ab".repeat(32),
            entries: 3,
            created_at: t(1),
        }
    }

    fn snapshot(id: &str, tenant: &str, layers: &[&str], expires: i64) -> SnapshotRecord {
        SnapshotRecord {
            id: id.into(),
            tenant_id: tenant.into(),
            name: Some("n".into()),
            session_id: Some("s1".into()),
            runtime: "jail".into(),
            language: "python".into(),
            image: "host".into(),
            image_digest: None,
            layers: layers.iter().map(|s| s.to_string()).collect(),
            created_at: t(2),
            expires_at: t(expires),
        }
    }

    async fn layers_are_tenant_scoped_and_counted(db: TestDb) {
        let store = store_with(&db, &["a", "b"]).await;
        store.insert_layer(&layer("l1", "a", 100)).await.unwrap();
        store.insert_layer(&layer("l2", "a", 50)).await.unwrap();
        store.insert_layer(&layer("l3", "b", 7)).await.unwrap();
        assert!(matches!(
            store.insert_layer(&layer("l1", "a", 1)).await,
            Err(StoreError::Conflict(_))
        ));
        assert!(matches!(
            store.insert_layer(&layer("lx", "nobody", 1)).await,
            Err(StoreError::UnknownTenant(_))
        ));
        assert_eq!(store.tenant_layer_bytes("a").await.unwrap(), 150);
        assert_eq!(store.tenant_layer_bytes("c").await.unwrap(), 0);
        let got = store
            .layers("a", &["l2".into(), "l1".into()])
            .await
            .unwrap();
        assert_eq!(got, vec![layer("l2", "a", 50), layer("l1", "a", 100)]);
        // Another tenant's layer is not found.
        assert!(matches!(
            store.layers("a", &["l3".into()]).await,
            Err(StoreError::NotFound)
        ));
    }

    async fn referenced_layers_are_those_a_snapshot_or_live_session_lists(db: TestDb) {
        let store = store_with(&db, &["a"]).await;
        for l in ["l1", "l2", "l3", "l4"] {
            store.insert_layer(&layer(l, "a", 1)).await.unwrap();
        }
        store
            .insert_snapshot(&snapshot("s", "a", &["l1"], 100))
            .await
            .unwrap();
        store
            .insert_session(&session("live", "a", 0))
            .await
            .unwrap();
        store
            .insert_session(&session("gone", "a", 0))
            .await
            .unwrap();
        let durable = |l: &str| SessionDurable {
            layers: vec![l.into()],
            ..Default::default()
        };
        store
            .set_session_durable("live", &durable("l2"))
            .await
            .unwrap();
        store
            .set_session_durable("gone", &durable("l3"))
            .await
            .unwrap();
        store
            .set_session_state("gone", SessionState::Stopped, Some("deleted"))
            .await
            .unwrap();
        let used = store.referenced_layers().await.unwrap();
        let mut free: Vec<String> = store
            .all_layers()
            .await
            .unwrap()
            .into_iter()
            .map(|l| l.id)
            .filter(|id| !used.contains(id))
            .collect();
        free.sort();
        assert_eq!(free, ["l3", "l4"]);
    }

    async fn snapshots_round_trip_list_expire_delete(db: TestDb) {
        let store = store_with(&db, &["a", "b"]).await;
        store.insert_layer(&layer("l1", "a", 1)).await.unwrap();
        store
            .insert_snapshot(&snapshot("s1", "a", &["l1"], 10))
            .await
            .unwrap();
        store
            .insert_snapshot(&snapshot("s2", "a", &["l1"], 1000))
            .await
            .unwrap();
        assert_eq!(
            store.get_snapshot("s1").await.unwrap(),
            Some(snapshot("s1", "a", &["l1"], 10))
        );
        assert_eq!(store.list_snapshots("a").await.unwrap().len(), 2);
        assert!(store.list_snapshots("b").await.unwrap().is_empty());
        let expired = store.expired_snapshots(t(500)).await.unwrap();
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].id, "s1");
        assert!(store.delete_snapshot("s1").await.unwrap());
        assert!(!store.delete_snapshot("s1").await.unwrap());
        assert_eq!(store.get_snapshot("s1").await.unwrap(), None);
    }

    async fn session_durable_defaults_and_round_trips(db: TestDb) {
        let store = store_with(&db, &["a"]).await;
        store.insert_session(&session("x", "a", 0)).await.unwrap();
        assert_eq!(
            store.session_durable("x").await.unwrap(),
            SessionDurable::default()
        );
        let mut d = SessionDurable {
            layers: vec!["l1".into(), "l2".into()],
            pause: Some(DurablePause::Disk),
            lifecycle: Lifecycle {
                on_timeout: OnTimeout::Pause,
                auto_resume: true,
                keep_memory: true,
            },
        };
        store.set_session_durable("x", &d).await.unwrap();
        assert_eq!(store.session_durable("x").await.unwrap(), d);
        d.pause = Some(DurablePause::VmMemory);
        store.set_session_durable("x", &d).await.unwrap();
        assert_eq!(store.session_durable("x").await.unwrap(), d);
        d.pause = None;
        store.set_session_durable("x", &d).await.unwrap();
        assert_eq!(store.session_durable("x").await.unwrap(), d);
        assert!(matches!(
            store.session_durable("nope").await,
            Err(StoreError::NotFound)
        ));
        assert!(matches!(
            store.set_session_durable("nope", &d).await,
            Err(StoreError::NotFound)
        ));
    }

    async fn image_builds_kept_are_those_of_unstopped_sessions_and_live_snapshots(db: TestDb) {
        let store = store_with(&db, &["a", "b"]).await;
        store.insert_layer(&layer("l1", "a", 1)).await.unwrap();
        let on = |mut s: SessionRecord, digest: &str| {
            s.image_digest = Some(digest.into());
            s
        };
        store
            .insert_session(&on(session("running", "a", 0), "d-run"))
            .await
            .unwrap();
        store
            .insert_session(&on(session("paused", "b", 0), "d-paused"))
            .await
            .unwrap();
        store
            .set_session_state("paused", SessionState::Paused, None)
            .await
            .unwrap();
        store
            .insert_session(&on(session("ended", "a", 0), "d-ended"))
            .await
            .unwrap();
        store
            .set_session_state("ended", SessionState::Stopped, Some("deleted"))
            .await
            .unwrap();
        store
            .insert_session(&session("host", "a", 0))
            .await
            .unwrap();
        for (id, digest, expires) in [("s-live", "d-snap", 100), ("s-old", "d-expired", 5)] {
            let mut snap = snapshot(id, "a", &["l1"], expires);
            snap.image_digest = Some(digest.into());
            store.insert_snapshot(&snap).await.unwrap();
        }
        store
            .insert_snapshot(&snapshot("s-host", "a", &["l1"], 100))
            .await
            .unwrap();
        assert_eq!(
            store
                .get_snapshot("s-live")
                .await
                .unwrap()
                .unwrap()
                .image_digest
                .as_deref(),
            Some("d-snap")
        );
        let mut kept: Vec<String> = store
            .kept_image_digests(t(10))
            .await
            .unwrap()
            .into_iter()
            .collect();
        kept.sort();
        assert_eq!(kept, ["d-paused", "d-run", "d-snap"]);
        assert_eq!(
            store.snapshots_on_image("d-snap", t(10)).await.unwrap(),
            ["s-live"]
        );
        assert!(store
            .snapshots_on_image("d-expired", t(10))
            .await
            .unwrap()
            .is_empty());

        store
            .set_session_image_digest("running", Some("d-other"))
            .await
            .unwrap();
        let got = store.get_session("running").await.unwrap().unwrap();
        assert_eq!(got.image_digest.as_deref(), Some("d-other"));
        assert!(matches!(
            store.set_session_image_digest("nobody", None).await,
            Err(StoreError::NotFound)
        ));
    }

    on_both_backends!(
        image_builds_kept_are_those_of_unstopped_sessions_and_live_snapshots,
        layers_are_tenant_scoped_and_counted,
        referenced_layers_are_those_a_snapshot_or_live_session_lists,
        snapshots_round_trip_list_expire_delete,
        session_durable_defaults_and_round_trips,
    );
}
