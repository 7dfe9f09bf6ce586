//! `MemoryRuntime`: a [`Runtime`] whose sandboxes live in memory, for tests of anything built on
//! the runtime traits (the session manager, the HTTP layers) without root, namespaces or VMs.
//!
//! Each sandbox's [`Sandbox::agent`] is a real [`AgentClient`] over a `tokio::io::duplex`, served
//! by a small fake agent speaking the real protocol: `Health`, `Exec` (scripted, see
//! [`Scripted`]), `WriteFile`/`ReadFile`/`List`/`Stat` on an in-memory file map, `DiskUsage`,
//! `KillAll`; anything else is answered `Error(InvalidRequest)`. Tests drive the rest from
//! outside: usage counters ([`MemorySandbox::set_usage`]), agent death
//! ([`MemorySandbox::kill_agent`]) and create failures ([`MemoryRuntime::fail_next_create`]).
//!
//! A crate of its own so `koder-runtime` stays the pure contract and no production build links
//! a fake.

mod agent;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use koder_agent_protocol::AgentClient;
use koder_runtime::{
    validate_id, Enforcement, Limits, ReconcileReport, ResourceControl, Runtime, RuntimeError,
    Sandbox, SandboxSpec, Usage,
};
use parking_lot::Mutex;

pub use agent::{ExecScript, Scripted};

/// In-memory runtime; cheap to clone (clones share their sandboxes).
#[derive(Clone)]
pub struct MemoryRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    enforcement: Enforcement,
    script: ExecScript,
    resources: bool,
    sandboxes: Mutex<HashMap<String, Arc<MemorySandbox>>>,
    create_failures: Mutex<VecDeque<RuntimeError>>,
    leftovers: Mutex<Vec<String>>,
}

impl Default for MemoryRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryRuntime {
    /// Sandboxes with resource control whose execs run [`Scripted::builtin`].
    pub fn new() -> Self {
        Self::build(
            Arc::new(|req| Scripted::builtin(&req.argv, &req.stdin)),
            true,
        )
    }

    /// Execs answered by `script` instead of the builtins.
    pub fn with_script(self, script: ExecScript) -> Self {
        Self::build(script, self.inner.resources)
    }

    /// Sandboxes without [`ResourceControl`] (like a rootless jail): `resources()` is `None`.
    pub fn without_resources(self) -> Self {
        Self::build(self.inner.script.clone(), false)
    }

    fn build(script: ExecScript, resources: bool) -> Self {
        Self {
            inner: Arc::new(Inner {
                enforcement: Enforcement::default(),
                script,
                resources,
                sandboxes: Mutex::default(),
                create_failures: Mutex::default(),
                leftovers: Mutex::default(),
            }),
        }
    }

    /// The next `create` fails with `error` (queued: several calls fail several creates).
    pub fn fail_next_create(&self, error: RuntimeError) {
        self.inner.create_failures.lock().push_back(error);
    }

    /// Ids the next `reconcile` reports as removed, as if a crashed run had left them.
    pub fn leave_over(&self, ids: impl IntoIterator<Item = String>) {
        self.inner.leftovers.lock().extend(ids);
    }

    /// A sandbox this runtime created (destroyed ones included), by id.
    pub fn sandbox(&self, id: &str) -> Option<Arc<MemorySandbox>> {
        self.inner.sandboxes.lock().get(id).cloned()
    }

    /// Ids of the sandboxes not destroyed yet, sorted.
    pub fn live(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .inner
            .sandboxes
            .lock()
            .values()
            .filter(|s| !s.is_destroyed())
            .map(|s| s.spec.id.clone())
            .collect();
        ids.sort();
        ids
    }
}

#[async_trait]
impl Runtime for MemoryRuntime {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn enforcement(&self) -> &Enforcement {
        &self.inner.enforcement
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Arc<dyn Sandbox>, RuntimeError> {
        validate_id(&spec.id)?;
        if let Some(error) = self.inner.create_failures.lock().pop_front() {
            return Err(error);
        }
        let mut sandboxes = self.inner.sandboxes.lock();
        if sandboxes.get(&spec.id).is_some_and(|s| !s.is_destroyed()) {
            return Err(RuntimeError::InvalidSpec(format!(
                "sandbox {} already exists",
                spec.id
            )));
        }
        let (agent, state) = agent::start(self.inner.script.clone(), spec.limits.disk_mib);
        for layer in &spec.layers {
            let raw = std::fs::read(layer)
                .map_err(RuntimeError::io(format!("read layer {}", layer.display())))?;
            agent::apply_layer(&state, &raw).map_err(RuntimeError::Start)?;
        }
        let sandbox = Arc::new(MemorySandbox {
            limits: Mutex::new(spec.limits),
            spec,
            agent,
            state,
            resources: self.inner.resources,
            frozen: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
            teardown_held: tokio::sync::watch::Sender::new(false),
        });
        sandboxes.insert(sandbox.spec.id.clone(), sandbox.clone());
        Ok(sandbox)
    }

    async fn reconcile(&self) -> Result<ReconcileReport, RuntimeError> {
        Ok(ReconcileReport {
            sandboxes_removed: std::mem::take(&mut *self.inner.leftovers.lock()),
            ..Default::default()
        })
    }
}

/// One in-memory sandbox; what a test can see and steer of it.
pub struct MemorySandbox {
    spec: SandboxSpec,
    agent: AgentClient,
    state: Arc<agent::State>,
    resources: bool,
    limits: Mutex<Limits>,
    frozen: AtomicBool,
    destroyed: AtomicBool,
    /// While true, `destroy` waits: a test looks at its session mid-teardown.
    teardown_held: tokio::sync::watch::Sender<bool>,
}

impl MemorySandbox {
    /// The spec it was created with.
    pub fn spec(&self) -> &SandboxSpec {
        &self.spec
    }

    /// Sets the counters `usage()` reports (an OOM kill or a pids-limit hit, say).
    pub fn set_usage(&self, usage: Usage) {
        *self.state.usage.lock() = usage;
    }

    /// The limits last applied (at create, or by `set_limits`).
    pub fn limits(&self) -> Limits {
        *self.limits.lock()
    }

    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// Holds (`true`) or lets go (`false`) this sandbox's teardown: while held, `destroy`
    /// waits with the sandbox still up.
    pub fn hold_teardown(&self, held: bool) {
        self.teardown_held.send_replace(held);
    }

    pub fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::SeqCst)
    }

    /// The agent dies: its connection closes, as when a sandbox's PID 1 is killed.
    pub fn kill_agent(&self) {
        self.state.dead.cancel();
    }

    /// A file's contents in the sandbox, if it is a file.
    pub fn file(&self, path: &str) -> Option<Vec<u8>> {
        self.state.file(path)
    }

    /// Puts a file into the sandbox (parents created), as if sandbox code had written it.
    pub fn put_file(&self, path: &str, data: &[u8]) {
        self.state.put_file(path, data)
    }

    fn alive(&self) -> Result<(), RuntimeError> {
        if self.is_destroyed() {
            Err(RuntimeError::Unavailable(format!(
                "sandbox {} was destroyed",
                self.spec.id
            )))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl Sandbox for MemorySandbox {
    fn id(&self) -> &str {
        &self.spec.id
    }

    fn agent(&self) -> &AgentClient {
        &self.agent
    }

    async fn destroy(&self) -> Result<(), RuntimeError> {
        let _ = self.teardown_held.subscribe().wait_for(|held| !held).await;
        self.destroyed.store(true, Ordering::SeqCst);
        self.kill_agent();
        Ok(())
    }

    fn resources(&self) -> Option<&dyn ResourceControl> {
        self.resources.then_some(self as &dyn ResourceControl)
    }
}

#[async_trait]
impl ResourceControl for MemorySandbox {
    async fn usage(&self) -> Result<Usage, RuntimeError> {
        self.alive()?;
        Ok(*self.state.usage.lock())
    }

    async fn set_limits(&self, limits: &Limits) -> Result<(), RuntimeError> {
        self.alive()?;
        *self.limits.lock() = *limits;
        Ok(())
    }

    async fn reset_memory_peak(&self) -> Result<(), RuntimeError> {
        self.alive()?;
        let mut usage = self.state.usage.lock();
        usage.memory_peak_bytes = usage.memory_current_bytes;
        Ok(())
    }

    async fn freeze(&self) -> Result<(), RuntimeError> {
        self.alive()?;
        self.frozen.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn thaw(&self) -> Result<(), RuntimeError> {
        self.alive()?;
        self.frozen.store(false, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
