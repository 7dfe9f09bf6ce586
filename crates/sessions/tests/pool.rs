//! The adaptive warm pool through the manager, against a `MemoryRuntime` whose warm-sandbox
//! starts wait at a gate the test opens (so refills in flight can be counted and held), and the
//! `[sessions] pool` config forms.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use koder_api_types::CreateSession;
use koder_auth::Identity;
use koder_runtime::{Enforcement, ReconcileReport, Runtime, RuntimeError, Sandbox, SandboxSpec};
use koder_runtime_memory::MemoryRuntime;
use koder_sessions::config::PoolSize;
use koder_sessions::{Manager, SessionConfig};
use koder_store::{Store, Tenant};
use tokio::sync::Semaphore;

/// Generous bound for anything the manager does in the background.
const WITHIN: Duration = Duration::from_secs(10);

/// A `MemoryRuntime` whose pool starts (ids `w…`) each wait for a permit; session creates pass.
struct GatedRuntime {
    inner: MemoryRuntime,
    gate: Semaphore,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    started: AtomicUsize,
}

impl GatedRuntime {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryRuntime::new(),
            gate: Semaphore::new(0),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl Runtime for GatedRuntime {
    fn name(&self) -> &'static str {
        "gated-memory"
    }

    fn enforcement(&self) -> &Enforcement {
        self.inner.enforcement()
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Arc<dyn Sandbox>, RuntimeError> {
        if spec.id.starts_with('w') {
            self.started.fetch_add(1, Ordering::SeqCst);
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            let permit = self.gate.acquire().await;
            if let Ok(p) = permit {
                p.forget();
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        self.inner.create(spec).await
    }

    async fn reconcile(&self) -> Result<ReconcileReport, RuntimeError> {
        self.inner.reconcile().await
    }
}

/// A `MemoryRuntime` with room for `max` sandboxes, as the jail's slots bound it.
struct BoundedRuntime {
    inner: MemoryRuntime,
    max: usize,
}

#[async_trait]
impl Runtime for BoundedRuntime {
    fn name(&self) -> &'static str {
        "bounded-memory"
    }

    fn enforcement(&self) -> &Enforcement {
        self.inner.enforcement()
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Arc<dyn Sandbox>, RuntimeError> {
        if self.is_full() {
            return Err(RuntimeError::Exhausted(
                "all sandbox slots are in use".into(),
            ));
        }
        self.inner.create(spec).await
    }

    fn is_full(&self) -> bool {
        self.inner.live().len() >= self.max
    }

    async fn reconcile(&self) -> Result<ReconcileReport, RuntimeError> {
        self.inner.reconcile().await
    }
}

fn who() -> Identity {
    Identity {
        tenant_id: "acme".into(),
    }
}

async fn manager(runtime: Arc<dyn Runtime>, pool: PoolSize) -> Arc<Manager> {
    let store = Store::open_in_memory().await.unwrap();
    store
        .upsert_tenant(&Tenant {
            id: "acme".into(),
            name: "acme".into(),
            plan: "pro".into(),
            max_sessions: None,
            daily_session_minutes: None,
            created_at: Utc::now(),
        })
        .await
        .unwrap();
    let cfg = SessionConfig {
        pool: [("python".to_string(), pool)].into(),
        ..SessionConfig::default()
    };
    Manager::start(store, runtime, cfg).await.unwrap()
}

fn python() -> CreateSession {
    CreateSession {
        language: Some("python".into()),
        ..Default::default()
    }
}

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WITHIN;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The python lane's target (its sandboxes run on the host image).
fn target(m: &Manager) -> i64 {
    m.metrics()
        .pool_target
        .with_label_values(&["python", "host"])
        .get()
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_grows_the_pool_to_max_with_parallel_refills() {
    let rt = GatedRuntime::new();
    let m = manager(rt.clone(), PoolSize { min: 0, max: 6 }).await;
    assert_eq!(target(&m), 0);
    // Eight creates find the empty pool: each is started cold, and each counts as demand.
    for _ in 0..8 {
        m.create(&who(), python()).await.unwrap();
    }
    assert_eq!(target(&m), 6, "the target follows the burst, capped at max");
    let parallel = cores().min(6);
    until("refills start, one per core", || {
        rt.in_flight.load(Ordering::SeqCst) == parallel
    })
    .await;
    assert_eq!(m.pool_depth("python"), 0);
    rt.gate.add_permits(6);
    until("the pool fills to max", || m.pool_depth("python") == 6).await;
    assert_eq!(rt.peak.load(Ordering::SeqCst), parallel);
    assert_eq!(rt.started.load(Ordering::SeqCst), 6, "never more than max");
    // The burst is then served from the pool.
    let before = rt.inner.live().len();
    for _ in 0..6 {
        m.create(&who(), python()).await.unwrap();
    }
    assert_eq!(rt.inner.live().len(), before, "no cold create for these");
    rt.gate.add_permits(64);
    m.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_destroys_ready_and_in_flight_refills() {
    let rt = GatedRuntime::new();
    let m = manager(rt.clone(), PoolSize::fixed(3)).await;
    rt.gate.add_permits(1);
    until("one warm sandbox ready", || m.pool_depth("python") == 1).await;
    until("the other refills in flight", || {
        rt.in_flight.load(Ordering::SeqCst) == cores().min(2)
    })
    .await;
    let session = m.create(&who(), python()).await.unwrap();
    let shutdown = tokio::spawn({
        let m = m.clone();
        async move { m.shutdown().await }
    });
    until("the session ended", || rt.inner.live().is_empty()).await;
    assert!(!shutdown.is_finished(), "drain waits for refills in flight");
    rt.gate.add_permits(8);
    tokio::time::timeout(WITHIN, shutdown)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rt.inner.live(), Vec::<String>::new(), "{session:?}");
    let started = rt.started.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        rt.started.load(Ordering::SeqCst),
        started,
        "no refill after drain"
    );
}

#[derive(serde::Deserialize)]
struct Sessions {
    sessions: SessionConfig,
}

fn parse(pool_line: &str) -> Result<SessionConfig, toml::de::Error> {
    toml::from_str::<Sessions>(&format!("[sessions]\n{pool_line}\n")).map(|c| c.sessions)
}

#[test]
fn a_number_is_a_fixed_pool_and_a_table_a_range() {
    let cfg =
        parse("pool = { python = 2, bash = { min = 1, max = 16 }, node = { max = 4 } }").unwrap();
    assert_eq!(cfg.pool["python"], PoolSize { min: 2, max: 2 });
    assert_eq!(cfg.pool["bash"], PoolSize { min: 1, max: 16 });
    assert_eq!(cfg.pool["node"], PoolSize { min: 0, max: 4 });
    let cfg = parse("microvm_pool = { python = { min = 1 } }").unwrap();
    assert_eq!(cfg.microvm_pool["python"], PoolSize::fixed(1));
}

#[test]
fn bad_pool_configs_are_errors() {
    let below = parse("pool = { python = { min = 4, max = 2 } }").unwrap_err();
    assert!(below.to_string().contains("below its min"), "{below}");
    let unknown = parse("pool = { python = { min = 1, maximum = 2 } }").unwrap_err();
    assert!(unknown.to_string().contains("maximum"), "{unknown}");
    assert!(parse("pool = { python = -1 }").is_err());
    assert!(parse("pool = { python = \"2\" }").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_sandboxes_give_their_slots_to_creates_the_pool_cannot_serve() {
    let rt = Arc::new(BoundedRuntime {
        inner: MemoryRuntime::new(),
        max: 2,
    });
    let m = manager(rt.clone(), PoolSize { min: 2, max: 2 }).await;
    let ready = || {
        m.metrics()
            .pool_ready
            .with_label_values(&["python", "host"])
            .get()
    };
    until("the pool fills the runtime", || ready() == 2).await;
    let bash = || CreateSession {
        language: Some("bash".into()),
        ..Default::default()
    };
    // No lane serves bash: each create starts cold, in a slot a warm sandbox gave up.
    for left in [1, 0] {
        m.create(&who(), bash()).await.unwrap();
        assert_eq!(ready(), left);
        assert_eq!(rt.inner.live().len(), 2);
    }
    // With no warm sandbox left to give, the runtime's refusal stands.
    let refused = m.create(&who(), bash()).await.unwrap_err();
    assert!(
        matches!(refused, koder_sessions::Error::RuntimeUnavailable(_)),
        "{refused:?}"
    );
    // A python create still finds its lane empty and the runtime full: refused, not queued.
    assert!(m.create(&who(), python()).await.is_err());
}
