//! Volumes and which sessions have them mounted.
//!
//! The one-writer rule lives in the schema (a partial unique index), so two daemons or two
//! concurrent requests cannot both mount a volume read-write.

use chrono::{DateTime, Utc};

use crate::db::{query, DbRow, Target};
use crate::{db_kind, from_ms, get, to_ms, Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRecord {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub size_mib: u64,
    /// `btrfs` or `ext4`.
    pub backend: String,
    pub created_at: DateTime<Utc>,
    /// The node whose disk holds its data; `None` for a volume made before nodes were
    /// recorded.
    pub node_id: Option<String>,
}

/// A session's mount of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMountRecord {
    pub volume_id: String,
    pub session_id: String,
    pub path: String,
    pub read_only: bool,
}

/// A mount with the name of its volume, as session answers show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedVolumeMount {
    pub mount: VolumeMountRecord,
    pub name: String,
}

const VOLUME_COLUMNS: &str = "id, tenant_id, name, size_mib, backend, created_at_ms, node_id";

impl Store {
    /// `Conflict` if the tenant has a volume of that name, `UnknownTenant` if no such tenant.
    pub async fn insert_volume(&self, v: &VolumeRecord) -> Result<(), StoreError> {
        insert_volume_on(v, &self.pool).await
    }

    /// Records the volume only if the tenant's volumes, with it, stay within `quota_mib`;
    /// otherwise `Ok(Quota::Over { used })` and nothing changes. Check and insert are one
    /// transaction holding the tenant's lock (`lock_tenant`), so creates racing on any number
    /// of daemons never overshoot together.
    pub async fn insert_volume_within(
        &self,
        v: &VolumeRecord,
        quota_mib: u64,
    ) -> Result<Quota, StoreError> {
        let mut tx = self.pool.begin().await?;
        crate::lock_tenant(&mut tx, &v.tenant_id).await?;
        let used = volume_mib_on(&v.tenant_id, &mut tx).await?;
        if used.saturating_add(v.size_mib) > quota_mib {
            return Ok(Quota::Over { used });
        }
        insert_volume_on(v, &mut tx).await?;
        tx.commit().await?;
        Ok(Quota::Within)
    }

    /// The tenant's volume whose id or name is `key`.
    pub async fn find_volume(
        &self,
        tenant_id: &str,
        key: &str,
    ) -> Result<Option<VolumeRecord>, StoreError> {
        let row = query(&format!(
            "SELECT {VOLUME_COLUMNS} FROM volumes WHERE tenant_id = $1 AND (id = $2 OR name = $2) \
             ORDER BY id = $2 DESC LIMIT 1"
        ))
        .bind(tenant_id)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(volume_from_row).transpose()
    }

    pub async fn get_volume(&self, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
        let row = query(&format!(
            "SELECT {VOLUME_COLUMNS} FROM volumes WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(volume_from_row).transpose()
    }

    /// The tenant's volumes, oldest first.
    pub async fn list_volumes(&self, tenant_id: &str) -> Result<Vec<VolumeRecord>, StoreError> {
        let rows = query(&format!(
            "SELECT {VOLUME_COLUMNS} FROM volumes WHERE tenant_id = $1 ORDER BY created_at_ms, id"
        ))
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(volume_from_row).collect()
    }

    /// Every volume of every tenant (the daemon's reconcile against the disk).
    pub async fn all_volumes(&self) -> Result<Vec<VolumeRecord>, StoreError> {
        let rows = query(&format!("SELECT {VOLUME_COLUMNS} FROM volumes ORDER BY id"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(volume_from_row).collect()
    }

    /// The size quotas of the tenant's volumes, summed.
    pub async fn tenant_volume_mib(&self, tenant_id: &str) -> Result<u64, StoreError> {
        volume_mib_on(tenant_id, &self.pool).await
    }

    /// Deletes the volume unless a session has it mounted: `Ok(false)` if there was no such
    /// volume, `Conflict` if it is mounted.
    pub async fn delete_volume(&self, id: &str) -> Result<bool, StoreError> {
        let done = query(
            "DELETE FROM volumes WHERE id = $1 \
             AND NOT EXISTS (SELECT 1 FROM volume_mounts WHERE volume_id = $1)",
        )
        .bind(id)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() > 0 {
            return Ok(true);
        }
        match self.get_volume(id).await? {
            Some(_) => Err(StoreError::Conflict(format!(
                "volume {id} is mounted by a session"
            ))),
            None => Ok(false),
        }
    }

    /// Records a session's mounts, all or none. `Conflict` naming the volume if one of the
    /// read-write ones already has a writer.
    pub async fn insert_volume_mounts(
        &self,
        mounts: &[VolumeMountRecord],
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for (position, m) in mounts.iter().enumerate() {
            query(
                "INSERT INTO volume_mounts (volume_id, session_id, path, read_only, position) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(&m.volume_id)
            .bind(&m.session_id)
            .bind(&m.path)
            .bind(m.read_only)
            .bind(position as i64)
            .execute(&mut tx)
            .await
            .map_err(|e| match db_kind(&e) {
                Some(sqlx::error::ErrorKind::UniqueViolation) => StoreError::Conflict(format!(
                    "volume {} is already mounted read-write by another session",
                    m.volume_id
                )),
                Some(sqlx::error::ErrorKind::ForeignKeyViolation) => StoreError::NotFound,
                _ => e.into(),
            })?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The session's mounts, in the order they were asked for.
    pub async fn session_volume_mounts(
        &self,
        session_id: &str,
    ) -> Result<Vec<VolumeMountRecord>, StoreError> {
        let rows = query(
            "SELECT volume_id, session_id, path, read_only FROM volume_mounts \
             WHERE session_id = $1 ORDER BY position",
        )
        .bind(session_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(mount_from_row).collect()
    }

    /// The mounts of every session of the tenant with their volumes' names, in mount order per
    /// session: one query for a whole session list.
    pub async fn tenant_volume_mounts(
        &self,
        tenant_id: &str,
    ) -> Result<Vec<NamedVolumeMount>, StoreError> {
        self.named_mounts(
            "v.tenant_id = $1 ORDER BY m.session_id, m.position",
            tenant_id,
        )
        .await
    }

    /// The session's mounts with their volumes' names, in mount order.
    pub async fn session_volume_mounts_named(
        &self,
        session_id: &str,
    ) -> Result<Vec<NamedVolumeMount>, StoreError> {
        self.named_mounts("m.session_id = $1 ORDER BY m.position", session_id)
            .await
    }

    /// Mounts joined with their volumes' names, selected by `filter` on the one bound `key`.
    async fn named_mounts(
        &self,
        filter: &'static str,
        key: &str,
    ) -> Result<Vec<NamedVolumeMount>, StoreError> {
        let rows = query(&format!(
            "SELECT m.volume_id, m.session_id, m.path, m.read_only, v.name FROM volume_mounts m \
             JOIN volumes v ON v.id = m.volume_id WHERE {filter}"
        ))
        .bind(key)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(named_mount_from_row).collect()
    }

    /// The sessions that have the volume mounted.
    pub async fn volume_mounts(
        &self,
        volume_id: &str,
    ) -> Result<Vec<VolumeMountRecord>, StoreError> {
        let rows = query(
            "SELECT volume_id, session_id, path, read_only FROM volume_mounts \
             WHERE volume_id = $1 ORDER BY session_id",
        )
        .bind(volume_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(mount_from_row).collect()
    }

    /// The session no longer holds its volumes (it ended).
    pub async fn release_volume_mounts(&self, session_id: &str) -> Result<(), StoreError> {
        query("DELETE FROM volume_mounts WHERE session_id = $1")
            .bind(session_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Drops the mounts of stopped sessions (a crash between a session's end and its
    /// release). Returns how many went.
    pub async fn release_stopped_volume_mounts(&self) -> Result<u64, StoreError> {
        let done = query(
            "DELETE FROM volume_mounts WHERE session_id IN \
             (SELECT id FROM sessions WHERE state = 'stopped')",
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Drops every mount whose session is not live, including claims of creates that never
    /// recorded their session. Only safe while no create is in flight (the daemon's start).
    pub async fn release_orphan_volume_mounts(&self) -> Result<u64, StoreError> {
        let done = query(
            "DELETE FROM volume_mounts WHERE session_id NOT IN \
             (SELECT id FROM sessions WHERE state <> 'stopped')",
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}

/// Whether a quota-checked insert happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quota {
    Within,
    /// Refused: this much is used already.
    Over {
        used: u64,
    },
}

async fn insert_volume_on<'a>(
    v: &VolumeRecord,
    on: impl Into<Target<'a>>,
) -> Result<(), StoreError> {
    query(&format!(
        "INSERT INTO volumes ({VOLUME_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"
    ))
    .bind(&v.id)
    .bind(&v.tenant_id)
    .bind(&v.name)
    .bind(i64::try_from(v.size_mib).map_err(|_| StoreError::Invalid("size too large".into()))?)
    .bind(&v.backend)
    .bind(to_ms(v.created_at))
    .bind(v.node_id.as_deref())
    .execute(on)
    .await
    .map_err(|e| match db_kind(&e) {
        Some(sqlx::error::ErrorKind::UniqueViolation) => {
            StoreError::Conflict(format!("a volume named {:?} exists", v.name))
        }
        Some(sqlx::error::ErrorKind::ForeignKeyViolation) => {
            StoreError::UnknownTenant(v.tenant_id.clone())
        }
        _ => e.into(),
    })?;
    Ok(())
}

async fn volume_mib_on<'a>(tenant_id: &str, on: impl Into<Target<'a>>) -> Result<u64, StoreError> {
    // Postgres sums BIGINTs to NUMERIC: cast back.
    let row = query(
        "SELECT CAST(COALESCE(SUM(size_mib), 0) AS BIGINT) AS n FROM volumes \
         WHERE tenant_id = $1",
    )
    .bind(tenant_id)
    .fetch_one(on)
    .await?;
    let total: i64 = get(&row, "n")?;
    Ok(total.max(0) as u64)
}

fn volume_from_row(row: &DbRow) -> Result<VolumeRecord, StoreError> {
    let id: String = get(row, "id")?;
    let size: i64 = get(row, "size_mib")?;
    Ok(VolumeRecord {
        tenant_id: get(row, "tenant_id")?,
        name: get(row, "name")?,
        size_mib: u64::try_from(size)
            .map_err(|_| StoreError::Corrupt(format!("volume {id:?} size_mib {size}")))?,
        backend: get(row, "backend")?,
        created_at: from_ms(
            get(row, "created_at_ms")?,
            &format!("volume {id:?} created_at"),
        )?,
        node_id: get(row, "node_id")?,
        id,
    })
}

fn mount_from_row(row: &DbRow) -> Result<VolumeMountRecord, StoreError> {
    Ok(VolumeMountRecord {
        volume_id: get(row, "volume_id")?,
        session_id: get(row, "session_id")?,
        path: get(row, "path")?,
        read_only: get(row, "read_only")?,
    })
}

fn named_mount_from_row(row: &DbRow) -> Result<NamedVolumeMount, StoreError> {
    Ok(NamedVolumeMount {
        mount: mount_from_row(row)?,
        name: get(row, "name")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{on_both_backends, TestDb};
    use crate::tests::{session, store_with, t};
    use koder_api_types::SessionState;

    fn volume(id: &str, tenant: &str, name: &str) -> VolumeRecord {
        VolumeRecord {
            id: id.into(),
            tenant_id: tenant.into(),
            name: name.into(),
            size_mib: 64,
            backend: "ext4".into(),
            created_at: t(1),
            node_id: Some("n1".into()),
        }
    }

    fn mount(volume: &str, session: &str, read_only: bool) -> VolumeMountRecord {
        VolumeMountRecord {
            volume_id: volume.into(),
            session_id: session.into(),
            path: format!("/v/{volume}"),
            read_only,
        }
    }

    async fn names_are_unique_per_tenant_and_found_by_id_or_name(db: TestDb) {
        let store = store_with(&db, &["a", "b"]).await;
        store
            .insert_volume(&volume("v1", "a", "data"))
            .await
            .unwrap();
        store
            .insert_volume(&volume("v2", "b", "data"))
            .await
            .unwrap();
        let dup = store.insert_volume(&volume("v3", "a", "data")).await;
        assert!(matches!(dup, Err(StoreError::Conflict(_))), "{dup:?}");
        let ghost = store.insert_volume(&volume("v4", "nobody", "x")).await;
        assert!(
            matches!(ghost, Err(StoreError::UnknownTenant(_))),
            "{ghost:?}"
        );
        assert_eq!(
            store.find_volume("a", "data").await.unwrap().unwrap().id,
            "v1"
        );
        assert_eq!(
            store.find_volume("a", "v1").await.unwrap().unwrap().name,
            "data"
        );
        // Another tenant's id is not found.
        assert!(store.find_volume("a", "v2").await.unwrap().is_none());
        assert_eq!(store.tenant_volume_mib("a").await.unwrap(), 64);
        assert_eq!(
            store.get_volume("v2").await.unwrap().unwrap(),
            volume("v2", "b", "data")
        );
    }

    async fn one_writer_many_readers_and_mounted_volumes_stay(db: TestDb) {
        let store = store_with(&db, &["a"]).await;
        store
            .insert_volume(&volume("v1", "a", "data"))
            .await
            .unwrap();
        store
            .insert_volume(&volume("v2", "a", "more"))
            .await
            .unwrap();
        for s in ["s1", "s2", "s3"] {
            store.insert_session(&session(s, "a", 0)).await.unwrap();
        }
        store
            .insert_volume_mounts(&[mount("v1", "s1", false)])
            .await
            .unwrap();
        store
            .insert_volume_mounts(&[mount("v1", "s2", true)])
            .await
            .unwrap();
        // A second writer is refused, and all of its request with it.
        let second = store
            .insert_volume_mounts(&[mount("v2", "s3", false), mount("v1", "s3", false)])
            .await;
        assert!(matches!(second, Err(StoreError::Conflict(_))), "{second:?}");
        assert!(store.session_volume_mounts("s3").await.unwrap().is_empty());
        assert_eq!(store.volume_mounts("v1").await.unwrap().len(), 2);
        assert!(matches!(
            store.delete_volume("v1").await,
            Err(StoreError::Conflict(_))
        ));
        store.release_volume_mounts("s1").await.unwrap();
        store
            .set_session_state("s2", SessionState::Stopped, Some("test"))
            .await
            .unwrap();
        assert_eq!(store.release_stopped_volume_mounts().await.unwrap(), 1);
        // A claim whose session was never recorded goes at the next start.
        store
            .insert_volume_mounts(&[mount("v2", "never", false)])
            .await
            .unwrap();
        assert_eq!(store.release_orphan_volume_mounts().await.unwrap(), 1);
        assert!(store.delete_volume("v1").await.unwrap());
        assert!(!store.delete_volume("v1").await.unwrap());
    }

    async fn mounts_with_names_per_session_and_per_tenant(db: TestDb) {
        let store = store_with(&db, &["a", "b"]).await;
        for (id, tenant, name) in [("v1", "a", "data"), ("v2", "a", "more"), ("v3", "b", "x")] {
            store
                .insert_volume(&volume(id, tenant, name))
                .await
                .unwrap();
        }
        for (s, tenant) in [("s1", "a"), ("s2", "a"), ("s3", "b")] {
            store.insert_session(&session(s, tenant, 0)).await.unwrap();
        }
        // Mount order is kept: v2 was asked for first.
        store
            .insert_volume_mounts(&[mount("v2", "s1", true), mount("v1", "s1", true)])
            .await
            .unwrap();
        store
            .insert_volume_mounts(&[mount("v1", "s2", true)])
            .await
            .unwrap();
        store
            .insert_volume_mounts(&[mount("v3", "s3", false)])
            .await
            .unwrap();
        let named = |m: &[NamedVolumeMount]| -> Vec<(String, String)> {
            m.iter()
                .map(|n| (n.mount.session_id.clone(), n.name.clone()))
                .collect()
        };
        let s1 = store.session_volume_mounts_named("s1").await.unwrap();
        assert_eq!(
            named(&s1),
            [("s1".into(), "more".into()), ("s1".into(), "data".into())]
        );
        let a = store.tenant_volume_mounts("a").await.unwrap();
        assert_eq!(
            named(&a),
            [
                ("s1".into(), "more".into()),
                ("s1".into(), "data".into()),
                ("s2".into(), "data".into())
            ]
        );
        // Another tenant's mounts never show.
        assert_eq!(
            named(&store.tenant_volume_mounts("b").await.unwrap()).len(),
            1
        );
        assert!(store.tenant_volume_mounts("c").await.unwrap().is_empty());
    }

    /// Ten creates of 30 MiB racing under a 100 MiB quota, each on a connection of its own
    /// (another daemon's, on Postgres): three fit, whatever the interleaving.
    async fn racing_creates_never_overshoot_the_quota(db: TestDb) {
        let store = store_with(&db, &["a"]).await;
        let mut racers = tokio::task::JoinSet::new();
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(10));
        for i in 0..10 {
            let s = match db {
                TestDb::Sqlite => store.clone(),
                TestDb::Postgres { .. } => db.open().await,
            };
            let start = start.clone();
            racers.spawn(async move {
                let v = VolumeRecord {
                    size_mib: 30,
                    ..volume(&format!("v{i}"), "a", &format!("n{i}"))
                };
                start.wait().await;
                s.insert_volume_within(&v, 100).await.unwrap()
            });
        }
        let results = racers.join_all().await;
        let within = results.iter().filter(|r| **r == Quota::Within).count();
        assert_eq!(within, 3, "{results:?}");
        assert!(results
            .iter()
            .all(|r| matches!(r, Quota::Within | Quota::Over { used: 90 })));
        assert_eq!(store.tenant_volume_mib("a").await.unwrap(), 90);
        let err = store
            .insert_volume_within(&volume("x", "nobody", "x"), 100)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::UnknownTenant(_)), "{err}");
    }

    on_both_backends!(
        racing_creates_never_overshoot_the_quota,
        names_are_unique_per_tenant_and_found_by_id_or_name,
        one_writer_many_readers_and_mounted_volumes_stay,
        mounts_with_names_per_session_and_per_tenant,
    );
}
