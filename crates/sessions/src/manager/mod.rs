//! The session manager: the one owner of session lifecycle. Every API (REST, E2B, later gRPC)
//! calls its methods, so tenancy, limits and state transitions are decided once. This module
//! holds the manager itself, its start and shutdown, the tenant-checked lookups and the helpers
//! every phase shares; the phases live beside it: [`lifecycle`], [`exec`], [`files`] and
//! [`observe`].

pub(crate) mod account;
mod build;
mod e2b_secrets;
pub(crate) mod exec;
mod files;
mod images;
mod lifecycle;
mod network;
mod nodes;
mod observe;
mod secrets;
mod state;
mod volume_files;
mod volumes;

pub use account::{Account, SANDBOX_USER_ID};
pub use build::{BuildSandbox, StepCommand, StepExit};
pub use e2b_secrets::E2bSecret;
pub use exec::{BackgroundExec, LaterStdin};
pub use nodes::Peer;
pub use observe::EVENTS_PAGE_MAX;
pub use volume_files::{VolumeEntry, VolumeFile, VolumeMeta};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use koder_agent_protocol::{self as proto, ClientError, FromAgent};
use koder_api_types::{Session, SessionState};
use koder_auth::Identity;
use koder_runtime::Runtime;
use koder_store::{SessionRecord, Store};
use parking_lot::Mutex;
use tokio::task::JoinHandle;

use crate::config::SessionConfig;
use crate::error::AGENT_EXITED;
use crate::events::Events;
use crate::images::Images;
use crate::layers::Layers;
use crate::limits;
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::quota::{system_clock, Admission, Clock};
use crate::session::Live;
use crate::shared_images::SharedImages;
use crate::volumes::Volumes;
use crate::Error;

const MAX_ENV_BYTES: usize = 128 * 1024;

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
    /// Teardowns of deleted sessions' sandboxes, finishing after their DELETE answered.
    teardowns: tokio_util::task::TaskTracker,
    admission: Arc<Admission>,
    clock: Clock,
    /// (session, tenant) of sessions ended because their sandbox died, newest last.
    died: Mutex<VecDeque<(String, String)>>,
    /// Sessions being ended here: out of the live set, their sandbox going down, the record
    /// not yet stopped. They count as ended to [`Manager::owner_of_active`].
    /// How many ends of each are under way (two may overlap; the last one out clears it).
    ending: Mutex<HashMap<String, u32>>,
    /// Captured layers (snapshots, durable pauses, forks); `None` without a state dir.
    layers: Option<Arc<Layers>>,
    /// This host's volumes; `None` without a state dir.
    volumes: Option<Arc<Volumes>>,
    /// Serializes volume creates (quota check, then insert).
    volume_lock: tokio::sync::Mutex<()>,
    /// Serializes saving VMs to files and resuming them: two resumes of one saved VM would
    /// race for its state.
    vm_state_lock: tokio::sync::Mutex<()>,
    /// When the reaper means to look next, and what wakes it before then: a session whose
    /// timeout passes sooner (created, or its timeout shortened meanwhile).
    reap_at: Mutex<Option<DateTime<Utc>>>,
    reap_wake: Arc<tokio::sync::Notify>,
    /// One sweep at a time: two would both act on a session expired when each listed it (and
    /// the second, finding it paused by the first, would end it).
    reaping: tokio::sync::Mutex<()>,
    /// The images sessions run on, and which are in use.
    images: Images,
    /// Named images shared with the other nodes (`SessionConfig::share_images`).
    shared: Option<SharedImages>,
    /// Where lifecycle events go (webhooks, the sessions' logs).
    pub(crate) events: Events,
}

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
        let events = Events::logged_in(store.clone());
        lifecycle::reconcile(&store, &runtimes, &events, cfg.node_id.as_deref()).await?;
        let layers = match &cfg.state_dir {
            Some(dir) => {
                let layers = Layers::open(&cfg.blobs, dir, store.clone()).await?;
                let spare = nodes::layer_grace(&store, cfg.node_id.as_deref(), Utc::now()).await?;
                layers.sweep(spare).await?;
                Some(Arc::new(layers))
            }
            None => None,
        };
        let volumes = match &cfg.state_dir {
            // Without volumes the daemon still serves sessions; volume calls say why not (501).
            Some(dir) => {
                match Volumes::open(&dir.join("volumes"), &dir.join("volume-templates")).await {
                    Ok(v) => Some(Arc::new(v)),
                    Err(e) => {
                        tracing::warn!(error = %e, "volumes are not available on this host");
                        None
                    }
                }
            }
            None => None,
        };
        let images = Images::new(cfg.image_store.clone(), &cfg.images.language_packs)?;
        let shared = match (&layers, &cfg.image_store, &cfg.node_id) {
            (Some(layers), Some(image_store), Some(node)) if cfg.share_images => {
                Some(SharedImages::new(
                    layers.blobs().clone(),
                    store.clone(),
                    image_store.clone(),
                    node.clone(),
                ))
            }
            _ => None,
        };
        if let Some(shared) = &shared {
            let keep = store.kept_image_digests(Utc::now()).await?;
            let before = Utc::now() - crate::shared_images::PUBLISH_GRACE;
            match shared.collect_garbage(&keep, before).await {
                Ok(0) => {}
                Ok(gone) => tracing::info!(gone, "shared image builds no name points at removed"),
                Err(e) => tracing::warn!(error = %e, "collecting shared image builds"),
            }
        }
        let runtime = runtimes.jail;
        let metrics = Arc::new(Metrics::new());
        let pool = Arc::new(
            Pool::new(
                runtime.clone(),
                cfg.pool.clone(),
                &images.pool_images(),
                limits::to_runtime_limits(&cfg.default_limits),
                metrics.clone(),
            )
            .with_startups(images.pool_startups()),
        );
        // The microVM pool's languages run on the same images as the jail's.
        let microvm = runtimes.microvm.map(|runtime| Engine {
            pool: Arc::new(
                Pool::new(
                    runtime.clone(),
                    cfg.microvm_pool.clone(),
                    &images.pool_images(),
                    limits::to_runtime_limits(&cfg.default_limits),
                    metrics.clone(),
                )
                .with_startups(images.pool_startups()),
            ),
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
            teardowns: tokio_util::task::TaskTracker::new(),
            admission: Arc::default(),
            clock,
            died: Mutex::default(),
            ending: Mutex::default(),
            layers,
            volumes,
            volume_lock: tokio::sync::Mutex::default(),
            vm_state_lock: tokio::sync::Mutex::default(),
            reap_at: Mutex::default(),
            reap_wake: Arc::default(),
            reaping: tokio::sync::Mutex::default(),
            images,
            shared,
            events,
        });
        manager.reconcile_volumes().await?;
        let reaper = tokio::spawn(Self::reap_forever(Arc::downgrade(&manager)));
        let filler = tokio::spawn(pool.run_filler());
        manager.tasks.lock().extend([reaper, filler]);
        if let Ok(vm) = &manager.microvm {
            let filler = tokio::spawn(vm.pool.clone().run_filler());
            manager.tasks.lock().push(filler);
        }
        Ok(manager)
    }

    /// Sends lifecycle events to `sink` from now on (and those of the start-up reconciliation).
    pub fn set_event_sink(&self, sink: Arc<dyn crate::EventSink>) {
        self.events.set_sink(sink);
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The bounds requests are checked against (the served OpenAPI document states them).
    pub fn config(&self) -> &SessionConfig {
        &self.cfg
    }

    pub(crate) fn metrics_handle(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Whether the daemon can record sessions (its state store answers).
    pub async fn ready(&self) -> Result<(), Error> {
        self.store.list_tenants().await?;
        Ok(())
    }

    /// The tenant of session `id` if it has not stopped (nor is being stopped here), for
    /// transports that authenticate with a credential of the session itself (E2B's access
    /// token) rather than the tenant's key. A session leaves the running set and enters the
    /// ending one in one step, so between [`Self::owner_of_running`] and this no moment says
    /// a sandbox on its way down is alive.
    pub async fn owner_of_active(&self, id: &str) -> Result<Option<Identity>, Error> {
        if self.ending.lock().contains_key(id) {
            return Ok(None);
        }
        Ok(self
            .store
            .get_session(id)
            .await?
            .filter(|r| r.state != SessionState::Stopped)
            .map(|r| Identity {
                tenant_id: r.tenant_id,
            }))
    }

    /// The tenant of session `id` if its sandbox runs on this daemon and is not paused: the
    /// same answer as [`Self::owner_of_active`] for such a session, from memory. A transport
    /// asks it first on every request (E2B's envd calls), and the store only when this says
    /// nothing (a session paused, on another host, or ended).
    pub fn owner_of_running(&self, id: &str) -> Option<Identity> {
        let live = self.live.lock().get(id).cloned()?;
        let paused = *live.paused.lock();
        (!paused).then(|| Identity {
            tenant_id: live.tenant_id.clone(),
        })
    }

    /// Every session with a sandbox or a pause on this daemon, for transports whose credential
    /// names no session (E2B's signed file URLs are recognised by the token that signed them).
    pub fn live_ids(&self) -> Vec<String> {
        self.live.lock().keys().cloned().collect()
    }

    pub fn pool_depth(&self, language: &str) -> usize {
        self.pool.depth(language, false)
    }

    /// Stops background tasks and destroys every sandbox (sessions end as "daemon shutdown").
    pub async fn shutdown(&self) {
        let tasks: Vec<JoinHandle<()>> = self.tasks.lock().drain(..).collect();
        for t in tasks {
            t.abort();
            // Abort lands at the task's next await; the filler's refills run on tasks of their
            // own, which `drain` below waits for and destroys.
            let _ = t.await;
        }
        let live: Vec<(String, Arc<Live>)> = self
            .live
            .lock()
            .iter()
            .map(|(id, l)| (id.clone(), l.clone()))
            .collect();
        for (id, l) in live {
            if *l.paused.lock() && self.keep_paused(&id, &l.tenant_id).await {
                continue;
            }
            self.end(&id, "daemon shutdown").await;
        }
        // Before the sweep below, which would race them for the same sandboxes.
        self.teardowns.close();
        self.teardowns.wait().await;
        self.pool.drain().await;
        if let Ok(vm) = &self.microvm {
            vm.pool.drain().await;
        }
        // Whatever a crashed start left behind (the runtime cleans up after itself) is only
        // reachable this way.
        let vm = self.microvm.as_ref().ok().map(|e| &e.runtime);
        for runtime in std::iter::once(&self.runtime).chain(vm) {
            if let Err(e) = runtime.reconcile().await {
                tracing::error!(error = %e, "final sweep of sandboxes at shutdown");
            }
        }
        if let Some(v) = &self.volumes {
            if let Err(e) = v.run(|h| h.shutdown()).await {
                tracing::error!(error = %e, "unmounting volumes at shutdown");
            }
        }
    }

    pub async fn list(&self, who: &Identity) -> Result<Vec<Session>, Error> {
        let mut volumes = self.tenant_session_volumes(&who.tenant_id).await?;
        let records = self.store.list_sessions(&who.tenant_id, false).await?;
        Ok(records
            .iter()
            .map(|r| {
                let mut s = view(r);
                if r.state != SessionState::Stopped {
                    s.volumes = volumes.remove(&r.id).unwrap_or_default();
                }
                s
            })
            .collect())
    }

    pub async fn get(&self, who: &Identity, id: &str) -> Result<Session, Error> {
        self.view(&self.record(who, id).await?).await
    }

    /// The session as answers show it, with the volumes it has mounted.
    pub(crate) async fn view(&self, r: &SessionRecord) -> Result<Session, Error> {
        let mut s = view(r);
        if r.state != SessionState::Stopped {
            s.volumes = self.session_volumes(&r.id).await?;
        }
        Ok(s)
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

/// An environment in the agent's order (later entries win).
pub(crate) type Env = Vec<(String, String)>;

/// `base` with every variable of `over` set on top of it (`over`'s value wins).
pub(crate) fn with_env(
    mut base: Vec<(String, String)>,
    over: Vec<(String, String)>,
) -> Vec<(String, String)> {
    for (k, v) in over {
        base.retain(|(ek, _)| *ek != k);
        base.push((k, v));
    }
    base
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

fn view(r: &SessionRecord) -> Session {
    Session {
        id: r.id.clone(),
        tenant_id: r.tenant_id.clone(),
        language: r.language.clone(),
        image: r.image.clone(),
        runtime: r.runtime.clone(),
        state: if r.lost { SessionState::Lost } else { r.state },
        created_at: r.created_at,
        expires_at: r.expires_at,
        limits: r.limits,
        network: r.network.clone(),
        metadata: r.metadata.clone(),
        end_reason: r.end_reason.clone(),
        volumes: Vec::new(),
    }
}
