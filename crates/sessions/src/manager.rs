//! The session manager: the one owner of session lifecycle. Every API (REST, and later gRPC and
//! E2B) calls these methods, so tenancy, limits and state transitions are decided once.

use std::collections::VecDeque;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use futures::{Stream, StreamExt};
use koder_agent_protocol::{
    self as proto, AgentClient, ClientError, Entry, EntryKind, FileReader, FromAgent,
};
use koder_api_types::{
    codes, CreateSession, EntryType, ErrorEntry, ExecRequest, ExecResult, FileEntry, FileList,
    Limits, Network, NetworkMode, ReportError, Session, SessionMetrics, SessionState,
};
use koder_auth::Identity;
use koder_runtime::{Runtime, Sandbox, SandboxSpec};
use koder_store::{SessionRecord, Store};
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use crate::config::SessionConfig;
use crate::languages::{self, DEFAULT_LANGUAGE};
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::quota::{self, system_clock, Admission, Clock};
use crate::Error;

const MAX_METADATA_ENTRIES: usize = 64;
const MAX_METADATA_KEY: usize = 256;
const MAX_METADATA_VALUE: usize = 2048;
const MAX_ENV_BYTES: usize = 128 * 1024;

/// The end reason of a session whose agent went away (killed, crashed, or the VM died).
pub const AGENT_EXITED: &str = "agent exited";
/// Sessions whose sandbox died remembered for a typed 410 on later calls; older ones are 404.
const MAX_DIED: usize = 1024;
/// How much longer than its own timeout an exec may take before the daemon gives up on the
/// agent (the agent enforces the timeout itself; this only catches a wedged agent).
pub(crate) const EXEC_GRACE: Duration = Duration::from_secs(10);

/// A running session's in-memory half (the store holds the rest).
pub(crate) struct Live {
    pub(crate) sandbox: Arc<dyn Sandbox>,
    pub(crate) tenant_id: String,
    pub(crate) language: String,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) running_execs: AtomicU32,
    pub(crate) execs: crate::execs::Registry,
    /// The error ring: the last [`MAX_ERRORS`] reports.
    pub(crate) errors: Mutex<std::collections::VecDeque<ErrorEntry>>,
    /// Port pinned with `POST .../preview`; otherwise the upstream is auto-detected.
    pub(crate) preview_port: Mutex<Option<u16>>,
    pub(crate) paused: Mutex<bool>,
}

pub const MAX_ERRORS: usize = 50;

/// The runtimes a manager can create sandboxes with. The jail is always there; the microVM
/// runtime only where this host can run it (otherwise the reason it cannot).
pub struct Runtimes {
    pub jail: Arc<dyn Runtime>,
    pub microvm: Result<Arc<dyn Runtime>, String>,
}

/// A runtime with its warm pool.
struct Engine {
    runtime: Arc<dyn Runtime>,
    pool: Arc<Pool>,
}

pub struct Manager {
    me: Weak<Self>,
    pub(crate) store: Store,
    runtime: Arc<dyn Runtime>,
    pub(crate) cfg: SessionConfig,
    live: Mutex<HashMap<String, Arc<Live>>>,
    pool: Arc<Pool>,
    microvm: Result<Engine, String>,
    metrics: Arc<Metrics>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    admission: Arc<Admission>,
    clock: Clock,
    /// (session, tenant) of sessions ended because their sandbox died, newest last.
    died: Mutex<VecDeque<(String, String)>>,
}

/// Every how many reaper ticks the session-minutes budgets of tenants are checked.
const MINUTES_CHECK_TICKS: u32 = 5;

impl Manager {
    /// Reconciles what a previous run left (sessions it could not hand over are marked
    /// stopped, their sandboxes destroyed), then starts the reaper and the warm-pool filler.
    pub async fn start(
        store: Store,
        runtime: Arc<dyn Runtime>,
        cfg: SessionConfig,
    ) -> Result<Arc<Self>, Error> {
        Self::start_with_clock(store, runtime, cfg, system_clock()).await
    }

    /// [`Manager::start`] with an injected clock (tests cross day boundaries with it).
    pub async fn start_with_clock(
        store: Store,
        runtime: Arc<dyn Runtime>,
        cfg: SessionConfig,
        clock: Clock,
    ) -> Result<Arc<Self>, Error> {
        let runtimes = Runtimes {
            jail: runtime,
            microvm: Err("the microvm runtime is not configured on this server".into()),
        };
        Self::start_with_runtimes(store, runtimes, cfg, clock).await
    }

    /// [`Manager::start`] with every runtime this server offers.
    pub async fn start_with_runtimes(
        store: Store,
        runtimes: Runtimes,
        cfg: SessionConfig,
        clock: Clock,
    ) -> Result<Arc<Self>, Error> {
        let runtime = runtimes.jail;
        for stale in store.live_sessions().await? {
            store
                .set_session_state(&stale.id, SessionState::Stopped, Some("daemon restarted"))
                .await?;
        }
        let mut removed = runtime.reconcile().await?.sandboxes_removed.len();
        if let Ok(vm) = &runtimes.microvm {
            removed += vm.reconcile().await?.sandboxes_removed.len();
        }
        if removed > 0 {
            tracing::info!(count = removed, "removed sandboxes left by a previous run");
        }
        let metrics = Arc::new(Metrics::new());
        let pool = Arc::new(Pool::new(
            runtime.clone(),
            cfg.pool.clone(),
            to_runtime_limits(&cfg.default_limits),
            metrics.clone(),
        ));
        let microvm = runtimes.microvm.map(|runtime| Engine {
            pool: Arc::new(Pool::new(
                runtime.clone(),
                cfg.microvm_pool.clone(),
                to_runtime_limits(&cfg.default_limits),
                metrics.clone(),
            )),
            runtime,
        });
        let manager = Arc::new_cyclic(|me| Self {
            me: me.clone(),
            store,
            runtime,
            cfg,
            live: Mutex::default(),
            pool: pool.clone(),
            microvm,
            metrics,
            tasks: Mutex::default(),
            admission: Arc::default(),
            clock,
            died: Mutex::default(),
        });
        let reaper = tokio::spawn(Self::reap_forever(Arc::downgrade(&manager)));
        let filler = tokio::spawn(pool.run_filler());
        manager.tasks.lock().extend([reaper, filler]);
        if let Ok(vm) = &manager.microvm {
            let filler = tokio::spawn(vm.pool.clone().run_filler());
            manager.tasks.lock().push(filler);
        }
        Ok(manager)
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub(crate) fn metrics_handle(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Whether the daemon can record sessions (its state store answers).
    pub async fn ready(&self) -> Result<(), Error> {
        self.store.list_tenants().await?;
        Ok(())
    }

    /// The tenant of session `id` if it has not stopped, for transports that authenticate with
    /// a credential of the session itself (E2B's access token) rather than the tenant's key.
    pub async fn owner_of_active(&self, id: &str) -> Result<Option<Identity>, Error> {
        Ok(self
            .store
            .get_session(id)
            .await?
            .filter(|r| r.state != SessionState::Stopped)
            .map(|r| Identity {
                tenant_id: r.tenant_id,
            }))
    }

    pub fn pool_depth(&self, language: &str) -> usize {
        self.pool.depth(language)
    }

    /// Stops background tasks and destroys every sandbox (sessions end as "daemon shutdown").
    pub async fn shutdown(&self) {
        let tasks: Vec<JoinHandle<()>> = self.tasks.lock().drain(..).collect();
        for t in tasks {
            t.abort();
            // Abort lands at the task's next await; a warm sandbox start in the middle of its
            // synchronous set-up must finish (or stop) before the final sweep below.
            let _ = t.await;
        }
        let ids: Vec<String> = self.live.lock().keys().cloned().collect();
        for id in ids {
            self.end(&id, "daemon shutdown").await;
        }
        self.pool.drain().await;
        if let Ok(vm) = &self.microvm {
            vm.pool.drain().await;
        }
        // A warm sandbox whose start the abort above interrupted is only reachable this way.
        let vm = self.microvm.as_ref().ok().map(|e| &e.runtime);
        for runtime in std::iter::once(&self.runtime).chain(vm) {
            if let Err(e) = runtime.reconcile().await {
                tracing::error!(error = %e, "final sweep of sandboxes at shutdown");
            }
        }
    }

    pub async fn create(&self, who: &Identity, req: CreateSession) -> Result<Session, Error> {
        let started = Instant::now();
        let language = languages::canonical(req.language.as_deref().unwrap_or(DEFAULT_LANGUAGE))?;
        let image = match req.image.as_deref() {
            None | Some("host") => "host",
            Some(other) => {
                return Err(Error::InvalidArgument(format!(
                    "unknown image {other:?}; available: host"
                )))
            }
        };
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
        let requested = req.network.unwrap_or_default();
        let policy = crate::egress::policy_for(&requested, &self.cfg.network).await?;
        let network = Network {
            mode: requested.mode,
            allow: policy.describe(),
        };
        let env = validate_env(&req.env)?;
        validate_metadata(&req.metadata)?;
        let timeout_s =
            self.validate_timeout(req.timeout_s.unwrap_or(self.cfg.default_timeout_s))?;
        let tenant = self
            .store
            .get_tenant(&who.tenant_id)
            .await?
            .ok_or_else(|| Error::PlanRequired(format!("tenant {} has no plan", who.tenant_id)))?;
        let limits = self.effective_limits(req.limits.unwrap_or_default(), &tenant.plan)?;
        let ticket = self
            .admission
            .admit(&self.store, &tenant, self.now())
            .await?;

        let egress = network.mode != NetworkMode::None;
        let (sandbox, source) = self.sandbox_for(runtime, language, &limits, egress).await?;
        // If this request is dropped (the client went away) before the session is recorded,
        // the sandbox must not outlive it.
        let guard = DestroyOnDrop(Some(sandbox.clone()));
        let now = self.now();
        let record = SessionRecord {
            id: uuid::Uuid::new_v4().simple().to_string(),
            tenant_id: who.tenant_id.clone(),
            sandbox_id: sandbox.id().to_string(),
            runtime: runtime.into(),
            language: language.into(),
            image: image.into(),
            state: SessionState::Running,
            limits,
            network,
            metadata: req.metadata,
            env: req.env,
            created_at: now,
            expires_at: now + ChronoDuration::seconds(timeout_s as i64),
            ended_at: None,
            end_reason: None,
        };
        self.store.insert_session(&record).await?;
        let live = Arc::new(Live {
            sandbox,
            tenant_id: record.tenant_id.clone(),
            language: language.into(),
            env,
            running_execs: AtomicU32::new(0),
            execs: Default::default(),
            errors: Mutex::default(),
            preview_port: Mutex::default(),
            paused: Mutex::default(),
        });
        self.live.lock().insert(record.id.clone(), live.clone());
        self.watch_agent(record.id.clone(), &live);
        ticket.forget();
        guard.disarm();
        if egress {
            let live = self.live.lock().get(&record.id).cloned();
            if let Some(live) = live {
                crate::egress::start(self, &live, &record, policy).await;
            }
        }
        self.metrics.sessions_active.inc();
        self.metrics
            .sessions_created
            .with_label_values(&[source])
            .inc();
        self.metrics
            .create_seconds
            .with_label_values(&[source])
            .observe(started.elapsed().as_secs_f64());
        tracing::info!(session = %record.id, tenant = %record.tenant_id, language, source, "session created");
        Ok(view(&record))
    }

    /// A warm sandbox with the session's limits applied, or a fresh one.
    async fn sandbox_for(
        &self,
        runtime: &str,
        language: &str,
        limits: &Limits,
        egress: bool,
    ) -> Result<(Arc<dyn Sandbox>, &'static str), Error> {
        let (runtime, pool) = match (&self.microvm, runtime) {
            (Ok(vm), "microvm") => (vm.runtime.clone(), &vm.pool),
            _ => (self.runtime.clone(), &self.pool),
        };
        let runtime_limits = to_runtime_limits(limits);
        // Warm sandboxes have no network; one with egress is always made for its session.
        while let Some(sb) = pool.take(language, limits.disk_mib).filter(|_| !egress) {
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
            image: "host".into(),
            limits: runtime_limits,
            env: Vec::new(),
            egress,
        };
        // Started on its own task: a dropped request must not abandon a half-started sandbox,
        // and one that finishes for nobody is destroyed.
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            if let Err(Ok(orphan)) = tx.send(runtime.create(spec).await) {
                let _ = orphan.destroy().await;
            }
        });
        let created = rx
            .await
            .map_err(|_| Error::Internal("sandbox creation was interrupted".into()))??;
        Ok((created, "cold"))
    }

    pub async fn list(&self, who: &Identity) -> Result<Vec<Session>, Error> {
        Ok(self
            .store
            .list_sessions(&who.tenant_id, false)
            .await?
            .iter()
            .map(view)
            .collect())
    }

    pub async fn get(&self, who: &Identity, id: &str) -> Result<Session, Error> {
        Ok(view(&self.record(who, id).await?))
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
        let timeout_s = self.validate_timeout(timeout_s)?;
        record.expires_at = self.now() + ChronoDuration::seconds(timeout_s as i64);
        self.store.set_session_expiry(id, record.expires_at).await?;
        Ok(view(&record))
    }

    pub async fn destroy(&self, who: &Identity, id: &str) -> Result<(), Error> {
        let record = self.record(who, id).await?;
        if record.state != SessionState::Stopped {
            self.end(id, "deleted").await;
        }
        Ok(())
    }

    /// Freezes every process of the session (state `paused`); execs are refused until resumed.
    pub async fn pause(&self, who: &Identity, id: &str) -> Result<Session, Error> {
        let live = self.live_any(who, id)?;
        if *live.paused.lock() {
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

    /// Thaws a paused session; resuming a running one is a no-op.
    pub async fn resume(&self, who: &Identity, id: &str) -> Result<Session, Error> {
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
    fn watch_agent(&self, id: String, live: &Arc<Live>) {
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
    async fn died(&self, id: &str, watched: &Arc<Live>) {
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
    async fn end(&self, id: &str, reason: &str) {
        let live = self.live.lock().remove(id);
        self.finish_end(id, live, reason).await;
    }

    async fn finish_end(&self, id: &str, live: Option<Arc<Live>>, reason: &str) {
        if let Some(live) = live {
            // Frozen processes cannot even die: thaw before the kill.
            if *live.paused.lock() {
                if let Some(rc) = live.sandbox.resources() {
                    let _ = rc.thaw().await;
                }
            }
            if let Err(e) = live.sandbox.destroy().await {
                tracing::error!(session = %id, error = %e, "sandbox teardown incomplete");
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
        tracing::info!(session = %id, reason, "session ended");
    }

    async fn reap_forever(me: std::sync::Weak<Self>) {
        for tick in 0u32.. {
            let Some(manager) = me.upgrade() else { return };
            let interval = manager.cfg.reap_interval;
            manager.reap_expired().await;
            if tick % MINUTES_CHECK_TICKS == 0 {
                manager.enforce_minutes().await;
            }
            drop(manager);
            tokio::time::sleep(interval).await;
        }
    }

    /// Ends sessions past their timeout.
    pub async fn reap_expired(&self) {
        match self.store.expired_sessions(self.now()).await {
            Ok(expired) => {
                for s in expired {
                    self.end(&s.id, "expired").await;
                }
            }
            Err(e) => tracing::error!(error = %e, "looking for expired sessions"),
        }
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

    /// Live sessions of `tenant` and session-minutes it used today.
    pub async fn tenant_usage(&self, tenant: &str) -> Result<(u64, u64), Error> {
        let live = self
            .live
            .lock()
            .values()
            .filter(|l| l.tenant_id == tenant)
            .count() as u64;
        Ok((
            live,
            quota::minutes_used(&self.store, tenant, self.now()).await?,
        ))
    }

    /// Now, at the millisecond precision the store keeps, so every answer shows the same instant.
    fn now(&self) -> DateTime<Utc> {
        let now = (self.clock)();
        DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now)
    }

    /// The tenant's session record; another tenant's id is indistinguishable from an unknown one.
    async fn record(&self, who: &Identity, id: &str) -> Result<SessionRecord, Error> {
        match self.store.get_session(id).await? {
            Some(r) if r.tenant_id == who.tenant_id => Ok(r),
            _ => Err(Error::NotFound),
        }
    }

    /// The tenant's running session; a paused one is a conflict (resume it first).
    pub(crate) fn live(&self, who: &Identity, id: &str) -> Result<Arc<Live>, Error> {
        let live = self.live_any(who, id)?;
        if *live.paused.lock() {
            return Err(Error::Conflict(
                "the session is paused; resume it first".into(),
            ));
        }
        Ok(live)
    }

    /// The tenant's live session, paused or not. A session whose sandbox died is a 410 with
    /// the reason, so a caller can tell a crash from a session it never had.
    pub(crate) fn live_any(&self, who: &Identity, id: &str) -> Result<Arc<Live>, Error> {
        match self.live.lock().get(id) {
            Some(l) if l.tenant_id == who.tenant_id => return Ok(l.clone()),
            _ => {}
        }
        let died = self
            .died
            .lock()
            .iter()
            .any(|(s, t)| s == id && *t == who.tenant_id);
        if died {
            Err(Error::SessionStopped(AGENT_EXITED.into()))
        } else {
            Err(Error::NotFound)
        }
    }

    /// Maps an agent failure to an API error; a vanished agent ends its session (the watcher
    /// does too: whichever comes first).
    pub(crate) async fn agent_failed(&self, id: &str, e: ClientError) -> Error {
        if matches!(e, ClientError::Disconnected) {
            let live = self.live.lock().get(id).cloned();
            if let Some(live) = live.filter(|l| l.sandbox.agent().is_closed()) {
                self.died(id, &live).await;
            }
        }
        e.into()
    }

    /// Adds to the session's error ring (the oldest of more than 50 goes).
    pub fn report_error(
        &self,
        who: &Identity,
        id: &str,
        report: ReportError,
    ) -> Result<ErrorEntry, Error> {
        let live = self.live(who, id)?;
        let bounded = |what: &str, v: &str, max: usize| {
            if v.len() > max {
                Err(Error::InvalidArgument(format!(
                    "{what} longer than {max} bytes"
                )))
            } else {
                Ok(())
            }
        };
        bounded("source", &report.source, 256)?;
        bounded("message", &report.message, 16 * 1024)?;
        bounded("stack", report.stack.as_deref().unwrap_or(""), 64 * 1024)?;
        if report.source.is_empty() || report.message.is_empty() {
            return Err(Error::InvalidArgument(
                "source and message are required".into(),
            ));
        }
        let entry = ErrorEntry {
            at: self.now(),
            source: report.source,
            message: report.message,
            stack: report.stack,
        };
        let mut ring = live.errors.lock();
        if ring.len() >= MAX_ERRORS {
            ring.pop_front();
        }
        ring.push_back(entry.clone());
        Ok(entry)
    }

    pub fn errors(&self, who: &Identity, id: &str) -> Result<Vec<ErrorEntry>, Error> {
        Ok(self.live(who, id)?.errors.lock().iter().cloned().collect())
    }

    pub async fn metrics_of(&self, who: &Identity, id: &str) -> Result<SessionMetrics, Error> {
        let live = self.live(who, id)?;
        let record = self.record(who, id).await?;
        let usage = live
            .sandbox
            .resources()
            .ok_or_else(|| {
                Error::NotImplemented("this runtime does not report resource use".into())
            })?
            .usage()
            .await?;
        let (disk_total, disk_used) = match live.sandbox.agent().disk_usage().await {
            Ok(d) => d,
            Err(e) => return Err(self.agent_failed(id, e).await),
        };
        Ok(SessionMetrics {
            cpu_used_ms: usage.cpu_usage_us / 1000,
            memory_current_kib: usage.memory_current_bytes / 1024,
            memory_peak_kib: usage.memory_peak_bytes / 1024,
            memory_limit_kib: record.limits.memory_mib.map(|m| m * 1024),
            oom_kills: usage.oom_kills,
            pids_current: usage.pids_current,
            pids_limit: record.limits.pids,
            disk_used_kib: disk_used / 1024,
            disk_total_kib: disk_total / 1024,
        })
    }

    pub async fn exec(
        &self,
        who: &Identity,
        id: &str,
        req: ExecRequest,
    ) -> Result<ExecResult, Error> {
        let live = self.live(who, id)?;
        let agent_req = self.exec_request(&live, req, false)?;
        let meter = Meter::start(live.clone()).await;
        let deadline = exec_deadline(agent_req.timeout_ms);
        let outcome = within(
            deadline,
            collect_exec(live.sandbox.agent(), agent_req, self.cfg.output_limit_bytes),
        )
        .await;
        let mut out = match outcome {
            Ok(out) => out,
            Err(e) => {
                meter.abandon();
                return Err(self.agent_failed(id, e).await);
            }
        };
        let (verdict, peak_kib) = meter.finish(&out.exit, out.killed, &self.metrics).await;
        Ok(ExecResult {
            exec_id: uuid::Uuid::new_v4().simple().to_string(),
            exit_code: out.exit.exit_code,
            signal: out.exit.signal,
            stdout: String::from_utf8_lossy(&std::mem::take(&mut out.stdout)).into_owned(),
            stderr: String::from_utf8_lossy(&std::mem::take(&mut out.stderr)).into_owned(),
            stdout_truncated: out.stdout_truncated,
            stderr_truncated: out.stderr_truncated,
            duration_ms: out.exit.duration_ms,
            peak_memory_kib: peak_kib,
            verdict: verdict.map(String::from),
        })
    }

    /// The agent request for an API exec; `background` keeps stdin open for later input and
    /// leaves output bounding to the daemon's per-exec buffer.
    pub(crate) fn exec_request(
        &self,
        live: &Live,
        req: ExecRequest,
        background: bool,
    ) -> Result<proto::ExecRequest, Error> {
        let argv = match (req.cmd, req.shell, req.code) {
            (None, None, Some(code)) => {
                languages::code_argv(req.language.as_deref().unwrap_or(&live.language), &code)?
            }
            _ if req.language.is_some() => {
                return Err(Error::InvalidArgument(
                    "language only applies to code".into(),
                ))
            }
            (Some(cmd), None, None) => {
                if cmd.first().is_none_or(String::is_empty) {
                    return Err(Error::InvalidArgument("cmd must name a program".into()));
                }
                cmd
            }
            (None, Some(shell), None) => vec!["/bin/bash".into(), "-c".into(), shell],
            _ => {
                return Err(Error::InvalidArgument(
                    "give exactly one of cmd, shell or code".into(),
                ))
            }
        };
        let timeout_ms = req.timeout_ms.unwrap_or(self.cfg.default_exec_timeout_ms);
        if timeout_ms == 0 || timeout_ms > self.cfg.max_exec_timeout_ms {
            return Err(Error::InvalidArgument(format!(
                "timeout_ms must be 1..={}",
                self.cfg.max_exec_timeout_ms
            )));
        }
        let (uid, mut env) = account(req.user.as_deref(), live.env.clone())?;
        for (k, v) in validate_env(&req.env)? {
            env.retain(|(ek, _)| *ek != k);
            env.push((k, v));
        }
        if let Some(cwd) = &req.cwd {
            if cwd.is_empty() || cwd.contains('\0') || cwd.len() > proto::MAX_PATH_BYTES {
                return Err(Error::InvalidArgument("cwd must be a path".into()));
            }
        }
        Ok(proto::ExecRequest {
            argv,
            env,
            cwd: req.cwd,
            stdin: req.stdin.map(String::into_bytes).unwrap_or_default(),
            keep_stdin_open: background,
            timeout_ms: Some(timeout_ms),
            output_limit_bytes: if background {
                u64::MAX
            } else {
                self.cfg.output_limit_bytes
            },
            uid,
            gid: uid,
        })
    }

    /// Writes a file atomically from `body`, creating missing parents. What it creates belongs
    /// to `user`'s account (`root` when `None`); a replaced file keeps its owner.
    pub async fn upload<S, E>(
        &self,
        who: &Identity,
        id: &str,
        path: &str,
        declared_len: Option<u64>,
        mut body: S,
        user: Option<&str>,
    ) -> Result<FileEntry, Error>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let live = self.live(who, id)?;
        let max = self.cfg.max_file_bytes;
        if declared_len.is_some_and(|n| n > max) {
            return Err(Error::PayloadTooLarge(format!(
                "files are limited to {max} bytes"
            )));
        }
        validate_path(path)?;
        let owner = owner_of(user)?;
        let agent = live.sandbox.agent();
        let mut writer = match agent
            .write_file(proto::WriteFileRequest {
                path: path.into(),
                mode: None,
                create_parents: true,
                max_bytes: Some(max),
                owner,
            })
            .await
        {
            Ok(w) => w,
            Err(e) => return Err(self.agent_failed(id, e).await),
        };
        while let Some(chunk) = body.next().await {
            // Dropping `writer` on any early return discards the partial upload in the sandbox.
            let chunk = chunk.map_err(|e| Error::InvalidArgument(format!("upload body: {e}")))?;
            if let Err(e) = writer.write(&chunk).await {
                return Err(self.agent_failed(id, e).await);
            }
        }
        match writer.finish().await {
            Ok(entry) => Ok(file_entry(entry)),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    /// Opens a file for a streaming download.
    pub async fn download(
        &self,
        who: &Identity,
        id: &str,
        path: &str,
    ) -> Result<FileReader, Error> {
        let live = self.live(who, id)?;
        validate_path(path)?;
        match live.sandbox.agent().open_read(path, u64::MAX).await {
            Ok(r) => Ok(r),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    pub async fn list_files(
        &self,
        who: &Identity,
        id: &str,
        path: &str,
        depth: u32,
    ) -> Result<FileList, Error> {
        let live = self.live(who, id)?;
        validate_path(path)?;
        if depth == 0 || depth > 32 {
            return Err(Error::InvalidArgument("depth must be 1..=32".into()));
        }
        match live.sandbox.agent().list(path, depth).await {
            Ok((entries, truncated)) => Ok(FileList {
                entries: entries.into_iter().map(file_entry).collect(),
                truncated,
            }),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    pub async fn remove_file(
        &self,
        who: &Identity,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<(), Error> {
        let live = self.live(who, id)?;
        validate_path(path)?;
        match live.sandbox.agent().remove(path, recursive).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    /// `mkdir -p`; what it creates belongs to `user`'s account (`root` when `None`).
    pub async fn make_dir(
        &self,
        who: &Identity,
        id: &str,
        path: &str,
        user: Option<&str>,
    ) -> Result<FileEntry, Error> {
        let live = self.live(who, id)?;
        validate_path(path)?;
        let owner = owner_of(user)?;
        match live.sandbox.agent().make_dir(path, owner).await {
            Ok(e) => Ok(file_entry(e)),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    pub async fn move_file(
        &self,
        who: &Identity,
        id: &str,
        from: &str,
        to: &str,
    ) -> Result<FileEntry, Error> {
        let live = self.live(who, id)?;
        validate_path(from)?;
        validate_path(to)?;
        match live.sandbox.agent().rename(from, to).await {
            Ok(e) => Ok(file_entry(e)),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    /// Request over defaults, checked against the server maxima and the tenant plan's.
    fn effective_limits(&self, req: Limits, plan: &str) -> Result<Limits, Error> {
        let d = self.cfg.default_limits;
        let m = match self.cfg.plans.get(plan) {
            Some(p) => tighter(&self.cfg.max_limits, &p.max_limits),
            None => self.cfg.max_limits,
        };
        let pick = |name: &str,
                    asked: Option<u64>,
                    default: Option<u64>,
                    max: Option<u64>|
         -> Result<Option<u64>, Error> {
            let v = asked.or(default);
            match (v, max) {
                (Some(0), _) => Err(Error::InvalidArgument(format!(
                    "limits.{name} must be positive"
                ))),
                (Some(v), Some(max)) if v > max => Err(Error::InvalidArgument(format!(
                    "limits.{name} = {v} exceeds the maximum {max} of this server and plan"
                ))),
                _ => Ok(v),
            }
        };
        Ok(Limits {
            cpu_millis: pick(
                "cpu_millis",
                req.cpu_millis.map(u64::from),
                d.cpu_millis.map(u64::from),
                m.cpu_millis.map(u64::from),
            )?
            .map(|v| v as u32),
            memory_mib: pick("memory_mib", req.memory_mib, d.memory_mib, m.memory_mib)?,
            disk_mib: pick("disk_mib", req.disk_mib, d.disk_mib, m.disk_mib)?,
            pids: pick("pids", req.pids, d.pids, m.pids)?,
        })
    }

    fn validate_timeout(&self, timeout_s: u64) -> Result<u64, Error> {
        if timeout_s == 0 || timeout_s > self.cfg.max_timeout_s {
            return Err(Error::InvalidArgument(format!(
                "timeout_s must be 1..={}",
                self.cfg.max_timeout_s
            )));
        }
        Ok(timeout_s)
    }
}

/// Field by field, the smaller of two sets of maxima (`None` = no maximum).
fn tighter(a: &Limits, b: &Limits) -> Limits {
    fn min(a: Option<u64>, b: Option<u64>) -> Option<u64> {
        match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        }
    }
    Limits {
        cpu_millis: min(a.cpu_millis.map(u64::from), b.cpu_millis.map(u64::from)).map(|v| v as u32),
        memory_mib: min(a.memory_mib, b.memory_mib),
        disk_mib: min(a.disk_mib, b.disk_mib),
        pids: min(a.pids, b.pids),
    }
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

/// Current usage where the runtime reports it; a failed reading counts as none.
pub(crate) async fn usage_of(
    rc: Option<&dyn koder_runtime::ResourceControl>,
) -> Option<koder_runtime::Usage> {
    match rc {
        Some(rc) => rc.usage().await.ok(),
        None => None,
    }
}

/// Resource counters around one exec, for its verdict and peak memory.
pub(crate) struct Meter {
    live: Arc<Live>,
    before: Option<koder_runtime::Usage>,
    peak_tracked: bool,
    started: Instant,
}

impl Meter {
    pub(crate) async fn start(live: Arc<Live>) -> Self {
        let alone = live.running_execs.fetch_add(1, Ordering::SeqCst) == 0;
        let rc = live.sandbox.resources();
        // The cgroup's peak is per session: it only describes this exec when no other runs.
        let peak_tracked = match rc {
            Some(rc) if alone => rc.reset_memory_peak().await.is_ok(),
            _ => false,
        };
        let before = usage_of(rc).await;
        Self {
            live,
            before,
            peak_tracked,
            started: Instant::now(),
        }
    }

    /// The exec never produced a result (its sandbox went away).
    pub(crate) fn abandon(self) {
        self.live.running_execs.fetch_sub(1, Ordering::SeqCst);
    }

    /// The verdict (None for a normal exit) and the peak memory in KiB, if attributable.
    pub(crate) async fn finish(
        self,
        exit: &proto::ExitInfo,
        killed: bool,
        metrics: &Metrics,
    ) -> (Option<&'static str>, Option<u64>) {
        let after = usage_of(self.live.sandbox.resources()).await;
        self.live.running_execs.fetch_sub(1, Ordering::SeqCst);
        let grew = |f: fn(&koder_runtime::Usage) -> u64| matches!((self.before, after), (Some(b), Some(a)) if f(&a) > f(&b));
        let verdict = if killed {
            Some(codes::EXEC_KILLED)
        } else if exit.timed_out {
            Some(codes::EXEC_TIMEOUT)
        } else if grew(|u| u.oom_kills) && exit.signal == Some(SIGKILL) {
            Some(codes::EXEC_KILLED_OOM)
        } else if grew(|u| u.pids_max_hits) && exit.exit_code != Some(0) {
            // A fork refused at the pids limit is what brought the exec down.
            Some(codes::EXEC_KILLED_PIDS)
        } else {
            None
        };
        metrics
            .execs
            .with_label_values(&[verdict.unwrap_or("ok")])
            .inc();
        metrics
            .exec_seconds
            .observe(self.started.elapsed().as_secs_f64());
        let peak = after
            .filter(|_| self.peak_tracked)
            .map(|u| u.memory_peak_bytes / 1024);
        (verdict, peak)
    }
}

/// An exec's collected output; `killed` when the sandbox went away mid-run (what was printed
/// until then is kept).
struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdout_truncated: bool,
    stderr_truncated: bool,
    exit: proto::ExitInfo,
    killed: bool,
}

async fn collect_exec(
    agent: &AgentClient,
    req: proto::ExecRequest,
    limit: u64,
) -> Result<Collected, ClientError> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let began = Instant::now();
    let mut running = false;
    let mut stream = agent.exec(req).await?;
    let mut c = Collected {
        stdout: Vec::new(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        exit: proto::ExitInfo::default(),
        killed: false,
    };
    loop {
        match stream.recv().await {
            Ok(FromAgent::Started { .. }) => running = true,
            Ok(FromAgent::Stdout(d)) => {
                c.stdout_truncated |= append_bounded(&mut c.stdout, &d, limit)
            }
            Ok(FromAgent::Stderr(d)) => {
                c.stderr_truncated |= append_bounded(&mut c.stderr, &d, limit)
            }
            Ok(FromAgent::Exited(exit)) => {
                c.stdout_truncated |= exit.stdout_truncated;
                c.stderr_truncated |= exit.stderr_truncated;
                c.exit = exit;
                return Ok(c);
            }
            Ok(other) => {
                return Err(ClientError::Protocol(
                    format!("unexpected {other:?}").chars().take(80).collect(),
                ))
            }
            // Output already received is the partial result of a killed exec.
            Err(ClientError::Disconnected) if running => {
                c.killed = true;
                c.exit.signal = Some(SIGKILL);
                c.exit.duration_ms = began.elapsed().as_millis() as u64;
                return Ok(c);
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long the daemon waits for an exec of `timeout_ms` (none: the server's one-shot deadline).
pub(crate) fn exec_deadline(timeout_ms: Option<u64>) -> Duration {
    match timeout_ms {
        Some(ms) => Duration::from_millis(ms) + EXEC_GRACE,
        None => proto::client::REQUEST_DEADLINE,
    }
}

/// The first answer on a stream that starts a long-lived operation (terminal, watch, preview
/// connection), within the one-shot deadline.
pub(crate) async fn first_answer(s: &mut proto::AgentStream) -> Result<FromAgent, ClientError> {
    within(proto::client::REQUEST_DEADLINE, s.recv()).await
}

/// `fut`, or a timeout error once `deadline` has passed (dropping `fut` cancels its streams).
pub(crate) async fn within<T>(
    deadline: Duration,
    fut: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    tokio::time::timeout(deadline, fut)
        .await
        .unwrap_or(Err(ClientError::Timeout(deadline)))
}

fn append_bounded(buf: &mut Vec<u8>, data: &[u8], limit: usize) -> bool {
    let room = limit.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
    data.len() > room
}

pub(crate) const SIGKILL: i32 = 9;
/// Uid/gid of the sandbox's unprivileged `user` account.
pub const SANDBOX_USER_ID: u32 = 1000;

/// An environment in the agent's order (later entries win).
pub(crate) type Env = Vec<(String, String)>;

/// The sandbox uid a process runs as (`None`: the sandbox's root) and `env` with that
/// account's HOME and USER in it.
pub(crate) fn account(user: Option<&str>, mut env: Env) -> Result<(Option<u32>, Env), Error> {
    match user {
        None | Some("root") => Ok((None, env)),
        Some("user") => {
            for (k, v) in [("HOME", "/home/user"), ("USER", "user")] {
                env.retain(|(ek, _)| ek != k);
                env.push((k.to_string(), v.to_string()));
            }
            Ok((Some(SANDBOX_USER_ID), env))
        }
        Some(other) => Err(Error::InvalidArgument(format!(
            "unknown user {other:?}; root or user"
        ))),
    }
}

/// The sandbox (uid, gid) what `user` creates belongs to; `None` for root.
fn owner_of(user: Option<&str>) -> Result<Option<(u32, u32)>, Error> {
    let (uid, _) = account(user, Vec::new())?;
    Ok(uid.map(|u| (u, u)))
}

pub(crate) fn validate_env(env: &BTreeMap<String, String>) -> Result<Vec<(String, String)>, Error> {
    let mut size = 0;
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(Error::InvalidArgument(format!(
                "environment variable {k:?}: names must be non-empty without '=' and no NUL bytes anywhere"
            )));
        }
        size += k.len() + v.len() + 2;
    }
    if size > MAX_ENV_BYTES {
        return Err(Error::InvalidArgument(format!(
            "environment exceeds {MAX_ENV_BYTES} bytes"
        )));
    }
    Ok(env.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

fn validate_metadata(meta: &BTreeMap<String, String>) -> Result<(), Error> {
    if meta.len() > MAX_METADATA_ENTRIES {
        return Err(Error::InvalidArgument(format!(
            "at most {MAX_METADATA_ENTRIES} metadata entries"
        )));
    }
    if meta
        .iter()
        .any(|(k, v)| k.is_empty() || k.len() > MAX_METADATA_KEY || v.len() > MAX_METADATA_VALUE)
    {
        return Err(Error::InvalidArgument(format!(
            "metadata keys must be 1-{MAX_METADATA_KEY} bytes and values at most {MAX_METADATA_VALUE}"
        )));
    }
    Ok(())
}

/// Cheap checks before a round trip; the agent resolves (and re-validates) every path in-root.
fn validate_path(path: &str) -> Result<(), Error> {
    if path.is_empty() {
        return Err(Error::InvalidArgument("path is required".into()));
    }
    if path.contains('\0') {
        return Err(Error::InvalidArgument(
            "path must not contain NUL bytes".into(),
        ));
    }
    if path.len() > proto::MAX_PATH_BYTES {
        return Err(Error::InvalidArgument(format!(
            "path longer than {} bytes",
            proto::MAX_PATH_BYTES
        )));
    }
    Ok(())
}

fn to_runtime_limits(l: &Limits) -> koder_runtime::Limits {
    koder_runtime::Limits {
        cpu_millis: l.cpu_millis,
        memory_mib: l.memory_mib,
        pids: l.pids,
        disk_mib: l.disk_mib,
    }
}

fn view(r: &SessionRecord) -> Session {
    Session {
        id: r.id.clone(),
        tenant_id: r.tenant_id.clone(),
        language: r.language.clone(),
        image: r.image.clone(),
        runtime: r.runtime.clone(),
        state: r.state,
        created_at: r.created_at,
        expires_at: r.expires_at,
        limits: r.limits,
        network: Network {
            mode: r.network.mode,
            allow: r.network.allow.clone(),
        },
        metadata: r.metadata.clone(),
        end_reason: r.end_reason.clone(),
    }
}

fn file_entry(e: Entry) -> FileEntry {
    FileEntry {
        name: e.name,
        path: e.path,
        kind: match e.kind {
            EntryKind::File => EntryType::File,
            EntryKind::Dir => EntryType::Dir,
            EntryKind::Symlink => EntryType::Symlink,
            EntryKind::Other => EntryType::Other,
        },
        size: e.size,
        mode: e.mode,
        modified_at: DateTime::from_timestamp_millis(e.modified_ms).unwrap_or_default(),
        symlink_target: e.symlink_target,
        uid: e.uid,
        gid: e.gid,
    }
}
