//! State that outlives a sandbox: snapshots (take, list, delete, create from, restore),
//! durable pause and resume, fork, and their retention.
//!
//! A session's filesystem is its image plus a stack of captured layers (`koder-store`
//! `SessionDurable::layers`) plus what its sandbox has written since. A capture freezes the
//! sandbox's processes, streams its writable layer into a new layer and thaws them: the layer
//! holds every file as it was at one instant for the processes of the sandbox (what they had
//! written, including unflushed data the kernel already had; not what a program still kept in
//! its own buffers).

use std::path::PathBuf;

use chrono::Duration as ChronoDuration;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Instant;

use koder_api_types::{CreateSession, CreateSnapshot, OnTimeout, Session, SessionState, Snapshot};
use koder_auth::Identity;
use koder_runtime::{DiskClone, LayerBounds, RuntimeError};
use koder_store::{DurablePause, SessionDurable, SessionRecord, SnapshotRecord};

use super::lifecycle::{Origin, StartFrom};
use super::{validate_env, Manager};
use crate::header_rules::HeaderRules;
use crate::layers::{CloneDir, Layers, Pin};
use crate::session::Live;
use crate::Error;

/// Entries one captured layer may hold.
const MAX_LAYER_ENTRIES: u64 = 500_000;
/// Copies one fork may make.
const MAX_FORK: u32 = 100;
/// Sandboxes a fork starts at once (each cold create is mostly syscalls on one core).
const FORK_PARALLEL: usize = 4;
const MAX_NAME: usize = 128;

/// How the layer a capture makes is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// Stored (blob, cache file, row), as is every layer below it: a snapshot, a pause to
    /// disk.
    Stored,
    /// As a tree on this host where the runtime can copy one (a fork), stored only if a copy
    /// later needs it to be.
    Local,
}

impl Manager {
    fn layer_store(&self) -> Result<&Layers, Error> {
        self.layers.as_deref().ok_or_else(|| {
            Error::NotImplemented("snapshots need a data directory on this server".into())
        })
    }

    /// Local files of the tenant's layers `ids`, for a sandbox to start from.
    pub(super) async fn layer_files(
        &self,
        tenant: &str,
        ids: &[String],
    ) -> Result<Vec<PathBuf>, Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let layers = self.layer_store()?;
        let mut files = Vec::with_capacity(ids.len());
        for id in ids {
            match layers.copied_tree(tenant, id) {
                Some(tree) => files.push(tree),
                None => {
                    let record = self.store.layers(tenant, std::slice::from_ref(id)).await?;
                    files.extend(layers.local(&record).await?);
                }
            }
        }
        Ok(files)
    }

    /// Bytes of snapshot storage the tenant has left; none left is a typed 507.
    async fn room(&self, tenant: &str) -> Result<u64, Error> {
        let mib = self
            .cfg
            .tenant_snapshot_storage_mib
            .get(tenant)
            .copied()
            .unwrap_or(self.cfg.snapshot_storage_mib);
        let limit = mib.saturating_mul(1 << 20);
        let used = self.store.tenant_layer_bytes(tenant).await?;
        match limit.checked_sub(used).filter(|room| *room > 0) {
            Some(room) => Ok(room),
            None => {
                let e = Error::QuotaSnapshotStorage(format!(
                    "the snapshot storage of tenant {tenant} is full ({used} of {limit} bytes used)"
                ));
                self.metrics.count_quota(&e);
                Err(e)
            }
        }
    }

    /// Captures a live session's writable layer with its processes frozen (a paused session's
    /// are frozen already) and returns the layers its filesystem above the image is now, given
    /// `below`, the layers its sandbox was made from. The pin keeps them all until the caller
    /// has recorded the stack.
    ///
    /// A sandbox whose layers sit below its writable layer (shared lower layers) wrote only
    /// what changed since, deletions as whiteouts: the capture stacks onto `below`. Otherwise
    /// its writable layer started as `below` applied and holds everything, so the capture
    /// replaces the stack (stacking it would bring back what the session deleted since, which
    /// no capture records then).
    ///
    /// `keep` says whether every layer of the result must be stored (it outlives the host's
    /// sandboxes) or a fork's tree on this host will do.
    async fn capture(
        &self,
        live: &Live,
        below: &[String],
        keep: Keep,
    ) -> Result<(Vec<String>, Pin), Error> {
        let stacked = live.sandbox.layers_below();
        let layers = self.layer_store()?;
        if keep == Keep::Stored && stacked && layers.any_unstored(below) {
            let room = self.room(&live.tenant_id).await?;
            layers
                .make_durable(below, room)
                .await
                .map_err(|e| self.storage_error(e))?;
        }
        let (layer, _fresh) = self.capture_layer(live, keep).await?;
        let mut stack = if stacked { below.to_vec() } else { Vec::new() };
        stack.push(layer);
        // The layers below are the session's until it ends, which may be before the caller
        // records the stack: pinned with the capture.
        let pin = self.layer_store()?.pin(&stack);
        Ok((stack, pin))
    }

    async fn capture_layer(&self, live: &Live, keep: Keep) -> Result<(String, Pin), Error> {
        let layers = self.layer_store()?;
        let room = self.room(&live.tenant_id).await?;
        let captured = self.frozen(live, async {
            if keep == Keep::Local {
                let bounds = LayerBounds {
                    max_bytes: room,
                    max_entries: MAX_LAYER_ENTRIES,
                };
                let tenant = &live.tenant_id;
                if let Some(copied) = layers.copy_from(tenant, &*live.sandbox, bounds).await? {
                    return Ok(copied);
                }
            }
            let (record, pin) = layers
                .capture(
                    &live.tenant_id,
                    live.sandbox.agent(),
                    room,
                    MAX_LAYER_ENTRIES,
                )
                .await?;
            Ok((record.id, pin))
        });
        captured.await.map_err(|e| self.storage_error(e))
    }

    /// Runs `work` with the session's processes frozen (a paused session's are already), so
    /// what it reads of the session's files is one instant of them.
    async fn frozen<T>(
        &self,
        live: &Live,
        work: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let rc = live.sandbox.resources();
        let frozen_here = match rc {
            Some(rc) if !*live.paused.lock() => {
                rc.freeze().await?;
                true
            }
            _ => false,
        };
        // A request dropped while `work` runs (its client gone) must not leave it frozen.
        let mut thaw = ThawOnDrop(frozen_here.then(|| live.sandbox.clone()));
        let done = work.await;
        if let Some(sandbox) = thaw.0.take() {
            thaw_now(&*sandbox).await;
        }
        done
    }

    /// A clone of the running session's disk for a fork's copies, where its runtime and the
    /// host's filesystem can share blocks (`None` otherwise: then its files are copied), in a
    /// directory of the layer cache the caller removes once the copies are made.
    async fn clone_for_fork(
        &self,
        who: &Identity,
        record: &SessionRecord,
        durable: &SessionDurable,
    ) -> Result<Option<(CloneDir, DiskClone)>, Error> {
        let Some(layers) = self.layers.as_deref() else {
            return Ok(None);
        };
        if record.state == SessionState::Stopped || durable.pause.is_some() {
            return Ok(None);
        }
        let live = self.live_any(who, &record.id)?;
        // As a copied fork: a tenant whose snapshot storage is full cannot fork.
        self.room(&live.tenant_id).await?;
        let dir = layers.clone_dir().await?;
        let cloned = self
            .frozen(&live, async {
                live.sandbox
                    .clone_disk(dir.path())
                    .await
                    .map_err(Error::from)
            })
            .await?;
        Ok(cloned.map(|clone| (dir, clone)))
    }

    /// A layer over the tenant's snapshot storage left is the typed 507 (and counted).
    fn storage_error(&self, e: Error) -> Error {
        let e = match e {
            Error::PayloadTooLarge(m) => Error::QuotaSnapshotStorage(format!(
                "the session's files do not fit the snapshot storage left: {m}"
            )),
            other => other,
        };
        self.metrics.count_quota(&e);
        e
    }

    /// The layers the session's filesystem is now: its stack plus a fresh capture, or just
    /// the stack of a session paused to disk (nothing runs that could change it).
    /// The returned pin keeps a fresh capture until the caller has recorded it.
    async fn current_layers(
        &self,
        who: &Identity,
        record: &SessionRecord,
        keep: Keep,
    ) -> Result<(Vec<String>, Option<Pin>), Error> {
        let mut durable = self.store.session_durable(&record.id).await?;
        if record.state == SessionState::Stopped {
            return Err(Error::Conflict("the session has ended".into()));
        }
        match durable.pause {
            Some(DurablePause::Disk) => return Ok((durable.layers, None)),
            Some(DurablePause::VmMemory) => {
                return Err(Error::Conflict(
                    "the session's VM is saved with its memory; resume it first".into(),
                ))
            }
            None => {}
        }
        let live = self.live_any(who, &record.id)?;
        let (layers, pin) = self.capture(&live, &durable.layers, keep).await?;
        durable.layers = layers;
        Ok((durable.layers, Some(pin)))
    }

    #[tracing::instrument(name = "session.snapshot", skip_all,
        fields(tenant = %who.tenant_id, session = %id))]
    pub async fn snapshot(
        &self,
        who: &Identity,
        id: &str,
        req: CreateSnapshot,
    ) -> Result<Snapshot, Error> {
        validate_name(req.name.as_deref())?;
        let record = self.record(who, id).await?;
        let (layers, _pin) = self.current_layers(who, &record, Keep::Stored).await?;
        let now = self.now();
        let snap = SnapshotRecord {
            id: format!("snap-{}", uuid::Uuid::new_v4().simple()),
            tenant_id: who.tenant_id.clone(),
            name: req.name,
            session_id: Some(record.id.clone()),
            runtime: record.runtime.clone(),
            language: record.language.clone(),
            image: record.image.clone(),
            image_digest: record.image_digest.clone(),
            layers,
            created_at: now,
            expires_at: now + self.retention(),
        };
        self.store.insert_snapshot(&snap).await?;
        self.metrics.snapshots_taken.inc();
        tracing::info!(session = %id, snapshot = %snap.id, "snapshot taken");
        self.snapshot_view(&snap).await
    }

    fn retention(&self) -> ChronoDuration {
        ChronoDuration::seconds(i64::try_from(self.cfg.snapshot_retention_s).unwrap_or(i64::MAX))
    }

    async fn snapshot_view(&self, s: &SnapshotRecord) -> Result<Snapshot, Error> {
        let size_bytes = self
            .store
            .layers(&s.tenant_id, &s.layers)
            .await?
            .iter()
            .map(|l| l.size_bytes)
            .sum();
        Ok(Snapshot {
            snapshot_id: s.id.clone(),
            name: s.name.clone(),
            size_bytes,
            image: s.image.clone(),
            language: s.language.clone(),
            runtime: s.runtime.clone(),
            session_id: s.session_id.clone(),
            created_at: s.created_at,
            expires_at: s.expires_at,
        })
    }

    /// The tenant's snapshot; another tenant's is unknown.
    async fn snapshot_record(&self, who: &Identity, id: &str) -> Result<SnapshotRecord, Error> {
        match self.store.get_snapshot(id).await? {
            Some(s) if s.tenant_id == who.tenant_id && s.expires_at > self.now() => Ok(s),
            _ => Err(Error::SnapshotNotFound),
        }
    }

    pub async fn list_snapshots(&self, who: &Identity) -> Result<Vec<Snapshot>, Error> {
        let now = self.now();
        let mut out = Vec::new();
        for s in self.store.list_snapshots(&who.tenant_id).await? {
            if s.expires_at > now {
                out.push(self.snapshot_view(&s).await?);
            }
        }
        Ok(out)
    }

    pub async fn get_snapshot(&self, who: &Identity, id: &str) -> Result<Snapshot, Error> {
        let s = self.snapshot_record(who, id).await?;
        self.snapshot_view(&s).await
    }

    /// Deletes the snapshot; its layers go once nothing else uses them.
    pub async fn delete_snapshot(&self, who: &Identity, id: &str) -> Result<(), Error> {
        self.snapshot_record(who, id).await?;
        self.store.delete_snapshot(id).await?;
        self.collect_layers().await;
        Ok(())
    }

    /// Fills a create request from the snapshot it names: image, runtime and language are the
    /// snapshot's (asking for others is an error). Returns what to start from: its layers on
    /// the image build it was taken on.
    pub(super) async fn snapshot_base(
        &self,
        who: &Identity,
        snapshot: &str,
        req: &mut CreateSession,
    ) -> Result<Origin, Error> {
        let s = self.snapshot_record(who, snapshot).await?;
        for (what, asked, have) in [
            ("image", &mut req.image, &s.image),
            ("runtime", &mut req.runtime, &s.runtime),
            ("language", &mut req.language, &s.language),
        ] {
            match asked {
                Some(a) if a != have => {
                    return Err(Error::InvalidArgument(format!(
                        "snapshot {snapshot} was taken with {what} {have:?}, not {a:?}"
                    )))
                }
                _ => *asked = Some(have.clone()),
            }
        }
        Ok(Origin {
            layers: s.layers,
            disk: None,
            build: s.image_digest,
        })
    }

    /// Restarts the session's sandbox on the snapshot's filesystem: the processes it runs end,
    /// the session (id, limits, network, timeout) stays. A session paused to disk comes back
    /// running.
    pub async fn restore(
        &self,
        who: &Identity,
        id: &str,
        snapshot_id: &str,
    ) -> Result<Session, Error> {
        let record = self.record(who, id).await?;
        if record.state == SessionState::Stopped {
            return Err(Error::Conflict("the session has ended".into()));
        }
        let snap = self.snapshot_record(who, snapshot_id).await?;
        if (snap.image.as_str(), snap.runtime.as_str()) != (&record.image, &record.runtime) {
            return Err(Error::InvalidArgument(format!(
                "snapshot {snapshot_id} is of a {} {} session, this one is {} {}",
                snap.runtime, snap.image, record.runtime, record.image
            )));
        }
        let mut durable = self.store.session_durable(id).await?;
        durable.layers = snap.layers;
        // Its layers go back onto the build they were captured on.
        let record = SessionRecord {
            image_digest: snap.image_digest.or(record.image_digest),
            ..record
        };
        self.boot(&record, durable).await?;
        tracing::info!(session = %id, snapshot = %snapshot_id, "session restored");
        self.get(who, id).await
    }

    /// An admission slot for a session that holds none (paused to disk or saved).
    async fn admit_again(&self, record: &SessionRecord) -> Result<crate::quota::Ticket, Error> {
        let tenant = self
            .store
            .get_tenant(&record.tenant_id)
            .await?
            .ok_or_else(|| {
                Error::PlanRequired(format!("tenant {} has no plan", record.tenant_id))
            })?;
        self.admit(&tenant).await
    }

    /// An admission slot for a new sandbox of `tenant`, counted against its quotas on every
    /// node; a refusal is counted in the metrics.
    pub(super) async fn admit(
        &self,
        tenant: &koder_store::Tenant,
    ) -> Result<crate::quota::Ticket, Error> {
        self.admission
            .admit(&self.store, tenant, self.cfg.node_id.as_deref(), self.now())
            .await
            .inspect_err(|e| self.metrics.count_quota(e))
    }

    /// Starts a new sandbox for `record` from `durable.layers` and makes it the session's
    /// (replacing a running one), recording the session as running. A session paused to disk
    /// or saved holds no admission slot, so it takes one first; a saved VM it had is removed.
    async fn boot(&self, record: &SessionRecord, mut durable: SessionDurable) -> Result<(), Error> {
        let ticket = match durable.pause {
            Some(_) => {
                let ticket = self.admit_again(record).await?;
                self.claim(record).await?;
                Some(ticket)
            }
            None => None,
        };
        let env = validate_env(&record.env)?;
        let policy = crate::egress::policy_for(&record.network, &self.cfg.network).await?;
        let files = self.layer_files(&record.tenant_id, &durable.layers).await?;
        let egress = record.network.mode != koder_api_types::NetworkMode::None;
        let volumes = self.session_mounts(&record.id).await?;
        let has_volumes = !volumes.is_empty();
        // The image build the session's files were made on (or its name's, when that is gone).
        self.sync_build(&record.image, record.image_digest.as_deref())
            .await?;
        let image = self.images.choose_build(
            &record.image,
            record.image_digest.as_deref(),
            Some(&record.language),
        )?;
        let (sandbox, _) = self
            .sandbox_on(
                &record.runtime,
                &image.spec_image,
                &record.language,
                &record.limits,
                egress,
                StartFrom {
                    layers: files,
                    disk: None,
                },
                volumes,
            )
            .await?;
        // A restored or resumed session starts afresh on its files: its image's start
        // command runs again, as for a new session, and must be ready before it is handed back.
        if let Some(prepare) = &image.prepare {
            if let Err(e) = prepare.run(&*sandbox).await {
                if let Err(d) = sandbox.destroy().await {
                    tracing::warn!(session = %record.id, error = %d, "destroying an unready sandbox");
                }
                return Err(e);
            }
        }
        koder_hostkit::crash::point("restore-before-install");
        let held = durable.pause.take();
        self.store.set_session_durable(&record.id, &durable).await?;
        self.store
            .set_session_sandbox(&record.id, sandbox.id())
            .await?;
        self.store
            .set_session_image_digest(&record.id, image.build().as_deref())
            .await?;
        self.store
            .set_session_state(&record.id, SessionState::Running, None)
            .await?;
        if held.is_some() {
            self.end_held_pause(&record.id).await?;
        }
        if held == Some(DurablePause::VmMemory) {
            self.discard_vm(&record.sandbox_id).await;
        }
        self.install(record, sandbox, env, policy, has_volumes)
            .await;
        if let Some(t) = ticket {
            t.forget();
        }
        self.rebind_secrets(&record.tenant_id, &record.id).await;
        Ok(())
    }

    /// A session that held nothing holds a sandbox again: its time counts, and its timeout is
    /// a running session's.
    async fn end_held_pause(&self, id: &str) -> Result<(), Error> {
        self.store.end_disk_pause(id, self.now()).await?;
        let expires = self.now()
            + ChronoDuration::seconds(
                i64::try_from(self.cfg.default_timeout_s).unwrap_or(i64::MAX),
            );
        self.store.set_session_expiry(id, expires).await?;
        Ok(())
    }

    /// From now on the session holds nothing: its time is not session time, and it is kept
    /// for the snapshot retention.
    async fn begin_held_pause(&self, id: &str) -> Result<(), Error> {
        self.store
            .set_session_state(id, SessionState::Paused, None)
            .await?;
        self.store.begin_disk_pause(id, self.now()).await?;
        self.store
            .set_session_expiry(id, self.now() + self.retention())
            .await?;
        Ok(())
    }

    /// Removes `live` from the live sessions if it is still `id`'s.
    fn take_live(&self, id: &str, live: &Arc<Live>) -> Option<Arc<Live>> {
        let mut all = self.live.lock();
        match all.get(id) {
            Some(l) if Arc::ptr_eq(l, live) => all.remove(id),
            _ => None,
        }
    }

    /// Saves a running session's VM with its memory to files of the runtime: its processes
    /// stop where they are, nothing runs, its admission slot is given back; the session stays
    /// `paused` across daemon restarts for the snapshot retention.
    pub(super) async fn save_vm(
        &self,
        who: &Identity,
        id: &str,
        live: Arc<Live>,
    ) -> Result<(), Error> {
        let _serial = self.vm_state_lock.lock().await;
        let record = self.record(who, id).await?;
        // Out of the live sessions first: the VMM's exit closes the agent connection, which
        // must not read as the sandbox dying.
        let live = self
            .take_live(id, &live)
            .ok_or_else(|| Error::Conflict("the session changed while pausing".into()))?;
        let snapshot = live
            .sandbox
            .memory_snapshot()
            .ok_or_else(|| Error::NotImplemented("this sandbox cannot be saved".into()))?;
        let started = Instant::now();
        if let Err(e) = snapshot.suspend().await {
            if live.sandbox.agent().is_closed() {
                self.finish_end(id, Some(live), "its VM stopped while being saved")
                    .await;
            } else {
                self.live.lock().entry(id.to_string()).or_insert(live);
            }
            return Err(e.into());
        }
        koder_hostkit::crash::point("vm-pause-before-record");
        let mut durable = self.store.session_durable(id).await?;
        durable.pause = Some(DurablePause::VmMemory);
        self.store.set_session_durable(id, &durable).await?;
        self.begin_held_pause(id).await?;
        // Followed execs end with the connection; their processes were saved with the VM.
        live.execs.mark_running_killed();
        self.admission.release(&record.tenant_id);
        self.metrics.sessions_active.dec();
        tracing::info!(session = %id, took = ?started.elapsed(), "session paused with its VM saved");
        Ok(())
    }

    /// Starts a saved VM again and makes it the session's: every process carries on. It
    /// needs an admission slot (429 otherwise, the VM stays saved); a VM that cannot be
    /// started again ends the session.
    pub(super) async fn resume_vm(&self, who: &Identity, id: &str) -> Result<(), Error> {
        let _serial = self.vm_state_lock.lock().await;
        let record = self.record(who, id).await?;
        let mut durable = self.store.session_durable(id).await?;
        if durable.pause != Some(DurablePause::VmMemory) {
            // Resumed by a request that got here first.
            return Ok(());
        }
        let (runtime, pool) = match &self.microvm {
            Ok(engine) => (engine.runtime.clone(), engine.pool.clone()),
            Err(why) => {
                return Err(Error::RuntimeUnavailable(format!(
                    "the microvm runtime is not available on this server: {why}"
                )))
            }
        };
        let ticket = self.admit_again(&record).await?;
        let env = validate_env(&record.env)?;
        let policy = crate::egress::policy_for(&record.network, &self.cfg.network).await?;
        let has_volumes = !self.store.session_volume_mounts(id).await?.is_empty();
        let started = Instant::now();
        pool.make_room().await;
        let sandbox = match runtime.resume_suspended(&record.sandbox_id).await {
            Ok(sandbox) => sandbox,
            Err(e @ RuntimeError::Exhausted(_)) => return Err(e.into()),
            Err(e) => {
                self.finish_end(id, None, "its saved VM could not be started again")
                    .await;
                return Err(e.into());
            }
        };
        durable.pause = None;
        self.store.set_session_durable(id, &durable).await?;
        self.store
            .set_session_state(id, SessionState::Running, None)
            .await?;
        self.end_held_pause(id).await?;
        self.install(&record, sandbox, env, policy, has_volumes)
            .await;
        ticket.forget();
        self.rebind_secrets(&record.tenant_id, id).await;
        tracing::info!(session = %id, took = ?started.elapsed(), "session resumed from its saved VM");
        Ok(())
    }

    /// Removes the saved VM of a session that ends while paused with it.
    pub(super) async fn discard_saved_vm(&self, id: &str) {
        let saved = matches!(
            self.store.session_durable(id).await,
            Ok(d) if d.pause == Some(DurablePause::VmMemory)
        );
        if !saved {
            return;
        }
        if let Ok(Some(record)) = self.store.get_session(id).await {
            self.discard_vm(&record.sandbox_id).await;
        }
    }

    async fn discard_vm(&self, sandbox: &str) {
        if let Ok(engine) = &self.microvm {
            if let Err(e) = engine.runtime.discard_suspended(sandbox).await {
                tracing::error!(%sandbox, error = %e, "removing a saved VM");
            }
        }
    }

    /// Pauses to disk: the filesystem is captured, the sandbox destroyed; nothing runs and
    /// nothing is held but the layers, which outlive the daemon. The session is kept for the
    /// snapshot retention.
    pub(super) async fn pause_to_disk(&self, who: &Identity, id: &str) -> Result<(), Error> {
        let record = self.record(who, id).await?;
        match self.held_pause(id).await? {
            Some(DurablePause::Disk) => return Ok(()),
            // Its files are inside the saved VM: it runs again to have them captured.
            Some(DurablePause::VmMemory) => self.resume_vm(who, id).await?,
            None => {}
        }
        let mut durable = self.store.session_durable(id).await?;
        let live = self.live_any(who, id)?;
        // Its filesystem as a stack of layers, as in `current_layers`.
        let (layers, _pin) = self.capture(&live, &durable.layers, Keep::Stored).await?;
        durable.layers = layers;
        durable.pause = Some(DurablePause::Disk);
        self.store.set_session_durable(id, &durable).await?;
        self.begin_held_pause(id).await?;
        if let Some(old) = self.take_live(id, &live) {
            self.retire(id, &old).await;
            self.admission.release(&record.tenant_id);
            self.metrics.sessions_active.dec();
        }
        tracing::info!(session = %id, "session paused to disk");
        Ok(())
    }

    /// At a clean shutdown a session paused in memory is paused to disk instead, so it
    /// outlives the daemon (its processes cannot). Whether that worked.
    pub(super) async fn keep_paused(&self, id: &str, tenant: &str) -> bool {
        if self.layers.is_none() {
            return false;
        }
        let who = Identity {
            tenant_id: tenant.to_string(),
        };
        match self.pause_to_disk(&who, id).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(session = %id, error = %e, "keeping a paused session across the shutdown");
                false
            }
        }
    }

    /// Resumes a session paused to disk: a fresh sandbox boots on its layers.
    pub(super) async fn resume_from_disk(&self, who: &Identity, id: &str) -> Result<(), Error> {
        let record = self.record(who, id).await?;
        let durable = self.store.session_durable(id).await?;
        if durable.pause != Some(DurablePause::Disk) {
            return Err(Error::Conflict("the session is not paused".into()));
        }
        self.boot(&record, durable).await?;
        tracing::info!(session = %id, "session resumed from disk");
        Ok(())
    }

    /// How the session is paused holding no sandbox, if it is (to disk, or its VM saved).
    pub(super) async fn held_pause(&self, id: &str) -> Result<Option<DurablePause>, Error> {
        Ok(self.store.session_durable(id).await?.pause)
    }

    /// The running session, woken first when it is paused and its lifecycle says a request
    /// resumes it.
    pub(crate) async fn awake(
        &self,
        who: &Identity,
        id: &str,
    ) -> Result<std::sync::Arc<Live>, Error> {
        match self.live(who, id) {
            Err(e @ (Error::NotFound | Error::Conflict(_))) => {
                let Ok(record) = self.record(who, id).await else {
                    return Err(e);
                };
                if record.state != SessionState::Paused {
                    return Err(e);
                }
                if !self.store.session_durable(id).await?.lifecycle.auto_resume {
                    return Err(Error::Conflict(
                        "the session is paused; resume it first".into(),
                    ));
                }
                self.resume(who, id).await?;
                self.live(who, id)
            }
            other => other,
        }
    }

    /// `count` new sessions, each with a copy of the source's filesystem as it is now and the
    /// source's settings (language, image, runtime, limits, network, env, metadata); each has
    /// its own limits and counts against the tenant's quotas. All or nothing.
    pub async fn fork(&self, who: &Identity, id: &str, count: u32) -> Result<Vec<Session>, Error> {
        if count == 0 || count > MAX_FORK {
            return Err(Error::InvalidArgument(format!(
                "count must be 1-{MAX_FORK}, not {count}"
            )));
        }
        let record = self.record(who, id).await?;
        let durable = self.store.session_durable(id).await?;
        let clone = self.clone_for_fork(who, &record, &durable).await?;
        let (origin, _pin) = match &clone {
            // Each copy's disk is a clone of this one, above the layers the source has.
            Some((_, disk)) => {
                let pin = self.layer_store()?.pin(&durable.layers);
                let origin = Origin {
                    layers: durable.layers.clone(),
                    disk: Some(disk.clone()),
                    build: record.image_digest.clone(),
                };
                (origin, Some(pin))
            }
            // The copies' sandboxes are this host's: a tree of it will do until one of them
            // is snapshotted or paused to disk.
            None => {
                let (layers, pin) = self.current_layers(who, &record, Keep::Local).await?;
                let origin = Origin {
                    layers,
                    disk: None,
                    build: record.image_digest.clone(),
                };
                (origin, pin)
            }
        };
        let req = CreateSession {
            language: Some(record.language.clone()),
            image: Some(record.image.clone()),
            runtime: Some(record.runtime.clone()),
            limits: Some(record.limits),
            network: Some(record.network.clone()),
            env: record.env.clone(),
            timeout_s: Some(self.cfg.default_timeout_s),
            metadata: record.metadata.clone(),
            lifecycle: Some(durable.lifecycle),
            from_snapshot: None,
            volumes: self.fork_mounts(id).await?,
            // A fork's environment keeps the placeholders, never the values behind them.
            secrets: Vec::new(),
        };
        // Its header rules, as its secrets, are copied below.
        let no_rules = HeaderRules::new();
        let results: Vec<Result<Session, Error>> = futures::stream::iter(0..count)
            .map(|_| self.create_with(who, req.clone(), origin.clone(), &no_rules))
            .buffer_unordered(FORK_PARALLEL)
            .collect()
            .await;
        // The copies have their own clones of it.
        if let Some((dir, _)) = clone {
            dir.remove().await;
        }
        let (made, failed): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
        let made: Vec<Session> = made.into_iter().filter_map(Result::ok).collect();
        if let Some(Err(e)) = failed.into_iter().next() {
            for s in &made {
                self.end(&s.id, "fork failed").await;
            }
            self.collect_layers().await;
            return Err(e);
        }
        for s in &made {
            if let Err(e) = self.copy_bindings(id, &s.id).await {
                tracing::warn!(session = %s.id, error = %e, "recording a fork's secrets");
            }
            self.rebind_secrets(&who.tenant_id, &s.id).await;
        }
        self.metrics.forks.inc_by(made.len() as u64);
        tracing::info!(session = %id, count, "session forked");
        Ok(made)
    }

    /// Reaper duty: expired snapshots go, then every layer nothing references.
    pub(super) async fn expire_state(&self) {
        match self.store.expired_snapshots(self.now()).await {
            Ok(expired) => {
                for s in expired {
                    if let Err(e) = self.store.delete_snapshot(&s.id).await {
                        tracing::error!(snapshot = %s.id, error = %e, "deleting an expired snapshot");
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "looking for expired snapshots"),
        }
        self.collect_layers().await;
    }

    async fn collect_layers(&self) {
        let Some(layers) = self.layers.as_deref() else {
            return;
        };
        let spare = match super::nodes::layer_grace(&self.store, self.node_id(), self.now()).await {
            Ok(spare) => spare,
            Err(e) => {
                tracing::error!(error = %e, "looking for other nodes before removing layers");
                return;
            }
        };
        if let Err(e) = layers.collect_garbage(spare).await {
            tracing::error!(error = %e, "removing unused layers");
        }
    }

    /// What the reaper does with an expired session: pause it (in memory or to disk, as its
    /// lifecycle says) when it is running and asks for that, otherwise end it. A paused
    /// session's timeout is the snapshot retention; past it, it ends.
    pub(super) async fn expire_session(&self, s: &SessionRecord) {
        let lifecycle = match self.store.session_durable(&s.id).await {
            Ok(d) => d.lifecycle,
            Err(_) => Default::default(),
        };
        if s.state != SessionState::Paused && lifecycle.on_timeout == OnTimeout::Pause {
            let who = Identity {
                tenant_id: s.tenant_id.clone(),
            };
            let paused = if lifecycle.keep_memory {
                self.pause_in_memory_until_retention(&who, &s.id).await
            } else {
                self.pause_session(&who, &s.id, false).await.map(|_| ())
            };
            match paused {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(session = %s.id, error = %e, "pause on timeout failed; ending the session")
                }
            }
        }
        self.end(&s.id, "expired").await;
    }

    async fn pause_in_memory_until_retention(&self, who: &Identity, id: &str) -> Result<(), Error> {
        self.pause_session(who, id, true).await?;
        self.store
            .set_session_expiry(id, self.now() + self.retention())
            .await?;
        Ok(())
    }

    /// The settings every fork and restore copies; exposed for the E2B adapter's views.
    pub async fn durable_of(&self, who: &Identity, id: &str) -> Result<SessionDurable, Error> {
        self.record(who, id).await?;
        Ok(self.store.session_durable(id).await?)
    }
}

/// Thaws the sandbox it holds when dropped before [`Manager::frozen`] took it back.
struct ThawOnDrop(Option<Arc<dyn koder_runtime::Sandbox>>);

impl Drop for ThawOnDrop {
    fn drop(&mut self) {
        let Some(sandbox) = self.0.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move { thaw_now(&*sandbox).await })),
            Err(_) => tracing::error!(sandbox = sandbox.id(), "a sandbox left frozen"),
        }
    }
}

async fn thaw_now(sandbox: &dyn koder_runtime::Sandbox) {
    if let Some(rc) = sandbox.resources() {
        if let Err(e) = rc.thaw().await {
            tracing::error!(error = %e, "thawing a sandbox after reading its files");
        }
    }
}

fn validate_name(name: Option<&str>) -> Result<(), Error> {
    let Some(name) = name else { return Ok(()) };
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "snapshot name must be 1-{MAX_NAME} characters of [A-Za-z0-9._-]"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name(None).is_ok());
        assert!(validate_name(Some("nightly-1.2_x")).is_ok());
        for bad in ["", "a b", "ä", "../x", "a/b", &"x".repeat(MAX_NAME + 1)] {
            assert!(validate_name(Some(bad)).is_err(), "{bad:?}");
        }
    }
}
