//! The volumes phase: a tenant's volumes (create, list, inspect, delete) and the claims
//! sessions hold on the volumes they mount. A claim is a store row (the one-writer rule is the
//! store's), taken before the sandbox starts and released when the session ends.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use koder_api_types::{
    CreateVolume, SessionVolume, Volume, VolumeList, VolumeMountRequest, VolumeUse,
};
use koder_auth::Identity;
use koder_runtime::VolumeMount;
use koder_store::{NamedVolumeMount, Store, StoreError, VolumeMountRecord, VolumeRecord};

use super::Manager;
use crate::volumes::{validate_mounts, validate_name, Volumes, MIN_SIZE_MIB};
use crate::Error;

impl Manager {
    pub(crate) fn volumes(&self) -> Result<&Volumes, Error> {
        self.volumes.as_deref().ok_or_else(|| {
            Error::NotImplemented("volumes need the daemon's data dir on a root daemon".into())
        })
    }

    /// The tenant's volume by id or name; another tenant's looks unknown.
    pub(crate) async fn volume_record(
        &self,
        who: &Identity,
        key: &str,
    ) -> Result<VolumeRecord, Error> {
        self.store
            .find_volume(&who.tenant_id, key)
            .await?
            .ok_or(Error::VolumeNotFound)
    }

    /// The tenant owning volume `id`, for transports that authenticate with a credential of
    /// the volume itself (E2B's volume token) rather than the tenant's key.
    pub async fn volume_tenant(&self, id: &str) -> Result<Option<Identity>, Error> {
        Ok(self.store.get_volume(id).await?.map(|v| Identity {
            tenant_id: v.tenant_id,
        }))
    }

    /// A new empty volume, or a copy of `from_volume`.
    pub async fn create_volume(&self, who: &Identity, req: CreateVolume) -> Result<Volume, Error> {
        let volumes = self.volumes()?;
        validate_name(&req.name)?;
        let source = match &req.from_volume {
            Some(key) => Some(self.copy_source(who, key, req.size_mib).await?),
            None => None,
        };
        let size_mib = match &source {
            Some(s) => s.size_mib,
            None => req.size_mib.unwrap_or(self.cfg.volume_default_size_mib),
        };
        let max = self.cfg.volume_max_size_mib;
        if !(MIN_SIZE_MIB..=max).contains(&size_mib) {
            return Err(Error::InvalidArgument(format!(
                "size_mib must be {MIN_SIZE_MIB}-{max}, not {size_mib}"
            )));
        }
        // One create at a time: the quota check and the insert must not interleave.
        let _serial = self.volume_lock.lock().await;
        if self
            .store
            .find_volume(&who.tenant_id, &req.name)
            .await?
            .is_some()
        {
            return Err(Error::Conflict(format!(
                "a volume named {:?} exists",
                req.name
            )));
        }
        let quota = self
            .cfg
            .tenant_volume_storage_mib
            .get(&who.tenant_id)
            .copied()
            .unwrap_or(self.cfg.volume_storage_mib);
        let used = self.store.tenant_volume_mib(&who.tenant_id).await?;
        if used.saturating_add(size_mib) > quota {
            let e = Error::QuotaVolumeStorage(format!(
                "the tenant's volumes hold {used} of {quota} MiB; {size_mib} MiB more do not fit"
            ));
            self.metrics.count_quota(&e);
            return Err(e);
        }
        let record = VolumeRecord {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: who.tenant_id.clone(),
            name: req.name,
            size_mib,
            backend: volumes.backend_name().into(),
            created_at: self.now(),
            node_id: self.cfg.node_id.clone(),
        };
        let id = record.id.clone();
        match source {
            Some(src) => volumes.run(move |h| h.snapshot(&src.id, &id)).await?,
            None => volumes.run(move |h| h.create(&id, size_mib)).await?,
        }
        if let Err(e) = self.store.insert_volume(&record).await {
            // Nothing names it: its data goes now rather than waiting for the next start.
            let id = record.id.clone();
            if let Err(e) = volumes.run(move |h| h.delete(&id)).await {
                tracing::error!(volume = %record.id, error = %e, "removing an unrecorded volume");
            }
            return Err(match e {
                StoreError::Conflict(m) => Error::Conflict(m),
                other => other.into(),
            });
        }
        tracing::info!(volume = %record.id, tenant = %record.tenant_id, size_mib, "volume created");
        self.volume_view(&record).await
    }

    /// The volume a copy is made of. A copy has its size; an ext4 image is only copied while
    /// nothing has it mounted (a btrfs snapshot is atomic whatever writes).
    async fn copy_source(
        &self,
        who: &Identity,
        key: &str,
        size_mib: Option<u64>,
    ) -> Result<VolumeRecord, Error> {
        let source = self.volume_record(who, key).await?;
        if size_mib.is_some_and(|s| s != source.size_mib) {
            return Err(Error::InvalidArgument(format!(
                "a copy has its source's size ({} MiB)",
                source.size_mib
            )));
        }
        if source.backend == "ext4" && !self.store.volume_mounts(&source.id).await?.is_empty() {
            return Err(Error::VolumeBusy(format!(
                "volume {key:?} is mounted by a session; an ext4 volume is copied while unmounted"
            )));
        }
        Ok(source)
    }

    pub async fn list_volumes(&self, who: &Identity) -> Result<VolumeList, Error> {
        self.volumes()?;
        let mut volumes = Vec::new();
        for r in self.store.list_volumes(&who.tenant_id).await? {
            volumes.push(self.volume_view(&r).await?);
        }
        Ok(VolumeList { volumes })
    }

    pub async fn get_volume(&self, who: &Identity, key: &str) -> Result<Volume, Error> {
        self.volumes()?;
        let r = self.volume_record(who, key).await?;
        self.volume_view(&r).await
    }

    /// Refused (409) while a session, running or paused, has it mounted. The data stays on
    /// disk for `volume_delete_grace_s` and is then purged.
    pub async fn delete_volume(&self, who: &Identity, key: &str) -> Result<(), Error> {
        let volumes = self.volumes()?;
        let r = self.volume_record(who, key).await?;
        match self.store.delete_volume(&r.id).await {
            Ok(true) => {}
            Ok(false) => return Err(Error::VolumeNotFound),
            Err(StoreError::Conflict(m)) => return Err(Error::VolumeBusy(m)),
            Err(e) => return Err(e.into()),
        }
        let id = r.id.clone();
        if let Err(e) = volumes.run(move |h| h.delete(&id)).await {
            // The row is gone; the start-up sweep trashes what no row names.
            tracing::error!(volume = %r.id, error = %e, "moving a deleted volume to the trash");
        }
        tracing::info!(volume = %r.id, "volume deleted");
        Ok(())
    }

    async fn volume_view(&self, r: &VolumeRecord) -> Result<Volume, Error> {
        let id = r.id.clone();
        let used_bytes = match self.volumes()?.run(move |h| h.usage(&id)).await {
            Ok(u) => Some(u.used_bytes),
            Err(e) => {
                tracing::warn!(volume = %r.id, error = %e, "reading volume usage");
                None
            }
        };
        let mounts = self
            .store
            .volume_mounts(&r.id)
            .await?
            .into_iter()
            .map(|m| VolumeUse {
                session_id: m.session_id,
                path: m.path,
                read_only: m.read_only,
            })
            .collect();
        Ok(Volume {
            volume_id: r.id.clone(),
            name: r.name.clone(),
            size_mib: r.size_mib,
            used_bytes,
            backend: r.backend.clone(),
            created_at: r.created_at,
            mounts,
        })
    }

    /// Claims the volumes a new session `session_id` asks for and attaches them; the claim is
    /// released if the returned guard drops armed.
    pub(super) async fn claim_volumes(
        &self,
        who: &Identity,
        session_id: &str,
        req: &[VolumeMountRequest],
    ) -> Result<(Vec<VolumeMount>, ReleaseOnDrop), Error> {
        let guard = ReleaseOnDrop(Some((self.store.clone(), session_id.to_string())));
        if req.is_empty() {
            return Ok((Vec::new(), guard));
        }
        self.volumes()?;
        validate_mounts(req)?;
        let mut records = Vec::with_capacity(req.len());
        for m in req {
            let v = self
                .volume_record(who, &m.name)
                .await
                .map_err(|e| match e {
                    Error::VolumeNotFound => {
                        Error::InvalidArgument(format!("no volume {:?}", m.name))
                    }
                    other => other,
                })?;
            records.push(VolumeMountRecord {
                volume_id: v.id,
                session_id: session_id.to_string(),
                path: m.path.clone(),
                read_only: m.read_only,
            });
        }
        match self.store.insert_volume_mounts(&records).await {
            Ok(()) => {}
            Err(StoreError::Conflict(m)) => return Err(Error::VolumeBusy(m)),
            Err(e) => return Err(e.into()),
        }
        let mounts = self.attach(&records).await?;
        Ok((mounts, guard))
    }

    /// The mounts of a recorded session (a restore or a resume boots its sandbox again).
    pub(super) async fn session_mounts(&self, session_id: &str) -> Result<Vec<VolumeMount>, Error> {
        let records = self.store.session_volume_mounts(session_id).await?;
        if records.is_empty() {
            return Ok(Vec::new());
        }
        self.attach(&records).await
    }

    async fn attach(&self, records: &[VolumeMountRecord]) -> Result<Vec<VolumeMount>, Error> {
        let volumes = self.volumes()?;
        let mut mounts = Vec::with_capacity(records.len());
        for r in records {
            let id = r.volume_id.clone();
            // The host keeps the volume mounted after the attachment goes (see koder-volumes);
            // the claim row is what keeps it from being deleted under the session.
            let source = volumes
                .run(move |h| Ok(h.attach(&id)?.root().to_path_buf()))
                .await?;
            mounts.push(VolumeMount {
                source,
                target: r.path.clone(),
                read_only: r.read_only,
            });
        }
        Ok(mounts)
    }

    /// The session's volumes as its answers show them.
    pub(super) async fn session_volumes(
        &self,
        session_id: &str,
    ) -> Result<Vec<SessionVolume>, Error> {
        let mounts = self.store.session_volume_mounts_named(session_id).await?;
        Ok(mounts.into_iter().map(session_volume).collect())
    }

    /// The volumes of every session of the tenant, by session, in one store query.
    pub(super) async fn tenant_session_volumes(
        &self,
        tenant_id: &str,
    ) -> Result<HashMap<String, Vec<SessionVolume>>, Error> {
        let mut by_session: HashMap<String, Vec<SessionVolume>> = HashMap::new();
        for m in self.store.tenant_volume_mounts(tenant_id).await? {
            by_session
                .entry(m.mount.session_id.clone())
                .or_default()
                .push(session_volume(m));
        }
        Ok(by_session)
    }

    /// The mount requests that give a fork the source's volumes: read-only, since a volume has
    /// one writer and the source keeps it.
    pub(super) async fn fork_mounts(
        &self,
        session_id: &str,
    ) -> Result<Vec<VolumeMountRequest>, Error> {
        Ok(self
            .store
            .session_volume_mounts(session_id)
            .await?
            .into_iter()
            .map(|m| VolumeMountRequest {
                name: m.volume_id,
                path: m.path,
                read_only: true,
            })
            .collect())
    }

    /// Start-up: drops claims of sessions that are gone, trashes volume data no row names, and
    /// purges trash past its grace period.
    pub(super) async fn reconcile_volumes(&self) -> Result<(), Error> {
        let Some(volumes) = self.volumes.as_deref() else {
            return Ok(());
        };
        let released = self.store.release_orphan_volume_mounts().await?;
        if released > 0 {
            tracing::info!(
                count = released,
                "released volume claims of sessions that are gone"
            );
        }
        let known: std::collections::HashSet<String> = self
            .store
            .all_volumes()
            .await?
            .into_iter()
            .map(|v| v.id)
            .collect();
        let on_disk = volumes.run(|h| h.list_ids()).await?;
        for id in on_disk.into_iter().filter(|id| !known.contains(id)) {
            tracing::warn!(volume = %id, "volume data without a record; moving it to the trash");
            volumes.run(move |h| h.delete(&id)).await?;
        }
        self.purge_volume_trash().await;
        Ok(())
    }

    pub(super) async fn purge_volume_trash(&self) {
        let Some(volumes) = self.volumes.as_deref() else {
            return;
        };
        let grace = std::time::Duration::from_secs(self.cfg.volume_delete_grace_s);
        match volumes.run(move |h| h.purge_trash(grace)).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(count = n, "purged deleted volumes past their grace period"),
            Err(e) => tracing::error!(error = %e, "purging deleted volumes"),
        }
    }
}

/// Releases a session's volume claims on drop unless disarmed: a create that fails, or whose
/// request is dropped, must not leave a volume claimed.
pub(super) struct ReleaseOnDrop(Option<(Store, String)>);

impl ReleaseOnDrop {
    pub(super) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if let Some((store, id)) = self.0.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    if let Err(e) = store.release_volume_mounts(&id).await {
                        tracing::error!(session = %id, error = %e, "releasing volume claims");
                    }
                });
            }
        }
    }
}

/// A volume file time in API terms.
pub(crate) fn time(t: std::time::SystemTime) -> DateTime<Utc> {
    DateTime::<Utc>::from(t)
}

fn session_volume(m: NamedVolumeMount) -> SessionVolume {
    SessionVolume {
        volume_id: m.mount.volume_id,
        name: m.name,
        path: m.mount.path,
        read_only: m.mount.read_only,
    }
}
