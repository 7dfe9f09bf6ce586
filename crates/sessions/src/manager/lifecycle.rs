//! The lifecycle phase: create (from the warm pool or cold), pause/resume, kill the processes,
//! timeouts, and every way a session ends (deleted, expired, out of minutes, its agent died, the
//! daemon shut down), plus reconciling what a previous run left.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use koder_api_types::{CreateSession, Limits, NetworkMode, Session, SessionState};
use koder_auth::Identity;
use koder_runtime::{DiskClone, Sandbox, SandboxSpec, VolumeMount};
use koder_store::{DurablePause, SessionDurable, SessionRecord, Store};
use parking_lot::Mutex;
use tracing::field::Empty;

use super::{validate_env, Manager, Runtimes};
use crate::error::AGENT_EXITED;
use crate::events::{kinds, stop_cause, Events};
use crate::header_rules::HeaderRules;
use crate::limits;
use crate::quota;
use crate::session::Live;
use crate::Error;

/// Sessions whose sandbox died remembered for a typed 410 on later calls; older ones are 404.
const MAX_DIED: usize = 1024;
/// Every how many reaper ticks the session-minutes budgets of tenants are checked.
const MINUTES_CHECK_TICKS: u32 = 5;
/// Deleted volumes are looked at every this many reaper ticks (their grace is long).
const TRASH_PURGE_TICKS: u32 = 60;

/// Why a session whose daemon is gone (`cause`: "daemon restarted", "its node ... was
/// lost") ends, or `None` when it survives that: a pause to disk keeps nothing that ran, a
/// microVM saved with its memory is kept (`saved`, when its files may still be there).
pub(super) fn orphan_reason(
    state: SessionState,
    pause: Option<DurablePause>,
    cause: &str,
    saved: bool,
) -> Option<String> {
    match (state, pause) {
        (SessionState::Paused, Some(DurablePause::Disk)) => None,
        (SessionState::Paused, Some(DurablePause::VmMemory)) if saved => None,
        (SessionState::Paused, Some(DurablePause::VmMemory)) => Some(format!(
            "{cause} (its VM's saved state is incomplete or unavailable)"
        )),
        (SessionState::Paused, None) => {
            Some(format!("{cause} (a memory pause does not survive it)"))
        }
        _ => Some(cause.to_string()),
    }
}

/// Marks every session of this node a previous run could not hand over as stopped and
/// destroys the sandboxes it left behind; VMs saved to files for sessions paused with their
/// memory stay.
pub(super) async fn reconcile(
    store: &Store,
    runtimes: &Runtimes,
    events: &Events,
    node: Option<&str>,
) -> Result<(), Error> {
    const CAUSE: &str = "daemon restarted";
    // (session, tenant, sandbox) of sessions whose VM is saved.
    let mut saved = Vec::new();
    for stale in store.live_sessions_of(node).await? {
        let pause = store.session_durable(&stale.id).await?.pause;
        if pause == Some(DurablePause::VmMemory) && stale.state == SessionState::Paused {
            saved.push((
                stale.id.clone(),
                stale.tenant_id.clone(),
                stale.sandbox_id.clone(),
            ));
            continue;
        }
        if let Some(reason) = orphan_reason(stale.state, pause, CAUSE, true) {
            stop_orphan(store, events, &stale.id, &stale.tenant_id, &reason).await?;
        }
    }
    let mut removed = runtimes.jail.reconcile().await?.sandboxes_removed.len();
    let mut kept = Vec::new();
    if let Ok(vm) = &runtimes.microvm {
        let keep: Vec<String> = saved.iter().map(|(.., sandbox)| sandbox.clone()).collect();
        let report = vm.reconcile_keeping(&keep).await?;
        removed += report.sandboxes_removed.len();
        kept = report.suspended_kept;
    }
    // A saved VM that is not complete (a crash while it was saved or resumed) is gone.
    for (session, tenant, _) in saved.iter().filter(|(.., sandbox)| !kept.contains(sandbox)) {
        let reason = orphan_reason(
            SessionState::Paused,
            Some(DurablePause::VmMemory),
            CAUSE,
            false,
        )
        .unwrap_or_else(|| CAUSE.to_string());
        stop_orphan(store, events, session, tenant, &reason).await?;
    }
    if removed > 0 {
        tracing::info!(count = removed, "removed sandboxes left by a previous run");
    }
    Ok(())
}

/// Records the end of a session no sandbox of this daemon holds, and says so to its tenant.
pub(super) async fn stop_orphan(
    store: &Store,
    events: &Events,
    id: &str,
    tenant: &str,
    reason: &str,
) -> Result<(), Error> {
    store
        .set_session_state(id, SessionState::Stopped, Some(reason))
        .await?;
    events.emit(tenant, kinds::SESSION_STOPPED, stopped(id, reason));
    Ok(())
}

/// Records the end of a session whose node was lost (shown as `lost`), and says so to its
/// tenant; nothing when it had ended already.
pub(super) async fn lose_orphan(
    store: &Store,
    events: &Events,
    id: &str,
    tenant: &str,
    reason: &str,
    at: DateTime<Utc>,
) -> Result<bool, Error> {
    if !store.lose_session(id, reason, at).await? {
        return Ok(false);
    }
    events.emit(tenant, kinds::SESSION_STOPPED, stopped(id, reason));
    Ok(true)
}

/// What a new session's filesystem starts from besides its image.
#[derive(Debug, Clone, Default)]
pub(super) struct Origin {
    /// Captured layer ids, bottom first, as the session records them.
    pub layers: Vec<String>,
    /// A fork's clone of its source's disk: `layers` then sit below it or are in it
    /// ([`DiskClone::layers_below`]).
    pub disk: Option<DiskClone>,
    /// The image build `layers` were captured on (a fork's source's, a snapshot's), chosen
    /// over the build the image's name points at now while the store holds it.
    pub build: Option<String>,
}

/// What [`Manager::sandbox_on`] starts a sandbox from besides its image.
#[derive(Debug, Default)]
pub(super) struct StartFrom {
    /// Local files of the layers the sandbox stacks or applies.
    pub layers: Vec<std::path::PathBuf>,
    pub disk: Option<DiskClone>,
}

impl Manager {
    pub async fn create(&self, who: &Identity, req: CreateSession) -> Result<Session, Error> {
        self.create_ruled(who, req, HeaderRules::new()).await
    }

    /// A create whose egress also sets E2B's request headers (`network.rules`).
    pub async fn create_ruled(
        &self,
        who: &Identity,
        mut req: CreateSession,
        rules: HeaderRules,
    ) -> Result<Session, Error> {
        let origin = match req.from_snapshot.take() {
            Some(snapshot) => self.snapshot_base(who, &snapshot, &mut req).await?,
            None => Origin::default(),
        };
        self.create_with(who, req, origin, &rules).await
    }

    /// Creates a session whose sandbox starts from `origin` (nothing but its image for a
    /// fresh one).
    #[tracing::instrument(name = "session.create", skip_all,
        fields(tenant = %who.tenant_id, session = Empty, source = Empty))]
    pub(super) async fn create_with(
        &self,
        who: &Identity,
        mut req: CreateSession,
        origin: Origin,
        rules: &HeaderRules,
    ) -> Result<Session, Error> {
        let Origin {
            layers,
            disk,
            build,
        } = origin;
        let started = Instant::now();
        if let Some(name) = req.image.as_deref() {
            self.sync_build(name, build.as_deref()).await?;
        }
        // Pinned until the session is recorded: a delete cannot take the image meanwhile.
        let image = match (req.image.as_deref(), build) {
            (Some(name), Some(build)) => {
                self.images
                    .choose_build(name, Some(&build), req.language.as_deref())?
            }
            (name, _) => self.images.choose(name, req.language.as_deref())?,
        };
        let language = image.language;
        let runtime = match req.runtime.as_deref() {
            None | Some("jail") => "jail",
            Some("microvm") => match &self.microvm {
                Ok(_) => "microvm",
                Err(why) => {
                    return Err(Error::RuntimeUnavailable(format!(
                        "the microvm runtime is not available on this server: {why}"
                    )))
                }
            },
            Some(other) => {
                return Err(Error::InvalidArgument(format!(
                    "unknown runtime {other:?}; one of jail, microvm"
                )))
            }
        };
        let requested = req.network.take().unwrap_or_default();
        let policy = crate::egress::policy_for(&requested, &self.cfg.network).await?;
        let network = crate::egress::network_of(requested.mode, &policy);
        let bound = self.bind_secrets(who, &req.secrets).await?;
        let resolved = self.resolve_rules(&who.tenant_id, rules, true).await?;
        if !(bound.is_empty() && resolved.is_empty()) && requested.mode == NetworkMode::None {
            return Err(Error::InvalidArgument(
                "secrets and header rules are applied at egress: they need network mode open or allowlist"
                    .into(),
            ));
        }
        let secrets = self.with_ca(bound, resolved)?;
        for b in &secrets.bound {
            if req
                .env
                .insert(b.name.clone(), b.placeholder.clone())
                .is_some()
            {
                return Err(Error::InvalidArgument(format!(
                    "env {:?} is also a secret's name",
                    b.name
                )));
            }
        }
        if secrets.ca.is_some() {
            for (k, v) in crate::tls::SessionCa::trust_env() {
                req.env.entry(k.into()).or_insert_with(|| v.into());
            }
        }
        let env = validate_env(&req.env)?;
        limits::validate_metadata(&req.metadata)?;
        let timeout_s = limits::timeout(
            &self.cfg,
            req.timeout_s.unwrap_or(self.cfg.default_timeout_s),
        )?;
        let tenant = self
            .store
            .get_tenant(&who.tenant_id)
            .await?
            .ok_or_else(|| Error::PlanRequired(format!("tenant {} has no plan", who.tenant_id)))?;
        let limits = limits::effective(&self.cfg, req.limits.unwrap_or_default(), &tenant.plan)?;
        let ticket = self.admit(&tenant).await?;

        let egress = network.mode != NetworkMode::None;
        // A clone holds the layers it was made above, unless they sat below its disk.
        let layer_files = match &disk {
            Some(clone) if !clone.layers_below => Vec::new(),
            _ => self.layer_files(&who.tenant_id, &layers).await?,
        };
        let session_id = uuid::Uuid::new_v4().simple().to_string();
        let (volumes, claim) = self.claim_volumes(who, &session_id, &req.volumes).await?;
        let has_volumes = !volumes.is_empty();
        let (sandbox, source) = self
            .sandbox_on(
                runtime,
                &image.spec_image,
                language,
                &limits,
                egress,
                StartFrom {
                    layers: layer_files,
                    disk,
                },
                volumes,
            )
            .await?;
        // If this request is dropped (the client went away) before the session is recorded,
        // the sandbox must not outlive it.
        let guard = DestroyOnDrop(Some(sandbox.clone()));
        // A warm sandbox ran its image's start and ready commands before it was pooled.
        if let (Some(prepare), false) = (&image.prepare, source == "pool") {
            prepare.run(&*sandbox).await?;
        }
        let now = self.now();
        let record = SessionRecord {
            id: session_id,
            tenant_id: who.tenant_id.clone(),
            sandbox_id: sandbox.id().to_string(),
            runtime: runtime.into(),
            language: language.into(),
            image: image.name.clone(),
            image_digest: image.build(),
            state: SessionState::Running,
            limits,
            network,
            metadata: req.metadata,
            env: req.env,
            created_at: now,
            expires_at: now + ChronoDuration::seconds(timeout_s as i64),
            ended_at: None,
            end_reason: None,
            node_id: self.cfg.node_id.clone(),
            lost: false,
        };
        self.store.insert_session(&record).await?;
        self.expiry_moved(record.expires_at);
        self.record_bindings(&record.id, &secrets).await?;
        if !rules.is_empty() {
            self.store.set_header_rules(&record.id, rules).await?;
        }
        let span = tracing::Span::current();
        span.record("session", record.id.as_str());
        span.record("source", source);
        let durable = SessionDurable {
            layers,
            pause: None,
            lifecycle: req.lifecycle.unwrap_or_default(),
        };
        if durable != SessionDurable::default() {
            self.store.set_session_durable(&record.id, &durable).await?;
        }
        let live = self
            .install(&record, sandbox, env, policy, has_volumes)
            .await;
        ticket.forget();
        guard.disarm();
        claim.disarm();
        // Before any of the session's code runs: its first connection may need them.
        if let Some(ca) = &secrets.ca {
            if let Err(e) = self.install_trust(who, &record.id, ca).await {
                self.end(&record.id, "its egress CA could not be installed")
                    .await;
                return Err(e);
            }
        }
        // Left unset without secrets: a fork gets its source's bound afterwards.
        if !secrets.is_empty() {
            *live.secrets.write() = Some(Arc::new(secrets));
        }
        self.metrics
            .sessions_created
            .with_label_values(&[source])
            .inc();
        self.metrics
            .create_seconds
            .with_label_values(&[source])
            .observe(started.elapsed().as_secs_f64());
        tracing::info!(session = %record.id, tenant = %record.tenant_id, language, source, "session created");
        self.events.emit(
            &record.tenant_id,
            kinds::SESSION_CREATED,
            serde_json::json!({
                "session_id": record.id,
                "language": record.language,
                "image": record.image,
                "runtime": record.runtime,
                "source": source,
            }),
        );
        // Made without volumes, it has none to read back.
        match has_volumes {
            true => self.view(&record).await,
            false => Ok(super::view(&record)),
        }
    }

    /// Makes `sandbox` the live half of the session `record` and starts what serves it (the
    /// agent watch, egress decisions).
    pub(super) async fn install(
        &self,
        record: &SessionRecord,
        sandbox: Arc<dyn Sandbox>,
        env: Vec<(String, String)>,
        policy: koder_netpolicy::Policy,
        volumes: bool,
    ) -> Arc<Live> {
        let live = Arc::new(Live {
            sandbox,
            tenant_id: record.tenant_id.clone(),
            language: record.language.clone(),
            runtime: record.runtime.clone(),
            image: record.image.clone(),
            env,
            running_execs: AtomicU32::new(0),
            execs: Default::default(),
            errors: Mutex::default(),
            preview_port: Mutex::default(),
            paused: Mutex::default(),
            policy: (record.network.mode != NetworkMode::None)
                .then(|| Arc::new(tokio::sync::Mutex::new(policy))),
            secrets: Arc::default(),
            volumes,
        });
        let replaced = self.live.lock().insert(record.id.clone(), live.clone());
        self.watch_agent(record.id.clone(), &live);
        if let Some(policy) = &live.policy {
            crate::egress::start(
                (&self.store, &self.metrics, self.vault().ok()),
                &self.cfg.network,
                &live,
                record,
                policy.clone(),
            )
            .await;
        }
        match replaced {
            // A restore: the old sandbox goes, the session stays.
            Some(old) => self.retire(&record.id, &old).await,
            None => self.metrics.sessions_active.inc(),
        }
        live
    }

    /// Destroys a sandbox that no longer serves its session (restored over, paused to disk).
    pub(super) async fn retire(&self, id: &str, old: &Live) {
        thaw_if_paused(old).await;
        if let Err(e) = old.sandbox.destroy().await {
            tracing::error!(session = %id, error = %e, "sandbox teardown incomplete");
        }
    }

    /// [`Manager::retire`] that returns once the sandbox's processes are dead, where its
    /// runtime can tell, the rest of the teardown (cgroups, mounts, layers: milliseconds of
    /// cgroupfs and filesystem work) going on on a task of its own. A sandbox with volumes is
    /// torn down in full first: its volumes are free for the next session only after that.
    async fn retire_soon(&self, id: &str, old: Arc<Live>) {
        thaw_if_paused(&old).await;
        if old.volumes || !old.sandbox.stop().await {
            return self.retire(id, &old).await;
        }
        let id = id.to_string();
        self.teardowns.spawn(async move {
            if let Err(e) = old.sandbox.destroy().await {
                tracing::error!(session = %id, error = %e, "sandbox teardown incomplete");
            }
        });
    }

    /// A warm sandbox on `image` (`host` or a digest) with the session's limits applied, or a
    /// fresh one; a sandbox made from layers is always fresh.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn sandbox_on(
        &self,
        runtime: &str,
        image: &str,
        language: &str,
        limits: &Limits,
        egress: bool,
        from: StartFrom,
        volumes: Vec<VolumeMount>,
    ) -> Result<(Arc<dyn Sandbox>, &'static str), Error> {
        let StartFrom { layers, disk } = from;
        let (runtime, pool) = match (&self.microvm, runtime) {
            (Ok(vm), "microvm") => (vm.runtime.clone(), &vm.pool),
            _ => (self.runtime.clone(), &self.pool),
        };
        let runtime_limits = limits::to_runtime_limits(limits);
        // Sandboxes with layers or volumes are made for their session; with egress or without,
        // the pool has a lane for both.
        let fresh = !layers.is_empty() || disk.is_some() || !volumes.is_empty();
        let lane_image = self.pool_image_of(image, language);
        // A fresh one never asks the pool: what it took would be dropped, never destroyed.
        let take = || match fresh {
            true => None,
            false => pool.take(language, &lane_image, limits.disk_mib, egress),
        };
        while let Some(sb) = take() {
            let applied = match sb.resources() {
                Some(rc) => rc.set_limits(&runtime_limits).await,
                None => Ok(()),
            };
            match applied {
                Ok(()) => return Ok((sb, "pool")),
                Err(e) => {
                    tracing::warn!(error = %e, "warm sandbox rejected limits; discarding it");
                    let _ = sb.destroy().await;
                }
            }
        }
        let spec = SandboxSpec {
            id: format!("s{}", uuid::Uuid::new_v4().simple()),
            image: image.into(),
            limits: runtime_limits,
            env: Vec::new(),
            egress,
            layers,
            volumes,
            disk,
        };
        let source = match (&spec.disk, spec.layers.is_empty()) {
            (Some(_), _) => "clone",
            (None, true) => "cold",
            (None, false) => "layers",
        };
        // Started on its own task: a dropped request must not abandon a half-started sandbox,
        // and one that finishes for nobody is destroyed.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let pool = pool.clone();
        tokio::spawn(async move {
            pool.make_room().await;
            if let Err(Ok(orphan)) = tx.send(runtime.create(spec).await) {
                let _ = orphan.destroy().await;
            }
        });
        let created = rx
            .await
            .map_err(|_| Error::Internal("sandbox creation was interrupted".into()))??;
        Ok((created, source))
    }

    pub async fn set_timeout(
        &self,
        who: &Identity,
        id: &str,
        timeout_s: u64,
    ) -> Result<Session, Error> {
        let mut record = self.record(who, id).await?;
        if record.state == SessionState::Stopped {
            return Err(Error::Conflict("the session has ended".into()));
        }
        let timeout_s = limits::timeout(&self.cfg, timeout_s)?;
        record.expires_at = self.now() + ChronoDuration::seconds(timeout_s as i64);
        self.store.set_session_expiry(id, record.expires_at).await?;
        self.expiry_moved(record.expires_at);
        self.view(&record).await
    }

    /// Makes the session's timeout pass now: the reaper then does what its lifecycle says
    /// (end it, or pause it). E2B's `timeout: 0`.
    pub async fn expire_now(&self, who: &Identity, id: &str) -> Result<Session, Error> {
        let mut record = self.record(who, id).await?;
        if record.state == SessionState::Stopped {
            return Err(Error::Conflict("the session has ended".into()));
        }
        record.expires_at = self.now();
        self.store.set_session_expiry(id, record.expires_at).await?;
        self.expiry_moved(record.expires_at);
        self.view(&record).await
    }

    #[tracing::instrument(name = "session.destroy", skip_all,
        fields(tenant = %who.tenant_id, session = %id))]
    pub async fn destroy(&self, who: &Identity, id: &str) -> Result<(), Error> {
        let record = self.record(who, id).await?;
        if record.state != SessionState::Stopped {
            let live = self.live.lock().remove(id);
            self.finish_end_as(id, Some(record), live, "deleted", Teardown::Soon)
                .await;
        } else if record.lost {
            self.store.acknowledge_lost(id).await?;
        }
        Ok(())
    }

    /// Pauses the session with its processes kept (state `paused`); execs are refused until
    /// resumed.
    pub async fn pause(&self, who: &Identity, id: &str) -> Result<Session, Error> {
        self.pause_session(who, id, true).await
    }

    /// Pauses with processes kept (`memory`) or to disk (filesystem kept in the blob store,
    /// sandbox gone, survives restarts). With `memory`, a VM that can be saved to a file is
    /// (nothing runs, nothing is held but files, which survive restarts); other sandboxes are
    /// frozen in place (lost if the daemon stops).
    #[tracing::instrument(name = "session.pause", skip_all,
        fields(tenant = %who.tenant_id, session = %id, memory = memory))]
    pub async fn pause_session(
        &self,
        who: &Identity,
        id: &str,
        memory: bool,
    ) -> Result<Session, Error> {
        let before = self.record(who, id).await?.state;
        let after = self.pause_now(who, id, memory).await?;
        if before != SessionState::Paused && after.state == SessionState::Paused {
            let data = serde_json::json!({"session_id": id, "memory": memory});
            self.events
                .emit(&who.tenant_id, kinds::SESSION_PAUSED, data);
        }
        Ok(after)
    }

    async fn pause_now(&self, who: &Identity, id: &str, memory: bool) -> Result<Session, Error> {
        if !memory {
            self.pause_to_disk(who, id).await?;
            return self.get(who, id).await;
        }
        match self.held_pause(id).await? {
            Some(DurablePause::Disk) => {
                self.record(who, id).await?;
                return Err(Error::Conflict(
                    "the session is paused to disk; resume it first".into(),
                ));
            }
            Some(DurablePause::VmMemory) => return self.get(who, id).await,
            None => {}
        }
        let live = self.live_any(who, id)?;
        if *live.paused.lock() {
            return self.get(who, id).await;
        }
        if live.sandbox.memory_snapshot().is_some() {
            self.save_vm(who, id, live).await?;
            return self.get(who, id).await;
        }
        let rc = live
            .sandbox
            .resources()
            .ok_or_else(|| Error::NotImplemented("this runtime cannot pause sandboxes".into()))?;
        rc.freeze().await?;
        self.store
            .set_session_state(id, SessionState::Paused, None)
            .await?;
        *live.paused.lock() = true;
        self.get(who, id).await
    }

    /// Kills every process of the session but keeps the session (a fork bomb leaves no room
    /// to start even a `kill`). Followed execs end as killed; interpreter contexts restart on
    /// their next run. Returns how many processes were signalled.
    pub async fn kill_processes(&self, who: &Identity, id: &str) -> Result<u32, Error> {
        let live = self.live(who, id)?;
        live.execs.mark_running_killed();
        match live.sandbox.agent().kill_all().await {
            Ok(n) => Ok(n),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    /// Thaws a paused session, boots one paused to disk, or starts its saved VM again;
    /// resuming a running one is a no-op.
    #[tracing::instrument(name = "session.resume", skip_all,
        fields(tenant = %who.tenant_id, session = %id))]
    pub async fn resume(&self, who: &Identity, id: &str) -> Result<Session, Error> {
        let before = self.record(who, id).await?.state;
        let after = self.resume_now(who, id, before).await?;
        if before == SessionState::Paused && after.state == SessionState::Running {
            let data = serde_json::json!({"session_id": id});
            self.events
                .emit(&who.tenant_id, kinds::SESSION_RESUMED, data);
        }
        Ok(after)
    }

    async fn resume_now(
        &self,
        who: &Identity,
        id: &str,
        before: SessionState,
    ) -> Result<Session, Error> {
        if before == SessionState::Paused {
            match self.held_pause(id).await? {
                Some(DurablePause::Disk) => {
                    self.resume_from_disk(who, id).await?;
                    return self.get(who, id).await;
                }
                Some(DurablePause::VmMemory) => {
                    self.resume_vm(who, id).await?;
                    return self.get(who, id).await;
                }
                None => {}
            }
        }
        let live = self.live_any(who, id)?;
        if !*live.paused.lock() {
            return self.get(who, id).await;
        }
        let rc = live
            .sandbox
            .resources()
            .ok_or_else(|| Error::NotImplemented("this runtime cannot pause sandboxes".into()))?;
        rc.thaw().await?;
        self.store
            .set_session_state(id, SessionState::Running, None)
            .await?;
        *live.paused.lock() = false;
        self.get(who, id).await
    }

    /// Ends the session the moment its agent connection closes, so a dead sandbox gives back
    /// its cgroup, layers and quota slot at once instead of looking alive until used.
    pub(super) fn watch_agent(&self, id: String, live: &Arc<Live>) {
        let closed = live.sandbox.agent().closed();
        let (me, watched) = (self.me.clone(), Arc::downgrade(live));
        tokio::spawn(async move {
            closed.await;
            let (Some(me), Some(watched)) = (me.upgrade(), watched.upgrade()) else {
                return;
            };
            me.died(&id, &watched).await;
        });
    }

    /// Ends `id` as died if `watched` is still its live half (an ordinary end that destroyed
    /// the sandbox also closes the connection, and must keep its own reason).
    pub(super) async fn died(&self, id: &str, watched: &Arc<Live>) {
        let live = {
            let mut all = self.live.lock();
            match all.get(id) {
                Some(l) if Arc::ptr_eq(l, watched) => all.remove(id),
                _ => None,
            }
        };
        let Some(live) = live else { return };
        {
            let mut died = self.died.lock();
            if died.len() >= MAX_DIED {
                died.pop_front();
            }
            died.push_back((id.to_string(), live.tenant_id.clone()));
        }
        tracing::warn!(session = %id, "sandbox agent exited; stopping the session");
        self.finish_end(id, Some(live), AGENT_EXITED).await;
    }

    /// Ends a session: its sandbox is destroyed and its record stopped. Idempotent.
    pub(super) async fn end(&self, id: &str, reason: &str) {
        let live = self.live.lock().remove(id);
        self.finish_end(id, live, reason).await;
    }

    pub(super) async fn finish_end(&self, id: &str, live: Option<Arc<Live>>, reason: &str) {
        self.finish_end_as(id, None, live, reason, Teardown::Now)
            .await;
    }

    /// [`Manager::finish_end`]; `record`, the session's record if the caller just read it.
    async fn finish_end_as(
        &self,
        id: &str,
        record: Option<SessionRecord>,
        live: Option<Arc<Live>>,
        reason: &str,
        teardown: Teardown,
    ) {
        // Before the first await: the caller has just taken the session out of the live set.
        let _ending = Ending::enter(&self.ending, id);
        let record = match record {
            Some(r) => Some(r),
            None => self.store.get_session(id).await.ok().flatten(),
        };
        if let Some(r) = record.filter(|r| r.state != SessionState::Stopped) {
            self.events
                .emit(&r.tenant_id, kinds::SESSION_STOPPED, stopped(id, reason));
        }
        if let Some(live) = live {
            match teardown {
                Teardown::Now => self.retire(id, &live).await,
                Teardown::Soon => self.retire_soon(id, live.clone()).await,
            }
            self.admission.release(&live.tenant_id);
            self.metrics.sessions_active.dec();
            self.metrics
                .sessions_ended
                .with_label_values(&[reason])
                .inc();
        }
        if let Err(e) = self
            .store
            .set_session_state(id, SessionState::Stopped, Some(reason))
            .await
        {
            tracing::error!(session = %id, error = %e, "recording session end");
        }
        if let Err(e) = self.store.end_disk_pause(id, self.now()).await {
            tracing::error!(session = %id, error = %e, "closing the session's pause");
        }
        self.discard_saved_vm(id).await;
        if let Err(e) = self.store.release_volume_mounts(id).await {
            tracing::error!(session = %id, error = %e, "releasing the session's volumes");
        }
        tracing::info!(session = %id, reason, "session ended");
    }

    /// The reaper: every `reap_interval`, and at once when a session's timeout passes in
    /// between, so a timeout ends (or pauses) its session when it passes, not at the next tick.
    pub(super) async fn reap_forever(me: Weak<Self>) {
        for tick in 0u32.. {
            let Some(manager) = me.upgrade() else { return };
            manager.reap_expired().await;
            if tick % MINUTES_CHECK_TICKS == 0 {
                manager.enforce_minutes().await;
            }
            if tick % TRASH_PURGE_TICKS == TRASH_PURGE_TICKS - 1 {
                manager.purge_volume_trash().await;
            }
            let wait = manager.until_next_reap().await;
            let wake = manager.reap_wake.clone();
            drop(manager);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = wake.notified() => {}
            }
        }
    }

    /// How long the reaper sleeps: until the next timeout passes, at most `reap_interval`. A
    /// session still expired after a pass (its end or pause failed) waits for the next tick
    /// instead of spinning the reaper.
    async fn until_next_reap(&self) -> Duration {
        let interval = self.cfg.reap_interval;
        let now = self.now();
        let wait = match self.store.next_expiry(self.cfg.node_id.as_deref()).await {
            Ok(Some(at)) if at > now => (at - now).to_std().map_or(interval, |d| d.min(interval)),
            Ok(_) => interval,
            Err(e) => {
                tracing::error!(error = %e, "looking for the next session timeout");
                interval
            }
        };
        *self.reap_at.lock() = ChronoDuration::from_std(wait).ok().map(|d| now + d);
        wait
    }

    /// Wakes the reaper when a session's timeout, now `at`, passes before it means to look.
    fn expiry_moved(&self, at: DateTime<Utc>) {
        if self.reap_at.lock().is_none_or(|planned| at < planned) {
            self.reap_wake.notify_one();
        }
    }

    /// Ends sessions past their timeout.
    pub async fn reap_expired(&self) {
        let _one_at_a_time = self.reaping.lock().await;
        match self
            .store
            .expired_sessions(self.now(), self.cfg.node_id.as_deref())
            .await
        {
            Ok(expired) => {
                for s in expired {
                    self.expire_session(&s).await;
                }
            }
            Err(e) => tracing::error!(error = %e, "looking for expired sessions"),
        }
        self.expire_state().await;
    }

    /// Stops the running sessions of tenants whose daily session-minutes are used up.
    pub async fn enforce_minutes(&self) {
        let mut by_tenant: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (id, l) in self.live.lock().iter() {
            by_tenant
                .entry(l.tenant_id.clone())
                .or_default()
                .push(id.clone());
        }
        for (tenant, ids) in by_tenant {
            let budget = match self.store.get_tenant(&tenant).await {
                Ok(Some(t)) => t.daily_session_minutes,
                _ => None,
            };
            let Some(budget) = budget else { continue };
            match quota::minutes_used(&self.store, &tenant, self.now()).await {
                Ok(used) if used >= budget => {
                    for id in ids {
                        self.end(&id, "session-minutes quota used up").await;
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::error!(%tenant, error = %e, "metering session minutes"),
            }
        }
    }
}

/// How much of a sandbox's teardown an ending session waits for.
#[derive(Clone, Copy)]
enum Teardown {
    /// All of it (the agent died, a timeout, a shutdown: nobody waits for the answer, and
    /// what follows may look at what is left).
    Now,
    /// Its processes' end; the rest finishes on its own task (a DELETE).
    Soon,
}

/// Frozen processes cannot even die: thawed before the kill.
async fn thaw_if_paused(live: &Live) {
    if *live.paused.lock() {
        if let Some(rc) = live.sandbox.resources() {
            let _ = rc.thaw().await;
        }
    }
}

/// The data of a `session.stopped` event.
fn stopped(id: &str, reason: &str) -> serde_json::Value {
    serde_json::json!({"session_id": id, "reason": reason, "cause": stop_cause(reason)})
}

/// Destroys a sandbox on drop unless disarmed (see `Manager::create`).
struct DestroyOnDrop(Option<Arc<dyn Sandbox>>);

impl DestroyOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for DestroyOnDrop {
    fn drop(&mut self) {
        if let Some(sb) = self.0.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = sb.destroy().await;
                });
            }
        }
    }
}

/// Marks a session as being ended for as long as it lives.
struct Ending<'a> {
    all: &'a Mutex<HashMap<String, u32>>,
    id: String,
}

impl<'a> Ending<'a> {
    fn enter(all: &'a Mutex<HashMap<String, u32>>, id: &str) -> Self {
        *all.lock().entry(id.to_string()).or_default() += 1;
        Self {
            all,
            id: id.to_string(),
        }
    }
}

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        let mut all = self.all.lock();
        if let Some(n) = all.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                all.remove(&self.id);
            }
        }
    }
}
